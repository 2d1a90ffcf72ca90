"""Bead writes: create, update, close, reopen, dependencies, worker heartbeats.

Each function changes rows and appends its event in one transaction.
"""

import secrets
import string
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from convoys.core import ids
from convoys.core.ids import unwrap_external
from convoys.log import queue
from convoys.log.events import CLOSED, record, record_many
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    BLOCKING_DEP_TYPES,
    DONE_STATUSES,
    SETTABLE_STATUSES,
    Bead,
    BeadFacts,
    Dependency,
    SourcedRecord,
    Worker,
)
from convoys.rules.readiness import blocked_by
from convoys.services import discovered, dispatch
from convoys.services.errors import NotFound, OpenBlockers, ServiceError
from convoys.services.rigs import rig_for

BASE36 = string.digits + string.ascii_lowercase
UPDATABLE = (
    "title",
    "description",
    "status",
    "assignee",
    "priority",
    "issue_type",
    "labels",
    "owner",
    "close_reason",
)


def get_bead(bead_id: str, lock: bool = False) -> Bead:
    queryset = Bead.objects.select_for_update() if lock else Bead.objects
    try:
        return queryset.get(pk=bead_id)
    except Bead.DoesNotExist:
        raise NotFound(f"bead '{bead_id}' not found")


def _event_data(bead: Bead, **more: Any) -> dict[str, Any]:
    return {
        "status": bead.status,
        "assignee": bead.assignee,
        "title": bead.title,
        "priority": bead.priority,
        "rig": bead.rig_id,
        **more,
    }


def refuse(problem: str | None, what: str) -> None:
    """Raise the one-line refusal for a value an ids.*_problem check found wrong."""
    if problem:
        raise ServiceError(f"{what} {problem}")


def check_bead_id(bead_id: str, what: str = "bead id") -> None:
    refuse(ids.id_problem(bead_id), f"{what} {ascii(bead_id)[:80]}")


def refuse_sourced(bead_id: str) -> None:
    """A bead a sync source still has is the source's (`beads sync`): refuse changing it here,
    naming the source. Dispatch claims are written by the dispatch service, not through here."""
    present = SourcedRecord.objects.filter(pk=bead_id, missing_since__isnull=True)
    source = present.values_list("source", flat=True).first()
    if source is not None:
        raise ServiceError(f"bead '{bead_id}' comes from {source}: change it in bd")


def check_assignee(assignee: str, what: str = "assignee") -> None:
    refuse(ids.name_problem(assignee), what)


def new_bead_id(prefix: str) -> str:
    refuse(ids.route_prefix_problem(prefix), "id prefix")
    for _ in range(20):
        candidate = prefix + "".join(secrets.choice(BASE36) for _ in range(5))
        if not Bead.objects.filter(pk=candidate).exists():
            return candidate
    raise ServiceError(f"could not find a free id with prefix {prefix!r}")


@transaction.atomic
def create_bead(
    title: str,
    *,
    bead_id: str | None = None,
    prefix: str = "bd-",
    description: str = "",
    issue_type: str = "task",
    priority: int = 2,
    status: str = "open",
    assignee: str = "",
    labels: Iterable[str] = (),
    created_by: str = "",
    actor: str = "",
) -> Bead:
    title = (title or "").strip()
    if not title:
        raise ServiceError("title must not be empty")
    if not isinstance(priority, int) or not 0 <= priority <= 4:
        raise ServiceError(f"priority must be 0..4, got {priority!r}")
    if bead_id:
        check_bead_id(bead_id)
    else:
        bead_id = new_bead_id(prefix)
    check_assignee(assignee)
    if Bead.objects.filter(pk=bead_id).exists():
        raise ServiceError(f"bead '{bead_id}' already exists")
    now = timezone.now()
    bead = Bead.objects.create(
        id=bead_id,
        title=title,
        description=description,
        issue_type=issue_type,
        priority=priority,
        status=status,
        assignee=assignee,
        labels=list(labels),
        created_by=created_by or actor,
        created_at=now,
        updated_at=now,
        closed_at=now if status == "closed" else None,
        rig_id=rig_for(bead_id),
    )
    record("bead.created", bead_id=bead.id, actor=actor, data=_event_data(bead))
    return bead


def _status_event_kind(old: str, new: str) -> str:
    if new == "closed" and old != "closed":
        return CLOSED
    if old in DONE_STATUSES and new not in DONE_STATUSES:
        return "bead.reopened"
    return "bead.status"


