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

One module, though long: the incremental path and the rebuild derive the same facts by the same
rules, and keeping them side by side is what lets a reader check that they agree.
"""

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, OuterRef, Q, Subquery
from django.utils import timezone

from convoys.core import dag as dagmod
from convoys.infra import bulk
from convoys.log import kinds
from convoys.log.events import last_seq
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    CONVOY_OPEN,
    DONE_STATUSES,
    SKIPPED,
    SLINGABLE_TYPES,
    Bead,
    BeadFacts,
    Convoy,
    ConvoyFacts,
    Cursor,
    Dependency,
    Dispatch,
    Event,
    Rig,
    TrackedBead,
    Worker,
)
from convoys.rules import causes as causemod
from convoys.rules import merging, stranding
from convoys.rules.causes import WAITING_TO_MERGE
from convoys.rules.readiness import blocked_by, ready_among, ready_beads
from convoys.rules.rows import (
    Edge,
    TrackedRow,
    failed_among,
    failed_beads,
    read_rows,
    tracked_beads,
)

Gate = tuple[str, str, str, str]  # (id, title, issue type, status) of a blocker that is no task
Built = tuple[dagmod.DAG, list[list[str]], list[dagmod.Gated], list[Gate]]

SEGMENTS = ("done", "skipped", "submitted", "active", "failed", "ready", "blocked", "unknown")
# The segments of a bead whose status is done (`segment_for`): what a plan leaves out.
FINISHED = frozenset({"done", "skipped", "submitted"})
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
    "cause",
)
# What a convoy counts of a bead: its segment, ready, feedable and cause (None: no facts).
Counted = tuple[str | None, bool | None, bool | None, str | None]
CONVOY_FIELDS = (
    "done",
    "skipped",
    "submitted",
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
    "causes",
    "waves",
    "gated",
    "critical",
)


def segment_for(
    bead_id: str,
    status: str | None,
    ready_ids: Collection[str],
    failed_ids: Collection[str] = frozenset(),
    submitted_ids: Collection[str] = frozenset(),
) -> str:
    """The one rule for a bead's segment of a progress bar (`submitted`: closed, waiting for
    its merge, `merging.awaiting_q`)."""
    if status is None:
        return "unknown"
    if status == SKIPPED:
        return "skipped"
    if status in DONE_STATUSES:
        return "submitted" if bead_id in submitted_ids else "done"
    if status == "submitted":  # a page's row (`rows.read_rows(shown=True)`)
        return "submitted"
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
    """The facts of `beads` (a queryset; `ids`: the few ids it selects, whose rules are asked
    by id, or None for a set-based pass)."""
    read = read_rows(beads)
    if not read:
        return {}
    rows = [(r.pk, r.status, r.assignee, r.updated_at) for r in read.values()]
    unfinished = [r[0] for r in rows if r[1] not in DONE_STATUSES]
    if ids is None:
        ready = set(ready_beads(beads, now).values_list("pk", flat=True))
        failed = failed_beads(beads)
        submitted = set(merging.awaiting(beads).values_list("pk", flat=True))
    else:
        # A done bead is never ready nor failed: both rules ask only of the unfinished.
        ready, failed = ready_among(unfinished, now), failed_among(unfinished)
        submitted = merging.awaiting_among([r[0] for r in rows if r[1] == "closed"])
    cooling = stranding.cooling_among(ready, now)
    # A failed dispatch's cooldown holds back unfinished beads only: a done one has none.
    cooldown = timedelta(seconds=settings.CONVOY_RETRY_COOLDOWN)
    among = unfinished if ids is not None else beads.exclude(status__in=DONE_STATUSES).values("pk")
    recent = (
        (
            Dispatch.objects.filter(bead_id__in=among, ok=False, created_at__gte=now - cooldown)
            .values("bead_id")
            .annotate(last=Max("created_at"))
            .values_list("bead_id", "last")
        )
        if unfinished
        else []
    )
    cooling_until = {bead_id: last + cooldown for bead_id, last in recent}
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
    # Each unfinished bead's cause, the capacity queues aside (they move with every dispatch).
    # What was read here by the readiness rules, `causes.load` takes rather than reads again.
    cause_of = (
        causemod.load(
            unfinished,
            unfinished if ids is not None else beads.values("pk"),
            now,
            _known(read, unfinished, ready, blockers),
            queues=False,
        )
        if unfinished
        else {}
    )
    result = {}
    for bead_id, status, assignee, updated_at in rows:
        dead_at = None
        if assignee and status in ("open", *ACTIVE_WORK_STATUSES):
            dead_at = seen.get(assignee, updated_at) + timeout
        result[bead_id] = {
            "segment": segment_for(bead_id, status, ready, failed, submitted),
            "ready": bead_id in ready,
            "feedable": bead_id in ready and bead_id not in cooling,
            "failed": bead_id in failed,
            "open_blockers": len(blockers.get(bead_id, ())),
            "worker_dead": dead_at is not None and dead_at < now,
            "dead_at": dead_at,
            "cooldown_until": cooling_until.get(bead_id),
            "cause": cause_of[bead_id]["kind"]
            if bead_id in cause_of
            else WAITING_TO_MERGE
            if bead_id in submitted
            else "",
        }
    return result


def _known(
    read: dict[str, TrackedRow],
    unfinished: list[str],
    ready: Collection[str],
    blockers: dict[str, list[str]],
) -> causemod.Read:
    """What `_derive` read, as `causes.load` takes it: the blockers' types and the rigs'
    states (a query each, per 500 blockers) instead of its five queries."""
    targets = sorted({b for ids in blockers.values() for b in ids})
    types: dict[str, str] = {}
    for start in range(0, len(targets), CHUNK):
        part = targets[start : start + CHUNK]
        types |= dict(Bead.objects.filter(pk__in=part).values_list("id", "issue_type"))
    rigs = sorted({r.rig_id for r in read.values() if r.rig_id})
    states = dict(Rig.objects.filter(pk__in=rigs).values_list("name", "state")) if rigs else {}
    return causemod.Read(unfinished, read, frozenset(ready), blockers, types, states, 0)


def refresh_beads(
    ids: Collection[str] | None,
    seq: int,
    now: datetime,
    flipped: set[str] | None = None,
    among: Any = None,
    moved: dict[str, tuple[Counted, Counted]] | None = None,
) -> set[str]:
    """Derive the facts of `ids` (every bead with None) again and keep them; return the ids
    whose facts changed (or that appeared or went), add to `flipped` those that moved into
    or out of FINISHED, and to `moved` what a convoy counts of each changed bead, before and
    after. `among`: a subquery selecting the same ids (many of them: one set-based pass)."""
    if among is not None and ids is not None:
        wanted = set(ids)
        found = _derive(Bead.objects.filter(pk__in=among), None, now)
        derived = {i: facts for i, facts in found.items() if i in wanted}
    else:
        derived = derive_beads(ids, now)
    kept = _kept_beads(ids)
    gone = set(kept) - set(derived) if ids is None else {i for i in ids if i not in derived}
    if gone:
        _delete(BeadFacts, "bead_id", gone)
    changed = {i for i, facts in derived.items() if kept.get(i) != facts}
    if moved is not None:
        for i in changed | (gone & set(kept)):
            moved[i] = (_counted(kept.get(i)), _counted(derived.get(i)))
    if flipped is not None:
        flipped |= gone & set(kept)
        flipped.update(
            i
            for i in changed
            if (kept.get(i, {}).get("segment") in FINISHED) != (derived[i]["segment"] in FINISHED)
        )
    new = sorted(i for i in changed if i not in kept)  # most of an import's: a plain insert
    bulk.insert(BeadFacts, [{"bead_id": i, "seq": seq, **derived[i]} for i in new])
    _upsert(
        BeadFacts,
        "bead_id",
        [BeadFacts(bead_id=i, seq=seq, **derived[i]) for i in sorted(changed - set(new))],
        BEAD_FIELDS,
    )
    return changed | (gone & set(kept))


def _counted(facts: Mapping[str, Any] | None) -> Counted:
    """What a convoy's tally counts of a bead's facts (None: a bead without facts)."""
    if facts is None:
        return (None, None, None, None)
    return (facts["segment"], facts["ready"], facts["feedable"], facts["cause"])


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


# --- per convoy: its plan (waves and critical path) -------------------------------------------
def graph_rows(convoy: Convoy) -> tuple[list[str], dict[str, TrackedRow], list[Edge], list[Gate]]:
    """(tracked ids, {id: row}, edges, gates) of a convoy's graph: the untracked blockers
    that are no task (a decision) hold tracked beads back, so they are read too."""
    tracked, beads, edges = tracked_beads(convoy)
    outside = {t for _, t, kind in edges if t not in beads and kind in dagmod.EXECUTION_TYPES}
    gates = Bead.objects.filter(pk__in=outside).exclude(issue_type__in=SLINGABLE_TYPES)
    return tracked, beads, edges, list(gates.values_list("id", "title", "issue_type", "status"))


def node_of(row: TrackedRow) -> dagmod.Node:
    return dagmod.Node(
        id=row.pk,
        title=row.title,
        type=row.issue_type or "",
        status=row.status,
        rig=row.rig_id or "",
    )


def build_graph(beads: Mapping[str, TrackedRow], edges: list[Edge], gates: list[Gate]) -> Built:
    """(DAG, waves, gated, gates) from tracked rows, their edges and the gate rows: the one
    rule for a convoy's graph, which the plan kept here and a page's drawing both use."""
    nodes = [node_of(b) for b in beads.values()]
    nodes += [dagmod.Node(id=g[0], title=g[1], type=g[2], status=g[3]) for g in gates]
    graph = dagmod.build_dag(nodes, edges)
    graph.ghost_edges = sorted(
        {(t, i) for i, t, kind in edges if kind in dagmod.EXECUTION_TYPES and t not in graph.nodes}
    )
    try:
        waves, gated = dagmod.compute_waves(graph)
    except dagmod.NoSlingableTasks:
        waves, gated = [], []
    return graph, waves, gated, gates


class Plan(NamedTuple):
    waves: dict[str, int | None]  # {tracked bead: its wave, 0 when gated, None in no wave}
    critical: list[str]  # the critical path of the beads not done


def derive_plans(ids: Collection[str] | None) -> dict[str, Plan]:
    """{convoy id: Plan} of convoys `ids` (every convoy with None), from the rows alone."""
    convoys = Convoy.objects.all() if ids is None else Convoy.objects.filter(pk__in=sorted(ids))
    plans = {}
    for convoy in convoys:
        tracked, beads, edges, gates = graph_rows(convoy)
        graph, waves, gated, _ = build_graph(beads, edges, gates)
        wanted: dict[str, int | None] = dict.fromkeys(tracked)
        wanted |= {b: n for n, wave in enumerate(waves, 1) for b in wave}
        wanted |= {g.id: 0 for g in gated if g.id in wanted}
        plans[convoy.pk] = Plan(wanted, dagmod.critical_path(graph) if waves else [])
    return plans


def refresh_plans(ids: Collection[str] | None) -> dict[str, list[str]]:
    """Derive the plans of convoys `ids` (every convoy with None) again, keep each tracked
    bead's wave on its tracking row and return {convoy id: critical path}."""
    plans = derive_plans(ids)
    for convoy_id, plan in plans.items():
        kept = TrackedBead.objects.filter(convoy_id=convoy_id)
        moved: dict[int | None, list[str]] = {}
        for bead_id, wave in kept.values_list("bead_id", "wave"):
            if plan.waves.get(bead_id) != wave:
                moved.setdefault(plan.waves.get(bead_id), []).append(bead_id)
        for wave, bead_ids in moved.items():
            for start in range(0, len(bead_ids), CHUNK):
                kept.filter(bead_id__in=bead_ids[start : start + CHUNK]).update(wave=wave)
    return {convoy_id: plan.critical for convoy_id, plan in plans.items()}


