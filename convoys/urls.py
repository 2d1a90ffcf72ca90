from django.contrib.auth import views as auth_views
from django.urls import path, re_path, register_converter

from convoys.api import api, api_not_found
from convoys.core.ids import from_url_segment, to_url_segment
from convoys.web import (
    action_views,
    bead_views,
    control_views,
    convoy_views,
    dashboard_views,
    edit_views,
    forge_hooks,
    history_views,
    inbox_views,
    ops_views,
    saved_views,
    search_views,
    stage_views,
)


class IdConverter:
    """A bead or convoy id as one path segment, any id a row may hold (convoys/core/ids.py)."""

    regex = "[^/]+"

    def to_python(self, value: str) -> str:
        if "\x00" in value:  # no row holds one; PostgreSQL would refuse the lookup
            raise ValueError("NUL in an id")
        return from_url_segment(value)

    def to_url(self, value: str) -> str:
        return to_url_segment(value)


register_converter(IdConverter, "id")


urlpatterns = [
    path("", dashboard_views.dashboard, name="dashboard"),
    path("healthz", ops_views.healthz, name="healthz"),
    path("readyz", ops_views.readyz, name="readyz"),
    path("metrics", ops_views.metrics_view, name="metrics"),
    path("hooks/github", forge_hooks.github, name="hook-github"),
    path("hooks/gitlab", forge_hooks.gitlab, name="hook-gitlab"),
    path("hooks/gitea", forge_hooks.gitea, name="hook-gitea"),
    path("actions/convoys/", control_views.convoy_actions, name="convoy-actions"),
    path("convoys/<id:convoy_id>/", convoy_views.convoy_detail, name="convoy"),
    path("convoys/<id:convoy_id>/pause/", control_views.pause, name="convoy-pause"),
    path("convoys/<id:convoy_id>/resume/", control_views.resume, name="convoy-resume"),
    path("convoys/<id:convoy_id>/ack/", control_views.acknowledge, name="convoy-ack"),
    path("convoys/<id:convoy_id>/history/", history_views.step, name="convoy-history"),
    path("convoys/<id:convoy_id>/visit/", history_views.visit, name="convoy-visit"),
    path("convoys/<id:convoy_id>/<str:action>/", convoy_views.convoy_action, name="convoy-action"),
    path("stage/", stage_views.stage, name="stage"),
    path("create/", edit_views.create, name="create-bead"),
    path(
        "beads/<id:bead_id>/dependencies/add/",
        edit_views.add_dependency,
        name="bead-dependency-add",
    ),
    path("convoys/<id:convoy_id>/staging/recheck/", edit_views.recheck, name="convoy-recheck"),
    path("rigs/<id:name>/restore/", edit_views.restore_rig, name="rig-restore"),
    path("stranded/", dashboard_views.stranded, name="stranded"),
    path("beads/actions/", action_views.bead_actions, name="bead-actions"),
    path("views/save/", saved_views.save_view, name="view-save"),
    path("views/<int:view_id>/", saved_views.open_view, name="view"),
    path("views/<int:view_id>/<str:action>/", saved_views.change_view, name="view-action"),
    path("search/", search_views.search_page, name="search"),
    path("beads/<id:bead_id>/", bead_views.bead_detail, name="bead"),
    path("beads/<id:bead_id>/retry/", control_views.retry, name="bead-retry"),
    path("beads/<id:bead_id>/<str:action>/", bead_views.bead_action, name="bead-action"),
    path("inbox/", inbox_views.inbox, name="inbox"),
    path("subscriptions/", inbox_views.subscriptions, name="subscriptions"),
    path("subscriptions/hooks/", inbox_views.hook_add, name="hook-add"),
    path(
        "subscriptions/hooks/<int:target_id>/<str:action>/",
        inbox_views.hook_action,
        name="hook-action",
    ),
    path(
        "subscriptions/deliveries/<int:delivery_id>/redeliver/",
        inbox_views.redeliver,
        name="hook-redeliver",
    ),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/", api.urls),
    re_path(r"^api/", api_not_found),  # an unknown API path answers JSON, as the API does
]
