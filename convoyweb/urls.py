from typing import Any

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView


class Favicon(RedirectView):
    """Browsers ask for /favicon.ico on pages that name no icon (the admin's)."""

    def get_redirect_url(self, *args: Any, **kwargs: Any) -> str:
        return static("convoys/favicon.svg")


admin.autodiscover()  # SimpleAdminConfig (convoyweb/settings.py): registered here, once

urlpatterns = [
    path("favicon.ico", Favicon.as_view()),
    path("admin/", admin.site.urls),
    path("", include("convoys.urls")),
]

handler403 = "convoys.web.access.forbidden"