# --- per convoy -------------------------------------------------------------------------------
def derive_convoys(
    ids: Collection[str] | None,
    now: datetime,
    kept: Mapping[str, dict[str, Any]] | None = None,
    plans: Mapping[str, list[str]] | None = None,
    counted: tuple[Mapping[str, dict[str, Any]], Mapping[str, datetime]] = ({}, {}),
) -> dict[str, dict[str, Any]]:
    """{convoy id: facts} from the kept bead facts and tracking rows' waves (`kept`: the
    convoys' facts as they were, for the time each has been feedable and, for those not in
    `plans`, their critical path; `plans`: {convoy id: critical path} derived again;
    `counted`: the tallies and latest bead updates of some convoys, kept by delta)."""
    convoys = Convoy.objects.all() if ids is None else Convoy.objects.filter(pk__in=list(ids))
    convoys_by_id = {c.pk: c for c in convoys}
    if not convoys_by_id:
        return {}
    kept = kept if kept is not None else _kept_convoys(convoys_by_id)
    given, newest_given = counted
    counting = [pk for pk in convoys_by_id if pk not in given]
    tallies = {**_tallies(counting), **given} if counting else dict(given)
    latest = {**_latest(counting), **newest_given} if counting else dict(newest_given)
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
            tally = stranding.Tally(
                total, total - n["done"] - n["skipped"], dispatchable, n["active"], n["submitted"]
            )
            verdict = stranding.judge(convoy, stranding.first_pass(convoy, tally), town)
            if verdict.kind == stranding.STUCK and not verdict.code:
                stuck[pk] = verdict
        newest = latest.get(pk)
        before = kept.get(pk, {})
        since = None
        if verdict.kind == stranding.FEEDABLE:
            was = before.get("verdict") == stranding.FEEDABLE
            since = before.get("feedable_since") if was else now
        critical = plans[pk] if plans is not None and pk in plans else before.get("critical")
        result[pk] = {
            **n,
            "total": total,
            "dispatchable": dispatchable,
            "last_activity": max(convoy.updated_at, newest) if newest else convoy.updated_at,
            "verdict": verdict.kind,
            "code": verdict.code,
            "reason": verdict.reason,
            "feedable_since": since,
            "causes": counts.get("causes", {}),
            "waves": counts.get("waves", []),
            "gated": counts.get("gated", {}),
            "critical": critical or [],
        }
        result[pk]["_verdict"] = verdict
    if stuck:
        _explain_stuck(stuck)
        for pk, verdict in stuck.items():
            result[pk] |= {"code": verdict.code, "reason": verdict.reason}
    for facts in result.values():
        del facts["_verdict"]
    return result


