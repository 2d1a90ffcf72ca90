"""Why is this bead not moving? Exactly one cause for every tracked bead that is not done.

`decide` is a pure function over what `load` read about one bead (`CauseFacts`): the first kind that
holds, in this order, is the cause:

  unknown               not in the store
  not-slingable         a type that is never dispatched, a status that holds it (deferred,
                        blocked, pinned, hooked with nobody assigned), or no rig
  paused                a convoy tracking it is paused (the claim refuses it); a bead a live
                        worker holds is working still (a pause stops no work under way)
  blocked               open blockers that are work (their ids)
  gated                 open blockers that are decisions or other non-work beads (their ids)
  rig-parked/-docked    its rig is parked or docked
  circuit-broken        the dispatch breaker parked it (failures in a row, last error)
  cooling-down          a dispatch failed within CONVOY_RETRY_COOLDOWN (until when)
  waiting-for-capacity  ready, but its convoy is at its max in flight (position in its queue)
                        or the town is at CONVOY_MAX_IN_FLIGHT (position in the town queue)
  unknown-outcome       claimed for a worker, but no outcome of the dispatch is recorded yet
                        (the catch-up settles it when its process seems gone: services.dispatch)
  working               a live worker holds it (worker, last seen)
  dead-worker           its worker is silent: a stranded scan rescues it, one bead per convoy
                        per scan (the next scan: by when)
  ready                 the next feed takes it (the open convoys that feed it)

and a closed bead that waits for its merge (`merging`: tracked by a convoy merging by mr) is

  waiting-to-merge      submitted: its change (link, branch) and since when it waits

The rules are not derived again here: readiness (`readiness.ready_beads`, `blocked_by`,
`worker_dead`), the breaker and cooldown (`rules.breaker`), the pause (the convoy rows the
claim reads) and the town capacity queue (`rules.capacity`) decide; this module only names
the first that holds. `load` reads a fixed number of queries whatever the number of beads.
The convoy page (each row and a summary), the bead page, the API and `convoy status` all ask
this module.

One module, though long: the order of the causes is the rule, and `load`'s queries, `decide`
and the wording of each cause change together when a cause is added.
"""

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from django.conf import settings
from django.db.models import Case, CharField, Count, Exists, OuterRef, Q, QuerySet, Value, When
from django.utils import timezone

from convoys.core.formatting import person
from convoys.log.kinds import PROGRESS_KINDS
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    BLOCKING_DEP_TYPES,
    CONVOY_OPEN,
    DONE_STATUSES,
    SLINGABLE_TYPES,
    STAGED_STATUSES,
    Bead,
    BeadFacts,
    Convoy,
    Dependency,
    Dispatch,
    Merge,
    Rig,
    TrackedBead,
    Worker,
)
from convoys.rules import breaker, capacity, merging
from convoys.rules.breaker import parked_among
from convoys.rules.readiness import blocked_by, dead_among, ready_beads, worker_dead
from convoys.rules.rows import TrackedRow

Cause = dict[str, Any]  # {"kind": one of KINDS, "text": words for people, …details}


class Known(Protocol):
    """What a caller read already by the same rules (`snapshots.Snapshot`)."""

    @property
    def tracked(self) -> list[str]: ...
    @property
    def beads(self) -> dict[str, TrackedRow]: ...
    @property
    def ready(self) -> frozenset[str]: ...
    @property
    def blockers(self) -> dict[str, list[str]]: ...
    @property
    def target_types(self) -> dict[str, str]: ...
    @property
    def rigs(self) -> dict[str, str]: ...
    @property
    def cap(self) -> int: ...


KINDS = (
    "unknown",
    "not-slingable",
    "paused",
    "blocked",
    "gated",
    "rig-parked",
    "rig-docked",
    "circuit-broken",
    "cooling-down",
    "waiting-for-capacity",
    "unknown-outcome",
    "working",
    "dead-worker",
    "ready",
    "waiting-to-merge",
)
WAITING_TO_MERGE = "waiting-to-merge"  # a closed bead's cause while it waits for its merge
LISTED = 20  # blocker ids named in a cause; `count` says how many there are
BY_ID = 64  # at most this many beads: their dead workers asked by id, not by a subquery