@transaction.atomic
def update_bead(
    bead_id: str,
    *,
    actor: str = "",
    reason: str | None = None,
    force: bool = False,
    **fields: Any,
) -> Bead:
    """Change fields of a bead; status changes become close/reopen/status events. A close
    of a bead whose blockers are not done is refused (`OpenBlockers`) unless `force`."""
    unknown = set(fields) - set(UPDATABLE)
    if unknown:
        raise ServiceError(f"cannot update field(s): {', '.join(sorted(unknown))}")
    bead = get_bead(bead_id, lock=True)
    refuse_sourced(bead.id)
    if "priority" in fields and not (
        isinstance(fields["priority"], int) and 0 <= fields["priority"] <= 4
    ):
        raise ServiceError(f"priority must be 0..4, got {fields['priority']!r}")
    status = fields.get("status")
    if status is not None and status != bead.status and status not in SETTABLE_STATUSES:
        raise ServiceError(
            f"status must be one of {', '.join(SETTABLE_STATUSES)}, got {str(status)[:40]!r}"
        )
    if "title" in fields and not (fields["title"] or "").strip():
        raise ServiceError("title must not be empty")
    if fields.get("assignee") is not None:
        check_assignee(fields["assignee"])
    old_status = bead.status
    changes: dict[str, list[Any]] = {}
    for name, value in fields.items():
        if value is not None and getattr(bead, name) != value:
            changes[name] = [getattr(bead, name), value]
            setattr(bead, name, value)
    if reason is not None and bead.status == "closed":
        bead.close_reason = reason
    if not changes and reason is None:
        return bead
    if bead.status in ACTIVE_WORK_STATUSES and not bead.assignee.strip():
        # Work under way is someone's: a worker's heartbeat for it, a rescue when it goes
        # silent. Without one nothing could ever move it.
        raise ServiceError(
            f"status {bead.status} needs an assignee (the worker doing it): "
            "set one, or leave the bead open for the feeder"
        )
    if bead.status == "closed" and old_status not in DONE_STATUSES and not force:
        blockers = blocked_by([bead.id]).get(bead.id, [])
        if blockers:
            raise OpenBlockers(bead.id, blockers)
    now = timezone.now()
    bead.updated_at = now
    if bead.status == "closed" and old_status != "closed":
        bead.closed_at = now
    elif bead.status != "closed":
        bead.closed_at = None
        if old_status in DONE_STATUSES:
            bead.close_reason = ""
    bead.save()
    if "status" in changes:
        kind = _status_event_kind(old_status, bead.status)
        event = record(
            kind,
            bead_id=bead.id,
            actor=actor,
            data=_event_data(bead, old_status=old_status, close_reason=bead.close_reason),
        )
        if kind == CLOSED:  # the cluster feeds what the close unblocked
            queue.handle_closes_on_commit([event.seq])
        rest = {k: v for k, v in changes.items() if k != "status"}
        if rest:
            record(
                "bead.updated",
                bead_id=bead.id,
                actor=actor,
                data=_event_data(bead, changes=_jsonable(rest)),
            )
    else:
        record(
            "bead.updated",
            bead_id=bead.id,
            actor=actor,
            data=_event_data(bead, changes=_jsonable(changes)),
        )
    return bead


