"""A convoy's progress: beads per segment, percents, last activity and the stranded verdict, read
from the kept projection for one convoy or many, and the status answer the API and CLI give."""

from collections.abc import Iterable, Mapping, Sequence, Set
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypedDict

from django.db.models import Max
from django.utils import timezone

from convoys.core import forecast
from convoys.core.formatting import percent_done
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    DONE_STATUSES,
    SKIPPED,
    Bead,
    Convoy,
    ConvoyFacts,
    Event,
    Merge,
    SourcedRecord,
    TrackedBead,
    Worker,
    status_symbol,
)
from convoys.read import projection, snapshots
from convoys.rules import breaker, forecasting, merging, stranding
from convoys.rules import causes as causemod
from convoys.rules.readiness import ready_beads
from convoys.rules.rows import TrackedRow, failed_beads

SEGMENTS = projection.SEGMENTS
segment_for = projection.segment_for  # the one segment rule, re-exported for the pages


class Summary(TypedDict):
    """A convoy's progress (`summarise`): beads per segment, their total and percents, when
    its beads last changed, the one stranded rule's verdict."""

    done: int
    skipped: int  # closed as not needed: not done
    submitted: int  # closed, waiting to merge
    active: int
    failed: int
    ready: int
    blocked: int
    unknown: int
    total: int
    last_activity: datetime
    spin: bool  # a spin warning in the last hour
    percent: dict[str, float]  # per segment
    percent_complete: int  # 100 only when all are done
    state: stranding.Verdict
    stranded: bool


Params = Mapping[str, str]  # a page's query parameters (request.GET)


def segment_of(
    bead: TrackedRow | Bead | None, ready_ids: Set[str], failed_ids: Set[str] = frozenset()
) -> str:
    if bead is None:
        return "unknown"
    return segment_for(bead.pk, bead.status, ready_ids, failed_ids)


def progress_json(summary: Summary) -> dict[str, int]:
    """Seed 003's progress shape, from a summary."""
    return {
        "total": summary["total"],
        "complete": summary["done"],
        "skipped": summary["skipped"],
        "submitted": summary["submitted"],
        "inProgress": summary["active"],
        "ready": summary["ready"],
        "blocked": summary["blocked"],
        "failed": summary["failed"],
        "unknown": summary["unknown"],
        "percentComplete": summary["percent_complete"],
    }


def convoy_summary(
    convoy: Convoy,
    tracked: list[str],
    beads: dict[str, TrackedRow],
    now: datetime | None = None,
    snapshot: snapshots.Snapshot | None = None,
) -> tuple[Summary, Set[str]]:
    """One convoy's summary and its ready bead ids from beads already read by
    `tracked_beads` (one query for the ready rule, one for spin), or with a
    `snapshots.Snapshot` (its ready, failed and blocker sets: no query for those)."""
    now = now or timezone.now()
    if snapshot is not None:
        kept = _kept_summary(convoy, tracked, beads, now, snapshot)
        return _after_grace(convoy, kept, now), snapshot.ready
    tracking = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    ready_ids = set(
        ready_beads(Bead.objects.filter(pk__in=tracking), now).values_list("pk", flat=True)
    )
    failed = failed_beads(Bead.objects.filter(pk__in=tracking))
    rows = [(convoy.pk, bead_id) for bead_id in tracked]
    loaded = _statuses(beads, beads)
    verdicts = stranding.classify(
        [convoy], now, explain=True, loaded=(rows, loaded, ready_ids), facts=None
    )
    spin = spinning([convoy.pk], now)
    waiting = merging.awaiting_among([i for i, b in beads.items() if b.status == "closed"])
    summary = summarise(
        [convoy], rows, loaded, ready_ids, spin, verdicts, failed, submitted_ids=waiting
    )[convoy.pk]
    return _after_grace(convoy, summary, now), ready_ids


