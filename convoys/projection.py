"""The read model kept with the event log: what the rules say about each bead and convoy.

`events.record_many` calls `apply` in the writer's own transaction with the events it just
appended; the registry (`kinds`) says what each one touches, and only those beads and convoys
are derived again, by the same rules a rebuild uses:
- per bead (`BeadFacts`): its summary segment, the readiness rule, the failed mark, whether
  the feeders may take it now (not cooling down, not parked), its open blockers, when its
  worker counts as dead and when its cooldown ends;
- per convoy (`ConvoyFacts`): beads per segment, the dispatchable count, last activity, the
  stranded verdict (`stranding.first_pass` and `judge`) and since when it has been feedable.
Time is an event too: the ticker records `worker.timed_out` and `cooldown.ended` when their
time passes (`services.timekeeping`), so what is kept depends on "now" only through those events.
`rebuild` derives everything from the rows alone; it is the reference that a property test
compares the incremental projection with, and what import, sync and `convoy reproject` use.
"""

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, OuterRef, Subquery
from django.utils import timezone

from . import bulk, kinds, stranding
from .events import last_seq
from .models import (
    ACTIVE_WORK_STATUSES,
    CONVOY_OPEN,
    DONE_STATUSES,
    Bead,
    BeadFacts,
    Convoy,
    ConvoyFacts,
    Cursor,
    Dependency,
    Dispatch,
    Event,
    TrackedBead,
    Worker,
)
from .readiness import blocked_by, ready_among, ready_beads
from .rows import failed_among, failed_beads

SEGMENTS = ("done", "active", "failed", "ready", "blocked", "unknown")
CHUNK = 500  # ids per query
BULK = "projection-bulk"  # the cursor where a bulk load's unsettled range starts
BEAD_FIELDS = (
    "segment",
    "ready",
    "feedable",
    "failed",
    "open_blockers",
    "worker_dead",
    "dead_at",
    "cooldown_until",
)
CONVOY_FIELDS = (
    "done",
    "active",
    "failed",
    "ready",
    "blocked",
    "unknown",
    "total",
    "dispatchable",
    "last_activity",
    "verdict",
    "code",
    "reason",
    "feedable_since",
)


def segment_for(
    bead_id: str,
    status: str | None,
    ready_ids: Collection[str],
    failed_ids: Collection[str] = frozenset(),
) -> str:
    """The one rule for a bead's segment of a progress bar."""
    if status is None:
        return "unknown"
    if status in DONE_STATUSES:
        return "done"
    if bead_id in failed_ids:
        return "failed"
    if bead_id in ready_ids:
        return "ready"
    if status in ACTIVE_WORK_STATUSES:
        return "active"
    return "blocked"


# --- per bead ---------------------------------------------------------------------------------
def derive_beads(ids: Collection[str] | None, now: datetime) -> dict[str, dict[str, Any]]:
    """{bead id: facts} of the beads among `ids` that exist (every bead with None)."""
    if ids is None:
        return _derive(Bead.objects.all(), None, now)
    result: dict[str, dict[str, Any]] = {}
    ordered = sorted(ids)
    for start in range(0, len(ordered), CHUNK):
        part = ordered[start : start + CHUNK]
        result |= _derive(Bead.objects.filter(pk__in=part), part, now)
    return result


