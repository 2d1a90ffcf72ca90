"""Rigs and routes: prefix -> rig resolution and rig state changes."""

from django.db import transaction

from ..events import record
from ..ids import rig_name_from_path, rig_name_problem, route_prefix_problem
from ..models import Bead, Rig, Route, bead_prefix
from .errors import NotFound, ServiceError


def route_map():
    """{prefix: rig name or None (town level)}: one query, cached by the caller."""
    return dict(Route.objects.values_list("prefix", "rig_id"))


def rig_for(bead_id, routes=None):
    routes = route_map() if routes is None else routes
    return routes.get(bead_prefix(bead_id))


@transaction.atomic
def upsert_route(prefix, path):
    """Create or update a route; its rig is created when new. Re-resolves the prefix's beads."""
    problem = route_prefix_problem(prefix)
    if problem:
        raise ServiceError(f"route prefix {prefix!r} {problem}")
    rig_name = rig_name_from_path(path)
    problem = rig_name and rig_name_problem(rig_name)
    if problem:
        raise ServiceError(f"route path {path!r}: rig name {rig_name!r} {problem}")
    if rig_name:
        Rig.objects.get_or_create(name=rig_name)
    Route.objects.update_or_create(prefix=prefix, defaults={"path": path, "rig_id": rig_name})
    Bead.objects.filter(id__startswith=prefix).exclude(rig_id=rig_name).update(rig_id=rig_name)
    return rig_name


@transaction.atomic
def set_rig_state(name, state, actor=""):
    if state not in (Rig.ACTIVE, Rig.PARKED, Rig.DOCKED):
        raise ServiceError(f'unknown rig state "{state}"')
    updated = Rig.objects.filter(name=name).exclude(state=state).update(state=state)
    if not Rig.objects.filter(name=name).exists():
        raise NotFound(f"rig '{name}' not found")
    if updated:
        record("rig.state", actor=actor, data={"rig": name, "state": state})
    return Rig.objects.get(name=name)