def _after_grace(convoy: Convoy, summary: Summary, now: datetime) -> Summary:
    """The summary with the stranded flag pages show (`stranding.shown_stranded`): the read
    model knows since when the convoy has been feedable."""
    if summary["state"].kind != stranding.FEEDABLE:
        return summary
    since = (
        ConvoyFacts.objects.filter(pk=convoy.pk).values_list("feedable_since", flat=True).first()
    )
    return {**summary, "stranded": stranding.shown_stranded(summary["state"], since, now)}


def _kept_summary(
    convoy: Convoy,
    tracked: list[str],
    beads: dict[str, TrackedRow],
    now: datetime,
    snapshot: snapshots.Snapshot,
) -> Summary:
    """The summary from a snapshot: its statuses, ready, failed and blocker sets, and the
    ready beads the feeders skip (parked or cooling down)."""
    ready = snapshot.ready
    kept = _cooling(ready, now)
    loaded = _statuses(beads, beads)
    rows = [(convoy.pk, bead_id) for bead_id in tracked]
    verdicts = stranding.classify(
        [convoy],
        now,
        explain=True,
        loaded=(rows, loaded, ready),
        facts=(snapshot.beads, snapshot.blockers, snapshot.target_types, snapshot.rigs),
        cap=snapshot.cap,
        cooling=kept.parked | kept.recent,
    )
    spin = spinning([convoy.pk], now)
    return summarise([convoy], rows, loaded, ready, spin, verdicts, snapshot.failed)[convoy.pk]


class Cooling(NamedTuple):
    """The ready beads the feeders skip: parked by the breaker (until a retry: an event names
    the bead) and cooling down after a failed dispatch (until the cooldown runs out)."""

    parked: frozenset[str]
    recent: frozenset[str]


def _cooling(ready: Set[str], now: datetime) -> Cooling:
    found = stranding.cooling_among(ready, now)
    parked = frozenset(breaker.parked_among(sorted(found))) if found else frozenset()
    return Cooling(parked, frozenset(found) - parked)


def _statuses(
    bead_ids: Iterable[str], beads: Mapping[str, TrackedRow]
) -> dict[str, tuple[Any, ...]]:
    """{id: (status, updated_at)} of those of `bead_ids` that `beads` holds."""
    return {i: (beads[i].status, beads[i].updated_at) for i in bead_ids if i in beads}


def convoy_summaries(convoys: Sequence[Convoy], now: datetime | None = None) -> dict[str, Summary]:
    """{convoy id: counts per segment, total, last activity, stranded and spin flags}, read
    from the read model kept with the event log (`projection`): one row per convoy, and one
    query for the spin flags, whatever the number of beads."""
    now = now or timezone.now()
    ids = [c.pk for c in convoys]
    kept = {
        row["convoy_id"]: row
        for row in ConvoyFacts.objects.filter(convoy_id__in=ids).values(
            "convoy_id", *projection.CONVOY_FIELDS
        )
    }
    spin = spinning(ids, now)
    result: dict[str, Summary] = {}
    for convoy in convoys:
        facts = kept.get(convoy.pk)
        if facts is None:  # derived in a transaction that has not committed yet
            facts = projection.derive_convoys([convoy.pk], now).get(convoy.pk, {})
        result[convoy.pk] = _summary_of(convoy, facts, convoy.pk in spin, now)
    return result


def _summary_of(convoy: Convoy, facts: Mapping[str, Any], spin: bool, now: datetime) -> Summary:
    n = {segment: int(facts.get(segment) or 0) for segment in SEGMENTS}
    verdict = (
        stranding.Verdict(facts["verdict"], facts["reason"], facts["code"])
        if facts.get("verdict")
        else stranding.NOT_OPEN
    )
    last = facts.get("last_activity") or convoy.updated_at
    stranded = stranding.shown_stranded(verdict, facts.get("feedable_since"), now)
    return _summary(n, int(facts.get("total") or 0), last, spin, verdict, stranded)