class BeadRow(NamedTuple):
    """The bead's own columns."""

    status: str
    issue_type: str
    assignee: str
    rig: str  # "" when it has none
    rig_state: str


class Pause(NamedTuple):
    convoy: str
    by: str
    at: datetime
    reason: str


@dataclass(slots=True)
class CauseFacts:
    """What the rules say about one bead; `load` fills it, tests may build it by hand."""

    bead_id: str
    row: BeadRow | None  # None: not in the store
    ready: bool = False  # the readiness rule
    blockers: list[str] = field(default_factory=list)  # unfinished blockers that are work
    gates: list[str] = field(default_factory=list)  # unfinished blockers that are not work
    paused: list[Pause] = field(default_factory=list)  # the paused convoys tracking it
    failures: int = 0  # failed dispatches in a row, when the breaker parked it (else 0)
    last_error: str = ""
    cooling_until: datetime | None = None
    capacity: dict[str, Any] | None = None  # {"scope": "convoy"|"town", "position": n, …}
    worker_seen: datetime | None = None
    worker_dead: bool = False
    dead_since: datetime | None = None
    rescue_by: datetime | None = None  # the latest the next stranded scan runs
    unanswered: datetime | None = None  # when its worker's claim was made, with no outcome yet
    feeders: list[str] = field(default_factory=list)  # open, unpaused convoys that feed it
    staged: list[str] = field(default_factory=list)  # staged convoys tracking it


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:5])
    return shown + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def decide(facts: CauseFacts) -> Cause:
    """The cause of one bead that is not done: {"kind": …, "text": …, …details}."""
    row = facts.row
    if row is None:
        return {"kind": "unknown", "text": "not in the store"}
    if (row.issue_type or "") not in SLINGABLE_TYPES:
        return {
            "kind": "not-slingable",
            "reason": "type",
            "issue_type": row.issue_type,
            "text": f'type "{row.issue_type}" is never dispatched',
        }
    if row.status not in ("open", *ACTIVE_WORK_STATUSES):
        return {
            "kind": "not-slingable",
            "reason": "status",
            "status": row.status,
            "text": f'status "{row.status}": not dispatched until it is open',
        }
    if row.status != "open" and not row.assignee:
        return {
            "kind": "not-slingable",
            "reason": "status",
            "status": row.status,
            "text": f'status "{row.status}" with nobody assigned',
        }
    if not row.rig:
        return {
            "kind": "not-slingable",
            "reason": "no-rig",
            "text": "no rig: its id's prefix routes to none",
        }
    # A pause stops new dispatches, not work under way: a live worker's bead is working.
    held = row.status in ACTIVE_WORK_STATUSES and bool(row.assignee) and not facts.ready
    if facts.paused and not held:
        first = facts.paused[0]
        return {
            "kind": "paused",
            "convoys": [p.convoy for p in facts.paused],
            "by": first.by,
            "at": first.at,
            "reason": first.reason,
            "text": f"convoy {first.convoy} paused by {person(first.by) or 'someone'}"
            + (f": {first.reason}" if first.reason else ""),
        }
    if facts.blockers:
        return {
            "kind": "blocked",
            "blockers": facts.blockers[:LISTED],
            "count": len(facts.blockers),
            "text": f"blocked by {_ids(facts.blockers)}",
        }
    if facts.gates:
        return {
            "kind": "gated",
            "gates": facts.gates[:LISTED],
            "count": len(facts.gates),
            "text": f"gated by {_ids(facts.gates)}",
        }
    if row.rig_state in (Rig.PARKED, Rig.DOCKED):
        return {
            "kind": f"rig-{row.rig_state}",
            "rig": row.rig,
            "text": f"rig {row.rig} is {row.rig_state}",
        }
    if facts.failures:
        return {
            "kind": "circuit-broken",
            "failures": facts.failures,
            "last_error": facts.last_error,
            "text": f"parked: dispatch failed {facts.failures} times in a row; a retry clears it",
        }
    if facts.ready and facts.cooling_until is not None:
        return {
            "kind": "cooling-down",
            "until": facts.cooling_until,
            "last_error": facts.last_error,
            "text": "a dispatch failed: tried again after the cooldown",
        }
    if facts.ready and facts.capacity:
        return {"kind": "waiting-for-capacity", **facts.capacity}
    if not facts.ready and facts.unanswered is not None:
        return {
            "kind": "unknown-outcome",
            "worker": row.assignee,
            "since": facts.unanswered,
            "text": f"claimed for {row.assignee}: no outcome of its dispatch recorded yet (the "
            "dispatcher's answer or the worker's first heartbeat confirms it; else the "
            "catch-up releases it)",
        }
    if not facts.ready:
        # Readiness refuses it and none of the above holds: a live worker has it.
        return {
            "kind": "working",
            "worker": row.assignee,
            "status": row.status,
            "last_seen": facts.worker_seen,
            "text": f"{row.assignee} is on it",
        }
    if row.assignee:
        return {
            "kind": "dead-worker",
            "worker": row.assignee,
            "last_seen": facts.worker_seen,
            "dead_since": facts.dead_since,
            "rescue_by": facts.rescue_by,
            "text": f"{row.assignee} went silent: a stranded scan rescues it (one bead per convoy per scan)",
        }
    if facts.feeders:
        text = "the next feed takes it"
    elif facts.staged:
        text = f"convoy {facts.staged[0]} is staged: launch it (or sling the bead)"
    else:
        text = "no open convoy feeds it: sling it"
    return {"kind": "ready", "convoys": facts.feeders, "text": text}


