"""The town's rigs and routes (saved through the rig service) and its read-only records: events,
dispatches, workers.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from convoys.admin.base import ReadOnlyAdmin, ServiceAdmin, ServiceForm, actor_of
from convoys.models import (
    Dispatch,
    Event,
    Rig,
    Route,
    Worker,
)
from convoys.services import rigs as rig_service


class RigAdminForm(ServiceForm):
    class Meta:
        model = Rig
        fields = ("name", "state")


@admin.register(Rig)
class RigAdmin(ServiceAdmin):
    form = RigAdminForm
    list_display = ("name", "state")
    list_filter = ("state",)

    def get_readonly_fields(self, request: HttpRequest, obj: Rig | None = None) -> tuple[str, ...]:
        return ("name",) if obj else ()

    def save_model(self, request: HttpRequest, obj: Rig, form: RigAdminForm, change: bool) -> None:
        if not change:
            rig_service.create_rig(obj.name, obj.state, actor=actor_of(request))
        elif "state" in form.changed_data:
            rig_service.set_rig_state(obj.name, obj.state, actor=actor_of(request))


class RouteAdminForm(ServiceForm):
    class Meta:
        model = Route
        fields = ("prefix", "path")


@admin.register(Route)
class RouteAdmin(ServiceAdmin):
    form = RouteAdminForm
    list_display = ("prefix", "path", "rig")
    fields = ("prefix", "path", "rig")
    readonly_fields = ("rig",)

    def get_readonly_fields(
        self, request: HttpRequest, obj: Route | None = None
    ) -> tuple[str, ...]:
        return ("prefix", "rig") if obj else ("rig",)

    def save_model(
        self, request: HttpRequest, obj: Route, form: RouteAdminForm, change: bool
    ) -> None:
        obj.rig_id = rig_service.upsert_route(obj.prefix, obj.path, actor=actor_of(request))


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("seq", "kind", "bead_id", "convoy_id", "actor", "created_at")
    list_filter = ("kind",)
    search_fields = ("bead_id", "convoy_id")


@admin.register(Dispatch)
class DispatchAdmin(ReadOnlyAdmin):
    list_display = (
        "bead_id",
        "convoy_id",
        "worker",
        "path",
        "ok",
        "error",
        "duration_ms",
        "created_at",
    )
    list_filter = ("path", "ok")
    search_fields = ("bead_id", "convoy_id", "worker")


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ("name", "rig", "last_seen")
