"""Read-side queries shared by pages, API and CLI; each runs a fixed number of queries."""

from collections import namedtuple
from datetime import timedelta

from django.db.models import Max
from django.utils import timezone

from .models import (
    ACTIVE_WORK_STATUSES,
    CONVOY_OPEN,
    DONE_STATUSES,
    Bead,
    Convoy,
    Dependency,
    Event,
    TrackedBead,
    Worker,
)
from .readiness import ready_beads

SEGMENTS = ("done", "active", "ready", "blocked", "unknown")


def segment_of(bead, ready_ids):
    if bead is None:
        return "unknown"
    return segment_for(bead.pk, bead.status, ready_ids)


def segment_for(bead_id, status, ready_ids):
    if status is None:
        return "unknown"
    if status in DONE_STATUSES:
        return "done"
    if bead_id in ready_ids:
        return "ready"
    if status in ACTIVE_WORK_STATUSES:
        return "active"
    return "blocked"


# What a convoy's page and API show of each tracked bead: a light row, not a model instance.
TrackedRow = namedtuple(
    "TrackedRow", "pk title issue_type status rig_id assignee closed_at updated_at"
)


def tracked_beads(convoy):
    """(tracked ids in position order, {id: TrackedRow}, dependencies of the tracked beads as
    (issue, target, type)): three queries, each bead read once."""
    tracking = TrackedBead.objects.filter(convoy=convoy)
    ids = list(tracking.values_list("bead_id", flat=True))
    subquery = tracking.values("bead_id")
    rows = Bead.objects.filter(pk__in=subquery).values_list(*TrackedRow._fields)
    beads = {row[0]: TrackedRow._make(row) for row in rows}
    edges = Dependency.objects.filter(issue_id__in=subquery).values_list(
        "issue_id", "depends_on_id", "type"
    )
    return ids, beads, list(edges)


def convoy_summary(convoy, tracked, beads, now=None):
    """One convoy's summary and its ready bead ids from beads already read by
    `tracked_beads` (one query for the ready rule, one for spin)."""
    now = now or timezone.now()
    tracking = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    ready_ids = set(
        ready_beads(Bead.objects.filter(pk__in=tracking), now).values_list("pk", flat=True)
    )
    summary = summarise(
        [convoy],
        [(convoy.pk, bead_id) for bead_id in tracked],
        {b.pk: (b.status, b.updated_at) for b in beads.values()},
        ready_ids,
        spinning([convoy.pk], now),
    )[convoy.pk]
    return summary, ready_ids


def convoy_summaries(convoys, now=None):
    """{convoy id: counts per segment, total, last activity, stranded and spin flags}.

    Five queries whatever the number of convoys and beads; tracked beads are selected by
    subquery, never by a long list of ids."""
    now = now or timezone.now()
    ids = [c.pk for c in convoys]
    tracking = TrackedBead.objects.filter(convoy_id__in=ids)
    rows = list(tracking.values_list("convoy_id", "bead_id"))
    tracked_beads = Bead.objects.filter(pk__in=tracking.values("bead_id"))
    beads = {row[0]: row[1:] for row in tracked_beads.values_list("id", "status", "updated_at")}
    ready_ids = set(ready_beads(tracked_beads, now).values_list("pk", flat=True))
    return summarise(convoys, rows, beads, ready_ids, spinning(ids, now))


def spinning(convoy_ids, now):
    """The convoys that recorded a spin warning in the last hour."""
    return set(
        Event.objects.filter(
            kind="spin", convoy_id__in=convoy_ids, created_at__gte=now - timedelta(hours=1)
        ).values_list("convoy_id", flat=True)
    )


def summarise(convoys, rows, beads, ready_ids, spin):
    """The summaries from loaded data: `rows` (convoy id, bead id), `beads` {id: (status,
    updated_at)}, the ready bead ids and the spinning convoy ids."""
    result = {}
    for convoy in convoys:
        result[convoy.pk] = dict.fromkeys(SEGMENTS, 0) | {
            "total": 0,
            "last_activity": convoy.updated_at,
            "spin": convoy.pk in spin,
        }
    for convoy_id, bead_id in rows:
        status, updated = beads.get(bead_id, (None, None))
        summary = result[convoy_id]
        summary[segment_for(bead_id, status, ready_ids)] += 1
        summary["total"] += 1
        if updated is not None and updated > summary["last_activity"]:
            summary["last_activity"] = updated
    by_id = {c.pk: c for c in convoys}
    for convoy_id, summary in result.items():
        total = summary["total"] or 1
        summary["percent"] = {k: round(100 * summary[k] / total, 2) for k in SEGMENTS}
        summary["stranded"] = by_id[convoy_id].status == CONVOY_OPEN and (
            summary["total"] == 0 or (summary["active"] == 0 and summary["done"] < summary["total"])
        )
    return result


def convoy_status_json(convoy):
    """The `convoy status --json` shape."""
    tracked = list(TrackedBead.objects.filter(convoy=convoy).values_list("bead_id", flat=True))
    beads = Bead.objects.in_bulk(tracked)
    workers = dict(
        Worker.objects.filter(
            name__in={b.assignee for b in beads.values() if b.assignee}
        ).values_list("name", "last_seen")
    )
    items = []
    for bead_id in tracked:
        bead = beads.get(bead_id)
        items.append(
            {
                "id": bead_id,
                "title": bead.title if bead else "",
                "status": bead.status if bead else "unknown",
                "issue_type": bead.issue_type if bead else "",
                "assignee": bead.assignee if bead else "",
                "rig": (bead.rig_id or "") if bead else "",
                "worker_seen": workers.get(bead.assignee) if bead and bead.assignee else None,
            }
        )
    completed = sum(1 for i in items if i["status"] in DONE_STATUSES)
    return {
        "id": convoy.id,
        "title": convoy.title,
        "status": convoy.status,
        "owner": convoy.owner,
        "tracked": items,
        "completed": completed,
        "total": len(items),
    }


def last_activity(convoy_ids):
    return dict(
        Event.objects.filter(convoy_id__in=convoy_ids)
        .values("convoy_id")
        .annotate(last=Max("created_at"))
        .values_list("convoy_id", "last")
    )


def open_convoys():
    return Convoy.objects.filter(status=CONVOY_OPEN)