def word(kind: str) -> str:
    """ "waiting-for-capacity" -> "waiting for capacity"."""
    return kind.replace("-", " ")


def counts(
    causes: Mapping[str, Mapping[str, Any] | None] | Iterable[Mapping[str, Any] | None],
) -> list[tuple[str, int]]:
    """[(kind, n)] in the order kinds are decided, for the causes given (a dict or list)."""
    values = causes.values() if isinstance(causes, Mapping) else causes
    return counted_of(Counter(c["kind"] for c in values if c))


def counted_of(found: Mapping[str, int]) -> list[tuple[str, int]]:
    """[(kind, n)] in the order kinds are decided, from {kind: n} (the read model's counts)."""
    return [(kind, found[kind]) for kind in KINDS if found.get(kind)]


counted = counts


def summary(
    causes: Mapping[str, Mapping[str, Any] | None] | Iterable[Mapping[str, Any] | None],
) -> str:
    """ "3 blocked, 1 gated, 2 working" ("" when every bead is done)."""
    return _said(counts(causes))


def summary_of(found: Mapping[str, int]) -> str:
    """`summary` from {kind: n} (the read model's counts of a wave)."""
    return _said(counted_of(found))


def _said(pairs: Iterable[tuple[str, int]]) -> str:
    return ", ".join(f"{n} {word(kind)}" for kind, n in pairs)


def _read_rows(beads: QuerySet[Bead]) -> tuple[dict[str, tuple[BeadRow, datetime]], set[str]]:
    """({id: (BeadRow, updated_at)} of the unfinished beads, the ids of the done ones)."""
    rows, done = {}, set()
    for r in beads.values_list(
        "id", "status", "issue_type", "assignee", "rig_id", "rig__state", "updated_at"
    ):
        if r[1] in DONE_STATUSES or r[1] == merging.SUBMITTED:
            done.add(r[0])
        else:
            rows[r[0]] = (BeadRow(r[1], r[2], r[3], r[4] or "", r[5] or ""), r[6])
    return rows, done


def _known_rows(
    beads: Mapping[str, TrackedRow], states: Mapping[str, str]
) -> tuple[dict[str, tuple[BeadRow, datetime]], set[str]]:
    """The same from rows and rig states read already."""
    rows, done = {}, set()
    for bead_id, b in beads.items():
        if b.status in DONE_STATUSES or b.status == merging.SUBMITTED:
            done.add(bead_id)
        else:
            rig = b.rig_id or ""
            row = BeadRow(
                b.status, b.issue_type, b.assignee, rig, states.get(rig, "") if rig else ""
            )
            rows[bead_id] = (row, b.updated_at)
    return rows, done


class Causes(dict[str, "Cause"]):
    """{bead id: cause}, and `blockers`: every unfinished blocker of those beads, named by a
    cause or not (a paused bead's blockers too). `limited`: a max in flight (a convoy's or the
    town's) applied, so a dispatch anywhere in a queue may move every position in it."""

    blockers: frozenset[str] = frozenset()
    limited: bool = False


