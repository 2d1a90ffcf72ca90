"""The one readiness rule, as a queryset and as a predicate.

A bead is ready when: it is open and unassigned, or its worker is dead (then open, hooked or
in_progress count too; a worker is dead when its last heartbeat, or with no heartbeat ever the
bead's last update, is CONVOY_WORKER_TIMEOUT seconds old, so imported work whose assignee never
reports is rescued); it is slingable; no blocking dependency points at an existing target
that is not done (merge-blocks needs the target merged: `merging.merged_q`); it has a rig; and
that rig is active. Order: (priority, id). Launch, the feeders, the stranded scan, the
dashboard counts and the CLI all call this module.
"""

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from convoys.core.history import target_blocks
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    BLOCKING_DEP_TYPES,
    DONE_STATUSES,
    SLINGABLE_TYPES,
    Bead,
    Dependency,
    Rig,
    Worker,
)
from convoys.rules import merging


def dead_worker_cutoff(now: datetime | None = None) -> datetime:
    return (now or timezone.now()) - timedelta(seconds=settings.CONVOY_WORKER_TIMEOUT)


def worker_dead(now: datetime | None = None) -> Q:
    """A Q on beads: the assignee's last heartbeat is older than the timeout, or the assignee
    never sent one and the bead has not been updated for that long. The claim uses it too."""
    cutoff = dead_worker_cutoff(now)
    known = Worker.objects.filter(name=OuterRef("assignee"))
    return Exists(known.filter(last_seen__lt=cutoff)) | (~Exists(known) & Q(updated_at__lt=cutoff))


def blocked_condition() -> Q:
    """The bead (OuterRef('pk')) has a blocking dependency whose target exists and is not
    done."""
    plain = Dependency.objects.filter(
        issue=OuterRef("pk"),
        type__in=[t for t in BLOCKING_DEP_TYPES if t != "merge-blocks"],
    ).filter(
        Exists(Bead.objects.filter(pk=OuterRef("depends_on_id")).exclude(status__in=DONE_STATUSES))
    )
    merge = Dependency.objects.filter(issue=OuterRef("pk"), type="merge-blocks").filter(
        Exists(
            Bead.objects.filter(pk=OuterRef("depends_on_id")).filter(
                ~Q(status__in=DONE_STATUSES) | (Q(status="closed") & ~merging.merged_q())
            )
        )
    )
    return Exists(plain) | Exists(merge)


def ready_q(now: datetime | None = None, *, blockers: bool = True) -> Q:
    """The rule as a Q; `blockers=False` leaves out the blocker clause (sling --force)."""
    claimable = Q(status="open", assignee="") | (
        Q(status__in=("open", *ACTIVE_WORK_STATUSES)) & ~Q(assignee="") & worker_dead(now)
    )
    rule = (
        claimable
        & Q(issue_type__in=SLINGABLE_TYPES)
        & Q(rig__isnull=False)
        & Q(rig__state=Rig.ACTIVE)
    )
    return rule & ~blocked_condition() if blockers else rule


def ready_beads(
    queryset: QuerySet[Bead] | None = None,
    now: datetime | None = None,
    *,
    blockers: bool = True,
) -> QuerySet[Bead]:
    """The ready beads of `queryset` (default: all beads), ordered by (priority, id)."""
    queryset = Bead.objects.all() if queryset is None else queryset
    return queryset.filter(ready_q(now, blockers=blockers)).order_by("priority", "id")


def ready_among(bead_ids: Sequence[str], now: datetime | None = None) -> set[str]:
    """Those of `bead_ids` that are ready: `ready_beads`' rule."""
    if not bead_ids:
        return set()
    found = ready_beads(Bead.objects.filter(pk__in=list(bead_ids)), now or timezone.now())
    return set(found.values_list("pk", flat=True))


def dead_among(bead_ids: Sequence[str], now: datetime | None = None) -> set[str]:
    """Those of `bead_ids` (assigned beads) whose worker is dead: `worker_dead`'s rule."""
    if not bead_ids:
        return set()
    found = Bead.objects.filter(pk__in=list(bead_ids)).filter(worker_dead(now or timezone.now()))
    return set(found.values_list("pk", flat=True))


def is_ready(bead: Bead, now: datetime | None = None) -> bool:
    """The same rule for one bead (one query)."""
    return ready_beads(Bead.objects.filter(pk=bead.pk), now).exists()


def blocked_by(bead_ids: Iterable[str] | QuerySet[Bead, str]) -> dict[str, list[str]]:
    """{bead_id: [unfinished blocker ids]} for the given beads (a list or a subquery of ids;
    two queries)."""
    blocking = Dependency.objects.filter(issue_id__in=bead_ids, type__in=BLOCKING_DEP_TYPES)
    # In target order: pages list them, and a live fragment must read as a reload does.
    deps = list(
        blocking.order_by("issue_id", "depends_on_id").values_list(
            "issue_id", "depends_on_id", "type"
        )
    )
    targets = {
        row[0]: row[1:]
        for row in Bead.objects.filter(pk__in=blocking.values("depends_on_id")).values_list(
            "id", "status", "close_reason"
        )
    }
    merge_targets = {target for _, target, dep_type in deps if dep_type == "merge-blocks"}
    merged = merging.merged_among(merge_targets & targets.keys())
    result: dict[str, list[str]] = {}
    for issue_id, target, dep_type in deps:
        if target not in targets:
            continue
        status, reason = targets[target]
        if target_blocks(dep_type, status, reason, target in merged):
            result.setdefault(issue_id, []).append(target)
    return result
