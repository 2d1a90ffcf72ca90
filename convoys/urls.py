from django.contrib.auth import views as auth_views
from django.urls import path

from . import views
from .api import api

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("convoys/<str:convoy_id>/", views.convoy_detail, name="convoy"),
    path("convoys/<str:convoy_id>/<str:action>/", views.convoy_action, name="convoy-action"),
    path("stage/", views.stage, name="stage"),
    path("stranded/", views.stranded, name="stranded"),
    path("beads/<str:bead_id>/", views.bead_detail, name="bead"),
    path("beads/<str:bead_id>/<str:action>/", views.bead_action, name="bead-action"),
    path("inbox/", views.inbox, name="inbox"),
    path("subscriptions/", views.subscriptions, name="subscriptions"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/", api.urls),
]