@dataclass(frozen=True)
class Read:
    """What a caller read by the same rules (`Known`): the rows of some beads, the rule sets
    whole (the projection's derivation)."""

    tracked: list[str]
    beads: dict[str, TrackedRow]
    ready: frozenset[str]
    blockers: dict[str, list[str]]
    target_types: dict[str, str]
    rigs: dict[str, str]
    cap: int


def outside_blockers(causes: Causes, tracked: Iterable[str], limit: int = 200) -> list[str]:
    """The unfinished blockers and gates of the beads that `tracked` does not hold: a page
    showing the causes watches them, as their close changes a cause. At most `limit`."""
    return sorted(set(causes.blockers) - set(tracked))[:limit]


def watch_kinds(causes: Mapping[str, Cause | None]) -> list[str]:
    """The event kinds a page showing these causes must hear of from other convoys: the town
    queue's (a slot taken or freed), while a bead waits in it."""
    town = any(c and c.get("scope") == "town" for c in causes.values())
    return sorted(PROGRESS_KINDS) if town else []


def jsonable(cause: Cause | None) -> Cause | None:
    """The cause with times as RFC 3339 text (for JSON writers without an encoder)."""
    if cause is None:
        return None
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in cause.items()}


# --- loading ---------------------------------------------------------------------------------
def for_convoy(convoy: Convoy, now: datetime | None = None, known: Known | None = None) -> Causes:
    """{bead id: cause} for the beads `convoy` tracks that are not done (unknown ids too).
    `known`: what the caller read of them already (see `load`)."""
    tracked = TrackedBead.objects.filter(convoy=convoy)
    ids = known.tracked if known is not None else tracked.values_list("bead_id", flat=True)
    return load(list(ids), tracked.values("bead_id"), now, known)


def for_bead(bead_id: str, now: datetime | None = None) -> Cause | None:
    """The cause of one bead, or None when it is done."""
    return load([bead_id], [bead_id], now).get(bead_id)


def load(
    bead_ids: Sequence[str],
    selection: Any,
    now: datetime | None = None,
    known: Known | None = None,
    queues: bool = True,
) -> Causes:
    """`Causes` {bead id: cause} for those of `bead_ids` (in that order) that are not done.
    Without `queues` the capacity queues are not asked (a bead past the free slots is
    "ready"): what the read model keeps per bead, for the pages to ask the queues of.
    `selection` selects the same ids in queries: a values() subquery for many beads, the list
    for a few. Twelve or thirteen queries whatever the number of beads (four more when a
    convoy tracking them has a max in flight, and the capacity module's with a town cap).

    `known`, when the caller has read them by the same rules (a convoy page's snapshot): an
    object with `beads` {id: row with status, issue_type, assignee, rig_id, updated_at},
    `ready` (ids), `blockers` {id: unfinished blocker ids} and `target_types` {blocker id:
    issue type}; then five queries fewer."""
    now = now or timezone.now()
    beads = Bead.objects.filter(pk__in=selection)
    if known is None:
        rows, done = _read_rows(beads)
    else:
        rows, done = _known_rows(known.beads, known.rigs)
    wanted = [i for i in dict.fromkeys(bead_ids) if i not in done]
    result = Causes()
    submitted = _waiting_to_merge([i for i in dict.fromkeys(bead_ids) if i in done])
    if not wanted:
        result.update(submitted)
        return result
    unfinished = beads.exclude(status__in=DONE_STATUSES)
    ready, blocking, not_work = _readiness(unfinished, now, known)
    dead, seen, selected = _workers(wanted, rows, unfinished, now)
    # Cooling down or parked (the feeders skip them): only open beads nobody holds can be.
    recent = _held_back([i for i, (r, _) in rows.items() if r.status == "open"], now)
    parked = parked_among(sorted(recent)) if recent else {}
    last_failure = _last_failures(recent)
    unanswered = _unanswered()
    cooldown = timedelta(seconds=settings.CONVOY_RETRY_COOLDOWN)
    timeout = timedelta(seconds=settings.CONVOY_WORKER_TIMEOUT)
    rescue_by = now + timedelta(seconds=settings.CONVOY_STRANDED_INTERVAL)

    facts = {}
    for bead_id in wanted:
        if bead_id not in rows:
            facts[bead_id] = CauseFacts(bead_id, None)
            continue
        row, updated_at = rows[bead_id]
        blockers = blocking.get(bead_id, [])
        failed_at, error = last_failure.get(bead_id, (None, ""))
        worker_seen = seen.get(row.assignee) if row.assignee else None
        is_dead = bead_id in dead
        facts[bead_id] = CauseFacts(
            bead_id,
            row,
            ready=bead_id in ready,
            blockers=[b for b in blockers if b not in not_work],
            gates=[b for b in blockers if b in not_work],
            failures=parked.get(bead_id, 0),
            last_error=error,
            cooling_until=failed_at + cooldown if failed_at and bead_id not in parked else None,
            worker_seen=worker_seen,
            worker_dead=is_dead,
            # Readiness counts silence from the last heartbeat, else from the last update.
            dead_since=(worker_seen or updated_at) + timeout if is_dead else None,
            rescue_by=rescue_by if is_dead else None,
            unanswered=unanswered.get((bead_id, row.assignee)) if row.assignee else None,
        )
    capped = _with_convoys(facts, selected)
    town_capped = False
    if capped and queues:
        _convoy_capacity(facts, capped, done, now)
    if queues:
        town_capped = _town_capacity(facts, now, known.cap if known is not None else None)
    result.update((bead_id, decide(facts[bead_id])) for bead_id in wanted)
    _said_of_merges(result, wanted)
    result.update(submitted)
    result.blockers = frozenset(b for ids in blocking.values() for b in ids)
    result.limited = bool(capped) or town_capped
    return result


