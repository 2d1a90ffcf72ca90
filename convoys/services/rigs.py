"""Rigs and routes: prefix -> rig resolution and rig state changes."""

from collections.abc import Mapping

from django.db import transaction

from convoys.core.ids import (
    rig_name_from_path,
    rig_name_problem,
    route_path_problem,
    route_prefix_problem,
)
from convoys.log.events import record, record_many
from convoys.models import Bead, Rig, Route, bead_prefix
from convoys.services.errors import NotFound, ServiceError
from convoys.services.staging import recheck_rig


def route_map() -> dict[str, str | None]:
    """{prefix: rig name or None (town level)}: one query, cached by the caller."""
    return dict(Route.objects.values_list("prefix", "rig_id"))


def rig_for(bead_id: str, routes: Mapping[str, str | None] | None = None) -> str | None:
    routes = route_map() if routes is None else routes
    return routes.get(bead_prefix(bead_id))


@transaction.atomic
def upsert_route(prefix: str, path: str, actor: str = "") -> str | None:
    """Create or update a route; its rig is created when new. The prefix's beads whose rig
    changes are re-routed, each with a bead.updated event; nothing is written when unchanged."""
    problem = route_prefix_problem(prefix)
    if problem:
        raise ServiceError(f"route prefix {prefix!r} {problem}")
    problem = route_path_problem(path)
    if problem:
        raise ServiceError(f"route path {ascii(path)[:80]} {problem}")
    rig_name = rig_name_from_path(path)
    if rig_name and not Rig.objects.filter(name=rig_name).exists():
        create_rig(rig_name, actor=actor)
    route, created = Route.objects.get_or_create(
        prefix=prefix, defaults={"path": path, "rig_id": rig_name}
    )
    if created or (route.path, route.rig_id) != (path, rig_name):
        old = None if created else {"path": route.path, "rig": route.rig_id}
        Route.objects.filter(prefix=prefix).update(path=path, rig_id=rig_name)
        record(
            "route.changed",
            actor=actor,
            data={"prefix": prefix, "path": path, "rig": rig_name, "old": old},
        )
    elsewhere = Bead.objects.filter(id__startswith=prefix).exclude(rig_id=rig_name)
    moved = list(elsewhere.values("id", "rig_id", "status", "assignee", "title", "priority"))
    if moved:
        elsewhere.update(rig_id=rig_name)
        record_many(
            [
                {
                    "kind": "bead.updated",
                    "bead_id": b["id"],
                    "actor": actor,
                    "data": {
                        "status": b["status"],
                        "assignee": b["assignee"],
                        "title": b["title"],
                        "priority": b["priority"],
                        "rig": rig_name,
                        "changes": {"rig": [b["rig_id"], rig_name]},
                    },
                }
                for b in moved
            ],
            instances=False,
        )
    return rig_name


@transaction.atomic
def create_rig(name: str, state: str = Rig.ACTIVE, actor: str = "") -> Rig:
    """A new rig (routes create theirs; admins may add one ahead of its route)."""
    problem = rig_name_problem(name)
    if problem:
        raise ServiceError(f"rig name {name!r} {problem}")
    if state not in (Rig.ACTIVE, Rig.PARKED, Rig.DOCKED):
        raise ServiceError(f'unknown rig state "{state}"')
    if Rig.objects.filter(name=name).exists():
        raise ServiceError(f"rig '{name}' already exists")
    rig = Rig.objects.create(name=name, state=state)
    record("rig.created", actor=actor, data={"rig": name, "state": state})
    return rig


@transaction.atomic
def set_rig_state(name: str, state: str, actor: str = "") -> Rig:
    if state not in (Rig.ACTIVE, Rig.PARKED, Rig.DOCKED):
        raise ServiceError(f'unknown rig state "{state}"')
    updated = Rig.objects.filter(name=name).exclude(state=state).update(state=state)
    if not Rig.objects.filter(name=name).exists():
        raise NotFound(f"rig '{name}' not found")
    if updated:
        record("rig.state", actor=actor, data={"rig": name, "state": state})
        recheck_rig(name, actor=actor)  # staged convoys waiting on the rig are re-checked
    return Rig.objects.get(name=name)