def _jsonable(changes: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    return {
        k: [str(v) if not isinstance(v, (int, str, list, type(None))) else v for v in pair]
        for k, pair in changes.items()
    }


def close_bead(bead_id: str, reason: str = "", actor: str = "", force: bool = False) -> Bead:
    """Close a bead; refused (`OpenBlockers`) while its blockers are not done, unless `force`."""
    bead = get_bead(bead_id)
    if bead.status == "closed":
        raise ServiceError(f"bead '{bead_id}' is already closed")
    return update_bead(
        bead_id, status="closed", reason=reason or "Closed", actor=actor, force=force
    )


def reopen_bead(bead_id: str, actor: str = "") -> Bead:
    bead = get_bead(bead_id)
    if bead.status not in DONE_STATUSES:
        raise ServiceError(f"bead '{bead_id}' is not closed (status: {bead.status})")
    # The worker that closed it is gone: reopened work waits to be dispatched again.
    return update_bead(bead_id, status="open", assignee="", actor=actor)


@transaction.atomic
def add_dependency(
    issue_id: str, target: str, dep_type: str = "blocks", actor: str = ""
) -> Dependency:
    bead = get_bead(issue_id, lock=True)
    refuse_sourced(bead.id)
    dep_type = (dep_type or "blocks").strip()
    if not dep_type or len(dep_type) > 50:
        raise ServiceError("dependency type must be 1..50 characters")
    refuse(ids.target_problem(target), "dependency target")
    resolved = unwrap_external(target.strip())
    if resolved == bead.id and dep_type in BLOCKING_DEP_TYPES:
        raise ServiceError(f"bead '{bead.id}' cannot block itself")
    if Dependency.objects.filter(issue=bead, depends_on_id=resolved).exists():
        raise ServiceError(f"'{bead.id}' already depends on '{resolved}'")
    if dep_type in BLOCKING_DEP_TYPES:
        loop = blocking_path(resolved, bead.id)
        if loop:
            raise ServiceError(
                f"'{bead.id}' cannot depend on '{resolved}': that would make a cycle "
                + " → ".join([bead.id, *loop])
            )
    dep = Dependency.objects.create(
        issue=bead,
        depends_on_id=resolved,
        raw_target=target if target != resolved else "",
        type=dep_type,
        created_at=timezone.now(),
        created_by=actor,
    )
    record(
        "bead.updated",
        bead_id=bead.id,
        actor=actor,
        data=_event_data(bead, dependency_added={"target": resolved, "type": dep_type}),
    )
    if dep_type == discovered.DISCOVERED_FROM:
        discovered.join([(bead.id, resolved)], actor=actor)
    return dep


def blocking_path(start: str, goal: str, limit: int = 100_000) -> list[str]:
    """The ids from `start` to `goal` along blocking dependencies (each bead to what it
    depends on), shortest first; [] when `goal` cannot be reached. One query per step."""
    came_from: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier and len(came_from) < limit:
        edges = Dependency.objects.filter(
            issue_id__in=frontier, type__in=BLOCKING_DEP_TYPES
        ).values_list("issue_id", "depends_on_id")
        frontier = []
        for issue, target in edges:
            if target in came_from:
                continue
            came_from[target] = issue
            if target == goal:
                path = [target]
                while (previous := came_from[path[-1]]) is not None:
                    path.append(previous)
                return path[::-1]
            frontier.append(target)
    return []


@transaction.atomic
def remove_dependency(issue_id: str, target: str, actor: str = "") -> None:
    bead = get_bead(issue_id, lock=True)
    refuse_sourced(bead.id)
    deleted, _ = Dependency.objects.filter(
        issue=bead, depends_on_id=unwrap_external(target)
    ).delete()
    if not deleted:
        raise NotFound(f"'{issue_id}' has no dependency on '{target}'")
    record(
        "bead.updated",
        bead_id=bead.id,
        actor=actor,
        data=_event_data(bead, dependency_removed={"target": target}),
    )


class Heartbeat(NamedTuple):
    at: datetime
    confirmed: list[str]  # beads whose dispatch with no outcome recorded it confirmed


def heartbeat(worker_name: str) -> Heartbeat:
    """A worker reports it is alive. No event, but when it had been silent past the timeout:
    then each bead it holds records `worker.back` (it is no longer ready for a rescue); and
    its dispatches with no outcome recorded are confirmed (`dispatch.confirmed`). The
    time its beads' worker counts as dead moves on with it (the read model's `dead_at`)."""
    worker_name = (worker_name or "").strip()
    if not worker_name:
        raise ServiceError("worker name must not be empty")
    check_assignee(worker_name, "worker name")
    now = timezone.now()
    rig = worker_name.split("/")[0] if "/" in worker_name else ""
    with transaction.atomic():
        Worker.objects.update_or_create(name=worker_name, defaults={"last_seen": now, "rig": rig})
        # Attempts before facts: the order `dispatch.recover` locks them in, so the two
        # never wait on each other (PostgreSQL found that deadlock).
        confirmed = dispatch.confirm(worker_name)  # a dispatch with no answer recorded ran
        held = Bead.objects.filter(assignee=worker_name, status__in=("open", *ACTIVE_WORK_STATUSES))
        facts = BeadFacts.objects.filter(bead_id__in=held.values("pk"))
        back = list(facts.filter(worker_dead=True).values_list("bead_id", flat=True))
        facts.update(dead_at=now + timedelta(seconds=settings.CONVOY_WORKER_TIMEOUT))
        if back:
            record_many(
                [
                    {"kind": "worker.back", "bead_id": i, "data": {"worker": worker_name}}
                    for i in back
                ]
            )
    return Heartbeat(now, sorted(set(confirmed)))