def _said_of_merges(result: dict[str, Cause], wanted: Sequence[str]) -> None:
    """Words the merges add to causes decided already: a blocker that is closed and waits only
    for its merge (`merge-blocks`) is named as such, and a bead whose change was abandoned
    says so (it needs work again)."""
    blocked = {i: c for i, c in result.items() if c["kind"] == "blocked"}
    if blocked:
        closed = Bead.objects.filter(pk=OuterRef("depends_on_id"), status="closed")
        edges = (
            Dependency.objects.filter(issue_id__in=list(blocked), type="merge-blocks")
            .filter(Exists(closed))
            .values_list("issue_id", "depends_on_id")
        )
        merging_of: dict[str, list[str]] = {}
        for issue_id, target in edges:
            if target in blocked[issue_id]["blockers"]:
                merging_of.setdefault(issue_id, []).append(target)
        for bead_id, targets in merging_of.items():
            cause = blocked[bead_id]
            cause["merging"] = sorted(targets)
            rest = [b for b in cause["blockers"] if b not in targets]
            waits = f"waits for {_ids(sorted(targets))} to merge"
            cause["text"] = f"blocked by {_ids(rest)}; {waits}" if rest else waits
    abandoned = Merge.objects.filter(bead_id__in=list(wanted), state=Merge.ABANDONED)
    for bead_id, reason in abandoned.values_list("bead_id", "reason"):
        if bead_id in result:
            why = reason or "closed without merge"
            result[bead_id]["abandoned"] = why
            result[bead_id]["text"] += f" (its change was abandoned: {why})"


def _waiting_to_merge(closed: Sequence[str]) -> dict[str, Cause]:
    """The cause of each of the `closed` beads that waits for its merge: its change, and
    since when (`since`, its close) (one to three queries)."""
    waiting = sorted(merging.awaiting_among(closed)) if closed else []
    if not waiting:
        return {}
    changes = {m.bead_id: m for m in Merge.objects.filter(bead_id__in=waiting)}
    closed_at = dict(Bead.objects.filter(pk__in=waiting).values_list("id", "closed_at"))
    result: dict[str, Cause] = {}
    for bead_id in waiting:
        change = changes.get(bead_id)
        since = closed_at.get(bead_id)
        where = [p for p in (change.ref, change.branch) if p] if change else []
        if change and change.state == Merge.ABANDONED:
            text = f"its last change was abandoned: {change.reason or 'closed without merge'}"
        elif where:
            text = " ".join(where)
        else:
            text = "no change reported yet"
        cause: Cause = {"kind": WAITING_TO_MERGE, "text": text, "since": since}
        if change and change.link:
            cause["link"] = change.link
        result[bead_id] = cause
    return result