def _derive(beads: Any, ids: Sequence[str] | None, now: datetime) -> dict[str, dict[str, Any]]:
    """The facts of `beads` (a queryset; `ids`: the few ids it selects, whose rules run as
    queries compiled once per number of ids, or None for a set-based pass)."""
    rows = list(beads.values_list("id", "status", "assignee", "updated_at"))
    if not rows:
        return {}
    if ids is None:
        ready = set(ready_beads(beads, now).values_list("pk", flat=True))
        failed = failed_beads(beads)
    else:
        ready, failed = ready_among(ids, now), failed_among(ids)
    cooling = stranding.cooling_among(ready, now)
    cooldown = timedelta(seconds=settings.CONVOY_RETRY_COOLDOWN)
    recent = (
        Dispatch.objects.filter(
            bead_id__in=beads.values("pk"), ok=False, created_at__gte=now - cooldown
        )
        .values("bead_id")
        .annotate(last=Max("created_at"))
        .values_list("bead_id", "last")
    )
    cooling_until = {bead_id: last + cooldown for bead_id, last in recent}
    unfinished = [r[0] for r in rows if r[1] not in DONE_STATUSES]
    blockers = (
        blocked_by(unfinished)
        if len(unfinished) <= CHUNK
        else blocked_by(beads.exclude(status__in=DONE_STATUSES).values_list("pk", flat=True))
    )
    held = [r for r in rows if r[2] and r[1] in ("open", *ACTIVE_WORK_STATUSES)]
    seen = dict(
        Worker.objects.filter(name__in={r[2] for r in held}).values_list("name", "last_seen")
    )
    timeout = timedelta(seconds=settings.CONVOY_WORKER_TIMEOUT)
    result = {}
    for bead_id, status, assignee, updated_at in rows:
        dead_at = None
        if assignee and status in ("open", *ACTIVE_WORK_STATUSES):
            dead_at = seen.get(assignee, updated_at) + timeout
        result[bead_id] = {
            "segment": segment_for(bead_id, status, ready, failed),
            "ready": bead_id in ready,
            "feedable": bead_id in ready and bead_id not in cooling,
            "failed": bead_id in failed,
            "open_blockers": len(blockers.get(bead_id, ())),
            "worker_dead": dead_at is not None and dead_at < now,
            "dead_at": dead_at,
            "cooldown_until": cooling_until.get(bead_id),
        }
    return result


def refresh_beads(ids: Collection[str] | None, seq: int, now: datetime) -> set[str]:
    """Derive the facts of `ids` (every bead with None) again and keep them; return the ids
    whose facts changed (or that appeared or went)."""
    derived = derive_beads(ids, now)
    kept = _kept_beads(ids)
    gone = set(kept) - set(derived) if ids is None else {i for i in ids if i not in derived}
    if gone:
        _delete(BeadFacts, "bead_id", gone)
    changed = {i for i, facts in derived.items() if kept.get(i) != facts}
    new = sorted(i for i in changed if i not in kept)  # most of an import's: a plain insert
    bulk.insert(BeadFacts, [{"bead_id": i, "seq": seq, **derived[i]} for i in new])
    _upsert(
        BeadFacts,
        "bead_id",
        [BeadFacts(bead_id=i, seq=seq, **derived[i]) for i in sorted(changed - set(new))],
        BEAD_FIELDS,
    )
    return changed | (gone & set(kept))


def _kept_beads(ids: Collection[str] | None) -> dict[str, dict[str, Any]]:
    rows = BeadFacts.objects.all()
    if ids is None:
        found = list(rows.values_list("bead_id", *BEAD_FIELDS))
    else:
        ordered, found = sorted(ids), []
        for start in range(0, len(ordered), CHUNK):
            part = rows.filter(bead_id__in=ordered[start : start + CHUNK])
            found += list(part.values_list("bead_id", *BEAD_FIELDS))
    return {row[0]: dict(zip(BEAD_FIELDS, row[1:], strict=True)) for row in found}