def _summary(
    n: Mapping[str, int],
    total: int,
    last_activity: datetime,
    spin: bool,
    verdict: stranding.Verdict,
    stranded: bool,
) -> Summary:
    """A summary from the beads per segment `n`: the percents follow from the counts."""
    share = total or 1
    return Summary(
        done=n["done"],
        skipped=n["skipped"],
        submitted=n["submitted"],
        active=n["active"],
        failed=n["failed"],
        ready=n["ready"],
        blocked=n["blocked"],
        unknown=n["unknown"],
        total=total,
        last_activity=last_activity,
        spin=spin,
        percent={k: round(100 * n[k] / share, 2) for k in SEGMENTS},
        percent_complete=percent_done(n["done"], total),  # a skipped bead is not done
        state=verdict,
        stranded=stranded,
    )


def spinning(convoy_ids: Iterable[str], now: datetime) -> set[str]:
    """The convoys that recorded a spin warning in the last hour."""
    return set(
        Event.objects.filter(
            kind="spin", convoy_id__in=convoy_ids, created_at__gte=now - timedelta(hours=1)
        ).values_list("convoy_id", flat=True)
    )


def summarise(
    convoys: Iterable[Convoy],
    rows: Iterable[tuple[str, str]],
    beads: Mapping[str, tuple[Any, ...]],
    ready_ids: Set[str],
    spin: Set[str],
    verdicts: Mapping[str, stranding.Verdict],
    failed_ids: Set[str] = frozenset(),
    latest: Mapping[str, datetime | None] | None = None,
    submitted_ids: Set[str] = frozenset(),
) -> dict[str, Summary]:
    """The summaries from loaded data: `rows` (convoy id, bead id), `beads` {id: (status,
    updated_at)}, the ready bead ids, the spinning convoy ids, `stranding.classify` and the
    beads whose last dispatch failed. With `latest` ({convoy id: its beads' latest update}),
    `beads` need only hold (status,)."""
    counts: dict[str, dict[str, int]] = {}
    last: dict[str, datetime] = {}
    for convoy in convoys:
        counts[convoy.pk] = dict.fromkeys(SEGMENTS, 0)
        newest = latest.get(convoy.pk) if latest is not None else None
        last[convoy.pk] = max(convoy.updated_at, newest) if newest else convoy.updated_at
    for convoy_id, bead_id in rows:
        status, *updated = beads.get(bead_id, (None, None))
        counts[convoy_id][segment_for(bead_id, status, ready_ids, failed_ids, submitted_ids)] += 1
        if latest is None and updated[0] is not None and updated[0] > last[convoy_id]:
            last[convoy_id] = updated[0]
    result: dict[str, Summary] = {}
    for convoy_id, n in counts.items():
        verdict = verdicts[convoy_id]  # the one stranded rule: kind, reason and badge words
        total = sum(n.values())
        spun = convoy_id in spin
        result[convoy_id] = _summary(n, total, last[convoy_id], spun, verdict, verdict.stranded)
    return result