def _readiness(
    unfinished: QuerySet[Bead], now: datetime, known: Known | None
) -> tuple[AbstractSet[str], Mapping[str, list[str]], set[str]]:
    """(the ready ids, {id: its unfinished blockers}, the blockers that are not work): read by
    the readiness rules, or taken from `known`. A blocker that is not work (a decision, a
    gate) gates rather than blocks."""
    if known is not None:
        not_work = {t for t, kind in known.target_types.items() if kind not in SLINGABLE_TYPES}
        return known.ready, known.blockers, not_work
    ready = set(ready_beads(unfinished, now).values_list("pk", flat=True))
    blocking = blocked_by(unfinished.values_list("pk", flat=True))
    targets = Dependency.objects.filter(
        issue_id__in=unfinished.values("pk"), type__in=BLOCKING_DEP_TYPES
    ).values("depends_on_id")
    not_work = set(
        Bead.objects.filter(pk__in=targets)
        .exclude(issue_type__in=SLINGABLE_TYPES)
        .values_list("pk", flat=True)
    )
    return ready, blocking, not_work


def _workers(
    wanted: list[str], rows: Mapping[str, Any], unfinished: QuerySet[Bead], now: datetime
) -> tuple[set[str], dict[str, datetime], Any]:
    """(the beads whose worker counts as dead, {worker: last seen}, what selects the beads
    asked about in further queries): a few beads (a writer's) by id, many by a subquery."""
    if len(wanted) <= BY_ID:
        held = [i for i in wanted if i in rows and rows[i][0].assignee]
        names = sorted({rows[i][0].assignee for i in held})
        seen = dict(Worker.objects.filter(name__in=names).values_list("name", "last_seen"))
        return dead_among(held, now), seen, [i for i in wanted if i in rows]
    assigned = unfinished.exclude(assignee="")
    dead = set(assigned.filter(worker_dead(now)).values_list("pk", flat=True))
    workers = Worker.objects.filter(name__in=assigned.values("assignee"))
    return dead, dict(workers.values_list("name", "last_seen")), unfinished.values("pk")


def _last_failures(recent: AbstractSet[str]) -> dict[str, tuple[datetime | None, str]]:
    """{bead id: (when, error)} of the last failed dispatch of each of `recent`."""
    last_failure: dict[str, tuple[datetime | None, str]] = {}
    if recent:
        failed = Dispatch.objects.filter(bead_id__in=sorted(recent), ok=False)
        for bead_id, at, error in failed.order_by("bead_id", "-created_at").values_list(
            "bead_id", "created_at", "error"
        ):
            last_failure.setdefault(bead_id, (at, error))
    return last_failure


def _unanswered() -> dict[tuple[str, str], datetime]:
    """{(bead id, worker): when} of the claims with no outcome yet (few: what is in flight
    now, read through the dispatch table's partial index)."""
    claims = Dispatch.objects.filter(ok__isnull=True, resolution="")
    return {
        (bead_id, worker): at
        for bead_id, worker, at in claims.values_list("bead_id", "worker", "created_at")
    }


def _with_convoys(facts: Mapping[str, CauseFacts], selected: Any) -> dict[str, int]:
    """Adds to each bead's facts the convoys that track it (paused, feeding it, staged);
    returns {convoy id: max in flight} of the open convoys with a cap."""
    links = TrackedBead.objects.filter(bead_id__in=selected).values_list(
        "bead_id",
        "convoy_id",
        "convoy__status",
        "convoy__paused_at",
        "convoy__paused_by",
        "convoy__pause_reason",
        "convoy__max_in_flight",
    )
    capped = {}
    for bead_id, convoy_id, status, paused_at, by, reason, limit in links:
        item = facts.get(bead_id)
        if item is None or item.row is None:
            continue
        if paused_at:  # the claim refuses a bead any paused convoy tracks
            item.paused.append(Pause(convoy_id, by, paused_at, reason))
        elif status == CONVOY_OPEN:
            item.feeders.append(convoy_id)
            if limit:
                capped[convoy_id] = limit
        elif status in STAGED_STATUSES:
            item.staged.append(convoy_id)
    for item in facts.values():
        for listed in (item.paused, item.feeders, item.staged):
            if len(listed) > 1:
                listed.sort()
    return capped