# --- per convoy -------------------------------------------------------------------------------
def derive_convoys(
    ids: Collection[str] | None, now: datetime, kept: Mapping[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """{convoy id: facts} from the kept bead facts (`kept`: the convoys' facts as they were,
    for the time each has been feedable)."""
    convoys = Convoy.objects.all() if ids is None else Convoy.objects.filter(pk__in=list(ids))
    convoys_by_id = {c.pk: c for c in convoys}
    if not convoys_by_id:
        return {}
    kept = kept if kept is not None else _kept_convoys(convoys_by_id)
    tallies = _tallies(list(convoys_by_id))
    latest = _latest(list(convoys_by_id))
    town = stranding.town_full(now)
    result: dict[str, dict[str, Any]] = {}
    stuck: dict[str, stranding.Verdict] = {}
    for pk, convoy in convoys_by_id.items():
        counts = tallies.get(pk, {})
        n = {segment: counts.get(segment, 0) for segment in SEGMENTS}
        total = sum(n.values())
        dispatchable = counts.get("dispatchable", 0)
        verdict = stranding.NOT_OPEN
        if convoy.status == CONVOY_OPEN:
            tally = stranding.Tally(total, total - n["done"], dispatchable, n["active"])
            verdict = stranding.judge(convoy, stranding.first_pass(convoy, tally), town)
            if verdict.kind == stranding.STUCK and not verdict.code:
                stuck[pk] = verdict
        newest = latest.get(pk)
        before = kept.get(pk, {})
        since = None
        if verdict.kind == stranding.FEEDABLE:
            was = before.get("verdict") == stranding.FEEDABLE
            since = before.get("feedable_since") if was else now
        result[pk] = {
            **n,
            "total": total,
            "dispatchable": dispatchable,
            "last_activity": max(convoy.updated_at, newest) if newest else convoy.updated_at,
            "verdict": verdict.kind,
            "code": verdict.code,
            "reason": verdict.reason,
            "feedable_since": since,
        }
        result[pk]["_verdict"] = verdict
    if stuck:
        _explain_stuck(stuck)
        for pk, verdict in stuck.items():
            result[pk] |= {"code": verdict.code, "reason": verdict.reason}
    for facts in result.values():
        del facts["_verdict"]
    return result


def _tallies(convoy_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """{convoy id: {segment: n, "dispatchable": n}} from the kept bead facts (one query per
    CHUNK convoys): a tracked bead without facts is not in the store (unknown)."""
    quote = connection.ops.quote_name
    tracked, facts = quote(TrackedBead._meta.db_table), quote(BeadFacts._meta.db_table)
    result: dict[str, dict[str, int]] = {}
    with connection.cursor() as cursor:
        for start in range(0, len(convoy_ids), CHUNK):
            part = convoy_ids[start : start + CHUNK]
            cursor.execute(
                f"SELECT t.convoy_id, f.segment, f.feedable, COUNT(*) FROM {tracked} t "
                f"LEFT JOIN {facts} f ON f.bead_id = t.bead_id "
                f"WHERE t.convoy_id IN ({', '.join(['%s'] * len(part))}) "
                "GROUP BY t.convoy_id, f.segment, f.feedable",
                list(part),
            )
            for convoy_id, segment, feedable, count in cursor.fetchall():
                counts = result.setdefault(convoy_id, {})
                key = segment or "unknown"
                counts[key] = counts.get(key, 0) + count
                if feedable:
                    counts["dispatchable"] = counts.get("dispatchable", 0) + count
    return result


def _latest(convoy_ids: Sequence[str]) -> dict[str, datetime]:
    """{convoy id: its tracked beads' latest update}."""
    updated = Bead.objects.filter(pk=OuterRef("bead_id")).values("updated_at")[:1]
    return dict(
        TrackedBead.objects.filter(convoy_id__in=convoy_ids)
        .annotate(updated=Subquery(updated))
        .values("convoy_id")
        .annotate(latest=Max("updated"))
        .values_list("convoy_id", "latest")
    )


def _explain_stuck(stuck: dict[str, stranding.Verdict]) -> None:
    """A stuck convoy's cause, from its beads' kept facts (`stranding.explain`)."""
    per_convoy: dict[str, list[str]] = {pk: [] for pk in stuck}
    for convoy_id, bead_id in TrackedBead.objects.filter(convoy_id__in=list(stuck)).values_list(
        "convoy_id", "bead_id"
    ):
        per_convoy[convoy_id].append(bead_id)
    ids = {i for members in per_convoy.values() for i in members}
    ready: set[str] = set()
    cooling: set[str] = set()
    ordered = sorted(ids)
    for start in range(0, len(ordered), CHUNK):
        part = BeadFacts.objects.filter(bead_id__in=ordered[start : start + CHUNK], ready=True)
        for bead_id, feedable in part.values_list("bead_id", "feedable"):
            ready.add(bead_id)
            if not feedable:
                cooling.add(bead_id)
    stranding.explain(per_convoy, dict(stuck), ready, cooling)


def refresh_convoys(ids: Collection[str] | None, seq: int, now: datetime) -> set[str]:
    """Derive the facts of convoys `ids` (every convoy with None) again and keep them;
    return the ids whose facts changed."""
    wanted = None if ids is None else set(ids)
    kept = _kept_convoys(wanted)
    derived = derive_convoys(wanted, now, kept)
    gone = (set(kept) if wanted is None else wanted & set(kept)) - set(derived)
    if gone:
        _delete(ConvoyFacts, "convoy_id", gone)
    changed = {i for i, facts in derived.items() if kept.get(i) != facts}
    _upsert(
        ConvoyFacts,
        "convoy_id",
        [ConvoyFacts(convoy_id=i, seq=seq, **derived[i]) for i in sorted(changed)],
        CONVOY_FIELDS,
    )
    return changed | gone


def _kept_convoys(ids: Iterable[str] | None) -> dict[str, dict[str, Any]]:
    rows = ConvoyFacts.objects.all()
    if ids is not None:
        rows = rows.filter(convoy_id__in=list(ids))
    return {
        row[0]: dict(zip(CONVOY_FIELDS, row[1:], strict=True))
        for row in rows.values_list("convoy_id", *CONVOY_FIELDS)
    }


# --- the write path ---------------------------------------------------------------------------
class _Keeper:
    """`events.Keeper`: every append is applied at once, but a bulk load's (an import's, a sync
    pass's: thousands of beads in batches) are settled in one pass at the end of its
    transaction (`events.settle`), over the range of the log it appended. Where that range
    starts is a row written in the writer's transaction (gone with it on a rollback); one a
    writer committed without settling is settled by the next settle, the ticker's included."""

    def keep(self, rows: Sequence[Mapping[str, Any]], first: int, bulk: bool) -> None:
        if not bulk:
            apply(rows, first)
        elif not Cursor.objects.filter(name=BULK).exists():
            Cursor.objects.create(name=BULK, position=first)

    def settle(self) -> None:
        with transaction.atomic():
            pending = Cursor.objects.select_for_update().filter(name=BULK).first()
            if pending is not None:
                settle_range(pending.position, last_seq())
                pending.delete()


KEEPER = _Keeper()


def settle_range(first: int, last: int) -> None:
    """Keep the facts that the events first..last (a bulk load) may have changed: every bead
    and convoy in one set-based pass when they name a quarter of the beads or more, else the
    beads they name, those these block and the convoys tracking them."""
    now = timezone.now()
    events = Event.objects.filter(seq__gte=first, seq__lte=last)
    named = set(events.exclude(bead_id="").values_list("bead_id", flat=True).distinct())
    convoys = set(events.exclude(convoy_id="").values_list("convoy_id", flat=True).distinct())
    if len(named) * 4 >= Bead.objects.count():
        refresh_beads(None, last, now)
        refresh_convoys(None, last, now)
        return
    changed = refresh_beads(named | _dependents(named), last, now) if named else set()
    convoys |= _tracking(changed)
    if convoys:
        refresh_convoys(convoys, last, now)


def apply(items: Sequence[Mapping[str, Any]], first_seq: int) -> None:
    """Keep the facts that `items` (events just appended from `first_seq` on, in the writer's
    transaction) may have changed."""
    seq = first_seq + len(items) - 1
    now = timezone.now()
    beads: set[str] = set()
    dependents_of: set[str] = set()
    convoys: set[str] = set()
    every_bead = every_convoy = capacity_moved = False
    for item in items:
        touches = kinds.REGISTRY[item["kind"]].touches
        bead_id, convoy_id = item.get("bead_id") or "", item.get("convoy_id") or ""
        data = item.get("data") or {}
        if bead_id and touches & {kinds.BEAD, kinds.GRAPH, kinds.DONE}:
            beads.add(bead_id)
            convoys.update(data.get("convoys") or ())
            if touches & {kinds.DONE, kinds.GRAPH} or _dependencies_changed(data):
                dependents_of.add(bead_id)
        if convoy_id and touches & {kinds.CONVOY, kinds.TRACKING, kinds.FEEDING, kinds.BEAD}:
            convoys.add(convoy_id)
        if kinds.RIG in touches:
            every_bead = True
        if kinds.CAPACITY in touches:
            every_convoy = True
        if touches & {kinds.PROGRESS, kinds.TIME, kinds.CAPACITY, kinds.DONE}:
            capacity_moved = True
    if every_bead:
        changed = refresh_beads(None, seq, now)
    else:
        if dependents_of:
            beads |= _dependents(dependents_of)
        changed = refresh_beads(beads, seq, now) if beads else set()
    if changed:
        convoys |= _tracking(changed)
    if capacity_moved and stranding.town_full(now) is not None or every_convoy:
        convoys |= _capacity_sensitive()
    if every_convoy:
        refresh_convoys(None, seq, now)
    elif convoys:
        refresh_convoys(convoys, seq, now)


def _dependencies_changed(data: Mapping[str, Any]) -> bool:
    changes = data.get("changes")
    return (
        (isinstance(changes, dict | list) and "dependencies" in changes)
        or "dependency_added" in data
        or "dependency_removed" in data
    )


def _dependents(bead_ids: Collection[str]) -> set[str]:
    """The beads that depend on any of `bead_ids`."""
    return {
        row[1] for row in bulk.select_in(Dependency, "depends_on_id", bead_ids, also="issue_id")
    }


def _tracking(bead_ids: Collection[str]) -> set[str]:
    """The convoys tracking any of `bead_ids`."""
    return {row[1] for row in bulk.select_in(TrackedBead, "bead_id", bead_ids, also="convoy_id")}


def _capacity_sensitive() -> set[str]:
    """The convoys whose verdict the town's capacity decides: feedable or waiting for it."""
    return set(ConvoyFacts.objects.filter(dispatchable__gt=0).values_list("convoy_id", flat=True))


def _upsert(model: Any, key: str, objs: list[Any], fields: Sequence[str]) -> None:
    for start in range(0, len(objs), CHUNK):
        model.objects.bulk_create(
            objs[start : start + CHUNK],
            update_conflicts=True,
            unique_fields=[key],
            update_fields=[*fields, "seq"],
        )


def _delete(model: Any, key: str, ids: Collection[str]) -> None:
    ordered = sorted(ids)
    for start in range(0, len(ordered), CHUNK):
        model.objects.filter(**{f"{key}__in": ordered[start : start + CHUNK]}).delete()


# --- the reference -------------------------------------------------------------------
def rebuild(convoy_ids: Collection[str] | None = None, now: datetime | None = None) -> None:
    """Derive the facts from the rows alone: of every bead and convoy, or of the beads that
    `convoy_ids` track and those convoys. Runs in its own transaction."""
    now = now or timezone.now()
    with transaction.atomic():
        seq = last_seq()
        if convoy_ids is None:
            refresh_beads(None, seq, now)
            refresh_convoys(None, seq, now)
            return
        tracked = set(
            TrackedBead.objects.filter(convoy_id__in=list(convoy_ids)).values_list(
                "bead_id", flat=True
            )
        )
        refresh_beads(tracked, seq, now)
        refresh_convoys(set(convoy_ids), seq, now)