def convoy_status_json(convoy: Convoy, window: slice | None = None) -> dict[str, Any]:
    """The `convoy status --json` shape; `window`: only those tracked beads (in position
    order) are listed, the counts cover them all."""
    every = list(TrackedBead.objects.filter(convoy=convoy).values_list("bead_id", flat=True))
    tracked = every if window is None else every[window]
    cause_of = causemod.for_convoy(convoy)
    beads = Bead.objects.in_bulk(tracked)
    workers = dict(
        Worker.objects.filter(
            name__in={b.assignee for b in beads.values() if b.assignee}
        ).values_list("name", "last_seen")
    )
    origins = SourcedRecord.of(tracked)
    waiting = merging.awaiting_among([i for i, b in beads.items() if b.status == "closed"])
    changes = {m.bead_id: m for m in Merge.objects.filter(bead_id__in=tracked)}
    items = []
    for bead_id in tracked:
        bead = beads.get(bead_id)
        origin = origins.get(bead_id)
        status = bead.status if bead else "unknown"
        items.append(
            {
                "id": bead_id,
                "title": bead.title if bead else "",
                "status": merging.SUBMITTED if bead_id in waiting else status,
                "merge": merge_json(changes.get(bead_id)),
                "issue_type": bead.issue_type if bead else "",
                "assignee": bead.assignee if bead else "",
                "rig": (bead.rig_id or "") if bead else "",
                "worker_seen": workers.get(bead.assignee) if bead and bead.assignee else None,
                "cause": causemod.jsonable(cause_of.get(bead_id)),
                "source": origin.source if origin else None,
                "missing_from_source": bool(origin and origin.missing_since),
            }
        )
    if window is None:
        completed = sum(1 for i in items if i["status"] in DONE_STATUSES and i["status"] != SKIPPED)
    else:
        tracking = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
        done = Bead.objects.filter(pk__in=tracking, status__in=DONE_STATUSES).exclude(
            status=SKIPPED
        )
        completed = done.exclude(merging.awaiting_q()).count()
    origin = convoy.sourced
    return {
        "id": convoy.id,
        "title": convoy.title,
        "status": convoy.status,
        "owner": convoy.owner,
        "merge_strategy": merging.strategy(convoy),
        "deadline": deadline_json(convoy, *forecasting.deadline_of(convoy, timezone.now())),
        "source": origin.source if origin else None,
        "missing_from_source": bool(origin and origin.missing_since),
        "tracked": items,
        "completed": completed,
        "total": len(every),
        "progress": progress_json(convoy_summaries([convoy])[convoy.pk]),
        "causes": dict(causemod.counts(cause_of)),
    }


def deadline_json(
    convoy: Convoy, state: str, found: forecast.Forecast | None
) -> dict[str, Any] | None:
    """A convoy's due time, its state (on-track, at-risk, overdue, landed-on-time,
    landed-late) and the forecast it rests on; None without a due time."""
    if convoy.due_at is None:
        return None
    return {
        "id": convoy.pk,
        "title": convoy.title,
        "due_at": convoy.due_at.isoformat(),
        "state": state,
        "forecast": found.as_json() if found is not None else None,
    }


def merge_json(change: Merge | None) -> dict[str, str] | None:
    """A bead's change as the API and `convoy status --json` carry it (None: none known)."""
    if change is None:
        return None
    state = merging.SUBMITTED if change.state == Merge.OPEN else change.state
    names = ("ref", "link", "source", "branch", "target", "ci", "reason")
    return {"state": state, **{name: getattr(change, name) for name in names}}


def merge_of(bead_id: str) -> dict[str, str] | None:
    """`merge_json` of one bead's change."""
    return merge_json(Merge.objects.filter(pk=bead_id).first())


def last_activity(convoy_ids: Iterable[str]) -> dict[str, datetime]:
    return dict(
        Event.objects.filter(convoy_id__in=convoy_ids)
        .values("convoy_id")
        .annotate(last=Max("created_at"))
        .values_list("convoy_id", "last")
    )


def status_class(status: str) -> tuple[str, str]:
    """A node's (css class, icon) for a bead state."""
    icon = status_symbol(status)
    if status == SKIPPED:
        return "st-skipped", icon
    if status in DONE_STATUSES:
        return "st-done", icon
    if status == "submitted":
        return "st-submitted", icon
    if status in ACTIVE_WORK_STATUSES:
        return "st-active", icon
    if status in ("unknown", "ready"):
        return f"st-{status}", icon
    return "st-blocked", icon


# A status of each drawn state, to name the state's icon once (`state_icons`).
STATE_EXAMPLES = ("closed", "skipped", "submitted", "in_progress", "ready", "open", "unknown")


def state_icons() -> dict[str, str]:
    """{drawn state ("done", "submitted", "active", "ready", "blocked", "unknown"): its icon}, for the
    script that redraws a graph's nodes as they were (the time slider)."""
    return {css.removeprefix("st-"): icon for css, icon in map(status_class, STATE_EXAMPLES)}