def _held_back(bead_ids: Collection[str], now: datetime) -> set[str]:
    """Those of `bead_ids` the feeders skip now: a dispatch failed within the cooldown, or the
    breaker parked them (rules.breaker's rules: looked up by id for a few beads, by one
    range scan of the recent failures for many)."""
    if len(bead_ids) <= HELD_LOOKUP:
        return breaker.cooling_down(bead_ids, now) if bead_ids else set()
    return breaker.recent_failures(now) & set(bead_ids)


HELD_LOOKUP = 500


def _fresh(item: CauseFacts) -> bool:
    """A candidate for a new dispatch: ready, open, nobody on it, nothing holding it back."""
    row = item.row
    return (
        row is not None
        and item.ready
        and row.status == "open"
        and not row.assignee
        and not item.paused
        and not item.failures
        and item.cooling_until is None
    )


def _convoy_capacity(
    facts: dict[str, CauseFacts], capped: Any, done: set[str], now: datetime
) -> None:
    """Ready beads of a convoy at its max in flight wait: the claim refuses a new dispatch
    while the convoy's beads in flight reach the limit, and the feeder takes ready beads by
    (priority, id), so a bead's place in that order past the free slots is its position.
    Two queries whatever the number of beads (four more for members the caller did not ask
    about: a bead page of a capped convoy)."""
    rows = list(
        TrackedBead.objects.filter(convoy_id__in=list(capped)).values_list("convoy_id", "bead_id")
    )
    # In flight for the claim: the convoy's beads hooked or in progress.
    active = {
        b for b, item in facts.items() if item.row and item.row.status in ACTIVE_WORK_STATUSES
    }
    # New dispatches only: a dead worker's bead taken over is in flight already.
    fresh = {b for _, b in rows if b in facts and facts[b].row is not None and _fresh(facts[b])}
    outside = sorted({b for _, b in rows if b not in facts and b not in done})
    if outside:
        active |= set(
            Bead.objects.filter(pk__in=outside, status__in=ACTIVE_WORK_STATUSES).values_list(
                "pk", flat=True
            )
        )
        ready = set(
            ready_beads(Bead.objects.filter(pk__in=outside), now)
            .filter(status="open", assignee="")
            .values_list("pk", flat=True)
        )
        paused = set(
            TrackedBead.objects.filter(
                bead_id__in=sorted(ready), convoy__paused_at__isnull=False
            ).values_list("bead_id", flat=True)
        )
        fresh |= ready - paused - _held_back(sorted(ready), now)
    priority = dict(Bead.objects.filter(pk__in=sorted(fresh)).values_list("pk", "priority"))
    queues: dict[str, list[str]] = {}
    busy: dict[str, int] = {}
    for convoy_id, bead_id in rows:
        if bead_id in fresh:
            queues.setdefault(convoy_id, []).append(bead_id)
        elif bead_id in active:
            busy[convoy_id] = busy.get(convoy_id, 0) + 1
    for convoy_id, limit in sorted(capped.items()):
        queue = sorted(queues.get(convoy_id, []), key=lambda b: (priority.get(b, 0), b))
        in_flight = busy.get(convoy_id, 0)
        free = max(limit - in_flight, 0)
        for position, bead_id in enumerate(queue[free:], start=1):
            item = facts.get(bead_id)
            if item is None or item.capacity is not None:
                continue
            item.capacity = {
                "scope": "convoy",
                "convoy": convoy_id,
                "position": position,
                "queued": len(queue) - free,
                "in_flight": in_flight,
                "cap": limit,
                "text": f"convoy {convoy_id} runs at most {limit} at once ({in_flight} in "
                f"flight): {_ordinal(position)} of {len(queue) - free} in its queue",
            }