def _tallies(convoy_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """{convoy id: {segment: n, "dispatchable": n, "causes": {kind: n}, "waves": [per wave],
    "gated": {…}}} from the kept bead facts and waves (one query per CHUNK convoys): a
    tracked bead without facts is not in the store (unknown). A wave's counts are the wave
    table's: done, active, ready and blocked (a failed bead by its readiness, an unknown one
    blocked), its total and the causes of the beads not done."""
    quote = connection.ops.quote_name
    tracked, facts = quote(TrackedBead._meta.db_table), quote(BeadFacts._meta.db_table)
    result: dict[str, dict[str, Any]] = {}
    per_wave: dict[str, dict[int, dict[str, Any]]] = {}
    with connection.cursor() as cursor:
        for start in range(0, len(convoy_ids), CHUNK):
            part = convoy_ids[start : start + CHUNK]
            cursor.execute(
                "SELECT t.convoy_id, t.wave, f.segment, f.ready, f.feedable, f.cause, COUNT(*) "
                f"FROM {tracked} t LEFT JOIN {facts} f ON f.bead_id = t.bead_id "
                f"WHERE t.convoy_id IN ({', '.join(['%s'] * len(part))}) "
                "GROUP BY t.convoy_id, t.wave, f.segment, f.ready, f.feedable, f.cause",
                list(part),
            )
            for convoy_id, wave, segment, ready, feedable, cause, count in cursor.fetchall():
                counts = result.setdefault(convoy_id, {"causes": {}})
                waves = per_wave.setdefault(convoy_id, {})
                _count(counts, waves, wave, (segment, ready, feedable, cause), count)
    for convoy_id, counts in result.items():
        _settle_tally(counts, per_wave.get(convoy_id, {}))
    return result


def _count(
    counts: dict[str, Any],
    waves: dict[int, dict[str, Any]],
    wave: int | None,
    bead: Counted,
    n: int,
) -> None:
    """Count `n` beads (or take them away, n < 0) with facts `bead` in wave `wave` into a
    convoy's `counts` and `waves` (a bead without facts is unknown, and blocked in its wave)."""
    segment, ready, feedable, cause = bead
    key = segment or "unknown"
    counts[key] = counts.get(key, 0) + n
    if feedable:
        counts["dispatchable"] = counts.get("dispatchable", 0) + n
    kind = cause or ("unknown" if segment is None else "")
    if kind:
        counts["causes"][kind] = counts["causes"].get(kind, 0) + n
    if wave is None:
        return
    column = (
        key
        if key in ("done", "skipped", "submitted", "active")
        else "ready"
        if ready
        else "blocked"
    )
    row = waves.setdefault(wave, _wave_tally())
    row[column] = row.get(column, 0) + n
    row["total"] += n
    if kind:
        row["causes"][kind] = row["causes"].get(kind, 0) + n


def _settle_tally(counts: dict[str, Any], waves: dict[int, dict[str, Any]]) -> None:
    """A convoy's tally as kept: its waves as a list (1…the last), the gated beads apart,
    and only the causes some bead has, in order."""
    numbers = [n for n in waves if n]
    counts["waves"] = [
        _sorted_causes(waves.get(n) or _wave_tally()) for n in range(1, max(numbers, default=0) + 1)
    ]
    if 0 in waves:
        counts["gated"] = _sorted_causes(waves[0])
    counts["causes"] = {k: n for k, n in sorted(counts["causes"].items()) if n}


def _tallies_moved(
    kept: Mapping[str, dict[str, Any]], moved: Mapping[str, tuple[Counted, Counted]]
) -> dict[str, dict[str, Any]]:
    """The tallies of the `kept` convoys whose tracking and plan did not change, by delta:
    what was kept, less the `moved` beads' facts as they were, plus their facts now."""
    result: dict[str, dict[str, Any]] = {}
    per_wave: dict[str, dict[int, dict[str, Any]]] = {}
    for convoy_id, facts in kept.items():
        result[convoy_id] = {
            **{segment: facts[segment] for segment in SEGMENTS},
            "dispatchable": facts["dispatchable"],
            "causes": dict(facts["causes"] or {}),
        }
        waves = {n: _copied(row) for n, row in enumerate(facts["waves"] or [], start=1)}
        if facts["gated"]:
            waves[0] = _copied(facts["gated"])
        per_wave[convoy_id] = waves
    if moved and kept:
        where = {(b, c): w for b, c, w in _tracked_waves(moved) if c in kept}
        for (bead_id, convoy_id), wave in where.items():
            before, after = moved[bead_id]
            _count(result[convoy_id], per_wave[convoy_id], wave, before, -1)
            _count(result[convoy_id], per_wave[convoy_id], wave, after, 1)
    for convoy_id, counts in result.items():
        _settle_tally(counts, per_wave[convoy_id])
    return result


def _copied(row: Mapping[str, Any]) -> dict[str, Any]:
    return {**row, "causes": dict(row.get("causes") or {})}


def _tracked_waves(bead_ids: Iterable[str]) -> list[tuple[str, str, int | None]]:
    """(bead id, convoy id, wave) of each tracking of `bead_ids`."""
    ordered = sorted(bead_ids)
    rows: list[tuple[str, str, int | None]] = []
    for start in range(0, len(ordered), CHUNK):
        part = TrackedBead.objects.filter(bead_id__in=ordered[start : start + CHUNK])
        rows += part.values_list("bead_id", "convoy_id", "wave")
    return rows


def _wave_tally() -> dict[str, Any]:
    return {
        "done": 0,
        "skipped": 0,
        "submitted": 0,
        "active": 0,
        "ready": 0,
        "blocked": 0,
        "total": 0,
        "causes": {},
    }


def _sorted_causes(row: dict[str, Any]) -> dict[str, Any]:
    return row | {"causes": {k: n for k, n in sorted(row["causes"].items()) if n}}


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


def _latest_moved(
    kept: Mapping[str, dict[str, Any]], touched: Collection[str]
) -> dict[str, datetime]:
    """{convoy id: its latest activity} of the `kept` convoys by delta: a bead's update
    only moves forward, so it is the kept one or a `touched` bead's newer update."""
    latest = {pk: facts["last_activity"] for pk, facts in kept.items()}
    if touched and kept:
        ordered = sorted(touched)
        updated: dict[str, datetime] = {}
        for start in range(0, len(ordered), CHUNK):
            part = Bead.objects.filter(pk__in=ordered[start : start + CHUNK])
            updated.update(part.values_list("pk", "updated_at"))
        for bead_id, convoy_id, _ in _tracked_waves(updated):
            if convoy_id in latest and updated[bead_id] > latest[convoy_id]:
                latest[convoy_id] = updated[bead_id]
    return latest


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


def refresh_convoys(
    ids: Collection[str] | None,
    seq: int,
    now: datetime,
    replan: Collection[str] | None = (),
    moved: Mapping[str, tuple[Counted, Counted]] | None = None,
    touched: Collection[str] = (),
) -> set[str]:
    """Derive the facts of convoys `ids` (every convoy with None) again and keep them, the
    plans of `replan` (every convoy's with None) first; return the ids whose facts changed.
    `moved`: every bead whose facts changed since they were kept, before and after (from
    `refresh_beads`), and `touched` the beads the events named: the convoys not planned
    again are then counted by delta instead of over all their beads."""
    plans = refresh_plans(replan) if replan is None or replan else {}
    wanted = None if ids is None else set(ids) | set(plans)
    kept = _kept_convoys(wanted)
    counted: tuple[Mapping[str, dict[str, Any]], Mapping[str, datetime]] = ({}, {})
    if moved is not None and wanted is not None:
        steady = {pk: facts for pk, facts in kept.items() if pk not in plans}
        counted = (_tallies_moved(steady, moved), _latest_moved(steady, touched))
    derived = derive_convoys(wanted, now, kept, plans, counted)
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
    replanned = sorted(i for i in plans if i in changed)
    for start in range(0, len(replanned), CHUNK):  # the graph version: the seq that moved it
        part = replanned[start : start + CHUNK]
        ConvoyFacts.objects.filter(convoy_id__in=part).update(graph_seq=seq)
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
        refresh_convoys(None, last, now, replan=None)
        return
    changed = refresh_beads(named | _dependents(named), last, now) if named else set()
    convoys |= _tracking(changed)
    if convoys:
        refresh_convoys(convoys, last, now, replan=convoys)


def apply(items: Sequence[Mapping[str, Any]], first_seq: int) -> None:
    """Keep the facts that `items` (events just appended from `first_seq` on, in the writer's
    transaction) may have changed."""
    seq = first_seq + len(items) - 1
    now = timezone.now()
    beads: set[str] = set()
    dependents_of: set[str] = set()
    convoys: set[str] = set()
    feeding: set[str] = set()  # convoys whose beads' causes may change (a pause)
    replan: set[str] = set()  # convoys whose graph may have changed
    reshaped: set[str] = set()  # beads whose place in a graph may have changed
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
            if kinds.GRAPH in touches or _dependencies_changed(data) or _type_changed(data):
                reshaped.add(bead_id)
        if convoy_id and touches & {kinds.CONVOY, kinds.TRACKING, kinds.FEEDING, kinds.BEAD}:
            convoys.add(convoy_id)
        if convoy_id and touches & {kinds.TRACKING, kinds.GRAPH}:
            replan.add(convoy_id)
        if convoy_id and touches & {kinds.FEEDING, kinds.TRACKING}:
            feeding.add(convoy_id)  # a pause, or beads newly under (or out of) one
            for key in ("added", "removed"):
                listed = data.get(key)
                if isinstance(listed, list):
                    beads.update(b for b in listed if isinstance(b, str))
        if kinds.RIG in touches:
            every_bead = True
        if kinds.CAPACITY in touches:
            every_convoy = True
        if touches & {kinds.TIME, kinds.CAPACITY, kinds.IN_FLIGHT}:
            capacity_moved = True
    flipped: set[str] = set()
    moved: dict[str, tuple[Counted, Counted]] = {}
    named = set(beads)
    if every_bead:
        changed = refresh_beads(None, seq, now, flipped, moved=moved)
    else:
        if dependents_of:
            beads |= _dependents(dependents_of)
        changed = refresh_beads(beads, seq, now, flipped, moved=moved) if beads else set()
        for convoy_id in sorted(feeding):
            members = TrackedBead.objects.filter(convoy_id=convoy_id).values("bead_id")
            ids = set(members.values_list("bead_id", flat=True)) - beads
            if ids:
                changed |= refresh_beads(ids, seq, now, flipped, among=members, moved=moved)
    if changed:
        convoys |= _tracking(changed)
    replan |= _tracking(reshaped) | _replanned_by(flipped)
    if capacity_moved or every_convoy:
        convoys |= _capacity_sensitive(full=every_convoy or stranding.town_full(now) is not None)
    if every_convoy:
        refresh_convoys(None, seq, now, replan)
    elif convoys or replan:
        refresh_convoys(convoys, seq, now, replan, moved, named)


def _type_changed(data: Mapping[str, Any]) -> bool:
    changes = data.get("changes")
    return isinstance(changes, dict | list) and "issue_type" in changes


def _replanned_by(flipped: Collection[str]) -> set[str]:
    """The convoys whose plan the beads `flipped` (into or out of FINISHED) may have changed: a
    gate's (or a gone bead's) changes the waves of what it holds back; a task reopened may
    lengthen the critical path, and one on it closing shortens it."""
    if not flipped or not (_tracking(flipped) or _dependents(flipped)):
        return set()  # no convoy tracks them nor anything they hold back: no plan moves
    types = dict(Bead.objects.filter(pk__in=sorted(flipped)).values_list("pk", "issue_type"))
    gates = {b for b in flipped if (types.get(b) or "") not in SLINGABLE_TYPES}
    tasks = set(flipped) - gates
    out = _tracking(gates | _dependents(gates)) if gates else set()
    if tasks and _tracking(tasks):  # a task no convoy tracks is in no plan
        done = set(
            BeadFacts.objects.filter(bead_id__in=sorted(tasks), segment__in=FINISHED).values_list(
                "bead_id", flat=True
            )
        )
        out |= _tracking(tasks - done)
        closed = tasks & done
        holders = _tracking(closed) - out
        for convoy_id, critical in ConvoyFacts.objects.filter(
            convoy_id__in=sorted(holders)
        ).values_list("convoy_id", "critical"):
            if closed & set(critical or ()):
                out.add(convoy_id)
    return out


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


def _capacity_sensitive(full: bool) -> set[str]:
    """The convoys whose verdict the town's capacity decides: those waiting for it (their
    reason counts what is in flight) and, while the town is `full`, the feedable ones."""
    waiting = Q(code=stranding.WAITING_FOR_CAPACITY)
    rows = ConvoyFacts.objects.filter(waiting | Q(dispatchable__gt=0) if full else waiting)
    return set(rows.values_list("convoy_id", flat=True))


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
            refresh_convoys(None, seq, now, replan=None)
            return
        tracked = set(
            TrackedBead.objects.filter(convoy_id__in=list(convoy_ids)).values_list(
                "bead_id", flat=True
            )
        )
        refresh_beads(tracked, seq, now)
        refresh_convoys(set(convoy_ids), seq, now, replan=set(convoy_ids))