def _town_capacity(facts: dict[str, CauseFacts], now: datetime, cap: int | None = None) -> bool:
    """Ready beads past the town's free slots (CONVOY_MAX_IN_FLIGHT) wait in the town queue
    (rules.capacity: priority, then round-robin across convoys, then id). Nothing to read
    without a cap; with one, the capacity module's queries, whatever the number of beads.
    Whether the town has a cap (`cap`, when the caller read it)."""
    if not (capacity.cap() if cap is None else cap):
        return False
    snap = capacity.snapshot(now)
    waiting = snap.waiting
    for queued in waiting:
        item = facts.get(queued.bead_id)
        if item is None or item.capacity is not None:
            continue
        item.capacity = {
            "scope": "town",
            "position": queued.position,
            "queued": len(waiting),
            "in_flight": snap.in_flight,
            "cap": snap.cap,
            "text": f"the town runs at most {snap.cap} at once ({snap.in_flight} in flight): "
            f"{_ordinal(queued.position)} of {len(waiting)} in the town queue",
        }
    return True


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# --- town-wide counts (the metrics) ----------------------------------------------------------
def town_counts(now: datetime | None = None) -> dict[str, int]:
    """{cause kind: beads} over the unfinished beads the open convoys track, each counted
    once: `decide`'s ladder as one aggregate query over the rows and the kept read model
    (`BeadFacts`: readiness, blockers, cooldown), plus one for ids not in the store. Cheap at
    any size (no bead is read into Python), at the price of two simplifications: a bead
    waiting for capacity counts as "ready" (its queue position needs the capacity queue), and
    a pause counts for any bead a live worker does not hold."""
    now = now or timezone.now()
    tracked = TrackedBead.objects.filter(convoy__status=CONVOY_OPEN)
    facts = BeadFacts.objects.filter(bead_id=OuterRef("pk"))
    # An unfinished blocker that is work (`history.target_blocks`): blocked, not gated.
    work = Bead.objects.filter(pk=OuterRef("depends_on_id"), issue_type__in=SLINGABLE_TYPES)
    plain = Dependency.objects.filter(
        issue=OuterRef("pk"), type__in=[t for t in BLOCKING_DEP_TYPES if t != "merge-blocks"]
    ).filter(Exists(work.exclude(status__in=DONE_STATUSES)))
    merge = Dependency.objects.filter(issue=OuterRef("pk"), type="merge-blocks").filter(
        Exists(
            work.filter(~Q(status__in=DONE_STATUSES) | (Q(status="closed") & ~merging.merged_q()))
        )
    )
    paused = TrackedBead.objects.filter(bead_id=OuterRef("pk"), convoy__paused_at__isnull=False)
    beads = (
        Bead.objects.filter(pk__in=tracked.values("bead_id"))
        .exclude(status__in=DONE_STATUSES)
        .annotate(
            is_ready=Exists(facts.filter(ready=True)),
            is_blocked=Exists(facts.filter(open_blockers__gt=0)),
            cooling=Exists(facts.filter(cooldown_until__gt=now)),
            is_paused=Exists(paused),
        )
    )
    held = Q(status__in=ACTIVE_WORK_STATUSES) & ~Q(assignee="") & Q(is_ready=False)
    ladder = Case(
        When(~Q(issue_type__in=SLINGABLE_TYPES), then=Value("not-slingable")),
        When(~Q(status__in=("open", *ACTIVE_WORK_STATUSES)), then=Value("not-slingable")),
        When(~Q(status="open") & Q(assignee=""), then=Value("not-slingable")),
        When(rig__isnull=True, then=Value("not-slingable")),
        When(Q(is_paused=True) & ~held, then=Value("paused")),
        When(Q(is_blocked=True) & (Exists(plain) | Exists(merge)), then=Value("blocked")),
        When(is_blocked=True, then=Value("gated")),
        When(rig__state=Rig.PARKED, then=Value("rig-parked")),
        When(rig__state=Rig.DOCKED, then=Value("rig-docked")),
        When(dispatch_failures__gte=breaker.max_failures(), then=Value("circuit-broken")),
        When(Q(is_ready=True) & Q(cooling=True), then=Value("cooling-down")),
        When(is_ready=False, then=Value("working")),
        When(~Q(assignee=""), then=Value("dead-worker")),
        default=Value("ready"),
        output_field=CharField(),
    )
    found = dict.fromkeys((k for k in KINDS if k != "waiting-for-capacity"), 0)
    rows = beads.annotate(cause=ladder).values("cause").annotate(n=Count("pk"))
    for row in rows.values_list("cause", "n"):
        found[row[0]] += row[1]
    found["unknown"] = (
        tracked.exclude(bead_id__in=Bead.objects.values("pk")).values("bead_id").distinct().count()
    )
    return found
