"""What a convoy page reads per bead, kept per event sequence number and carried forward by
the events after it, so that a live update re-reads only the beads its events touched.

The convoy page (`selectors.convoy_page`) is derived from a `Snapshot` by the same code for a
full render and for a live update; only where the snapshot comes from differs:
- `load(convoy, now)` reads everything (a page that is not live always does);
- `advance(snapshot, changes, now)` copies the snapshot the live page was drawn from and
  re-reads, through the same loaders and the one readiness rule, the beads the events named
  and the tracked beads they block. It gives up (None: load afresh) when the events may have
  changed more than bead rows: dependencies, tracking, staging, rigs and routes, imports, any
  kind it does not know, more events than `changes_since` lists; or when time alone may have
  changed a bead's readiness since the snapshot was read (a worker timing out; a dead
  worker's bead, which a heartbeat may revive without an event).
Snapshots live in a small per-process cache keyed by (convoy, seq); a process without the one
a live page asks from loads afresh. What changes with time or without an event (workers'
heartbeats, dispatch cooldowns, rig states, the timeline, the ETA's samples) is not in the
snapshot: the page reads it on every request.
"""

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings

from .dag import EXECUTION_TYPES
from .kinds import FAILED_KINDS, ROW_KINDS
from .models import (
    ACTIVE_WORK_STATUSES,
    SLINGABLE_TYPES,
    Bead,
    Convoy,
    Dependency,
    Rig,
    TrackedBead,
    Worker,
)
from .readiness import blocked_by, ready_among, ready_beads
from .rows import (
    Changes,
    Edge,
    TrackedRow,
    changes_since,
    failed_among,
    failed_beads,
    read_rows,
    tracked_beads,
)
from .services import capacity

T = TypeVar("T")
Gate = tuple[str, str, str, str]  # (id, title, issue type, status)

# The per-process cache is bounded by bytes (CONVOY_PAGE_CACHE_MB), estimated per snapshot from
# its beads and edges: a snapshot with what pages derive from it holds about 3.3-4.2 kB a bead
# (measured with tracemalloc at 1,000 and 10,000 beads; bench/bounded.py). One bigger than
# the whole budget is used for its page and not kept.
BYTES_PER_BEAD = 4096
BYTES_PER_EDGE = 256
MEMOS = 16  # derived values kept per line of carried snapshots
KEEP_PER_CONVOY = 4  # pages of one convoy catch up to the newest seq within a second or two


@dataclass(frozen=True)
class Snapshot:
    convoy_id: str
    tracked: list[str]  # tracked bead ids in position order
    beads: dict[str, TrackedRow]
    edges: list[Edge]  # (issue, target, type) of every dependency of a tracked bead
    gates: list[Gate]  # untracked gates that hold tracked beads
    ready: frozenset[str]  # tracked beads ready by the one rule
    failed: frozenset[str]  # tracked beads whose last dispatch failed
    blockers: dict[str, list[str]]  # {tracked id: [unfinished blocker ids]}
    target_types: dict[str, str]  # {blocker id: issue type}
    valid_until: datetime  # no bead's readiness can change by time alone before this
    # Rig states and the town's cap: only a rig's or the cap's own event changes them (and a
    # snapshot is never carried across one).
    rigs: dict[str, str]  # {rig: state}
    cap: int  # CONVOY_MAX_IN_FLIGHT or its override; 0: none
    # What pages derive from it, kept with it (the graph); a carried snapshot starts with
    # its parent's graph and the beads it re-read ("from", "touched").
    derived: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def load(convoy: Convoy, now: datetime) -> Snapshot:
    """Everything, from the database."""
    tracked, beads, edges = tracked_beads(convoy)
    subset = Bead.objects.filter(pk__in=_tracking(convoy))
    ready = frozenset(ready_beads(subset, now).values_list("pk", flat=True))
    blockers = blocked_by(_tracking(convoy))
    snapshot = Snapshot(
        convoy_id=convoy.pk,
        tracked=tracked,
        beads=beads,
        edges=edges,
        gates=_gates(edges, beads),
        ready=ready,
        failed=frozenset(failed_beads(subset)),
        blockers=blockers,
        target_types=_types({t for ts in blockers.values() for t in ts}, beads),
        valid_until=_horizon(beads.values(), now),
        rigs=dict(Rig.objects.values_list("name", "state")),
        cap=capacity.cap(),
    )
    dependents_of(snapshot)  # what a live update carrying it forward looks up
    return snapshot


def load_window(convoy: Convoy, bead_ids: list[str], now: datetime) -> Snapshot:
    """What a page drawing only `bead_ids` of a big convoy reads: the same, for those beads
    (their rows, dependencies, readiness, blockers), by id. Never kept: an overview page
    reads its window afresh each time, from the kept read model and these rows."""
    beads = read_rows(Bead.objects.filter(pk__in=bead_ids))
    edges = list(
        Dependency.objects.filter(issue_id__in=bead_ids)
        .order_by("issue_id", "depends_on_id")
        .values_list("issue_id", "depends_on_id", "type")
    )
    subset = Bead.objects.filter(pk__in=bead_ids)
    blockers = blocked_by(bead_ids)
    return Snapshot(
        convoy_id=convoy.pk,
        tracked=bead_ids,
        beads=beads,
        edges=edges,
        gates=_gates(edges, beads),
        ready=frozenset(ready_beads(subset, now).values_list("pk", flat=True)),
        failed=frozenset(failed_beads(subset)),
        blockers=blockers,
        target_types=_types({t for ts in blockers.values() for t in ts}, beads),
        valid_until=now,
        rigs=dict(Rig.objects.values_list("name", "state")),
        cap=capacity.cap(),
    )


def advance(snapshot: Snapshot, changes: Changes | None, now: datetime) -> Snapshot | None:
    """`snapshot` carried forward over `changes` (rows.Changes of the events after it),
    or None when only a fresh load is sure to be right."""
    if changes is None or changes.dependencies or not changes.kinds <= ROW_KINDS:
        return None
    if now >= snapshot.valid_until:
        return None
    named = changes.beads
    if not named:
        return replace(snapshot, derived=_carried(snapshot, set(), set(), changes))
    beads = snapshot.beads
    touched = {i for i in named if i in beads}
    # The tracked beads whose readiness a change of `named` may alter: those beads, and those
    # that depend on them (in the convoy or not: a blocker outside it counts too).
    dependents = dependents_of(snapshot)
    affected = touched | {issue for target in named for issue in dependents.get(target, ())}
    beads = dict(beads)
    beads.update(read_rows(Bead.objects.filter(pk__in=sorted(touched))))
    gates = snapshot.gates
    if any(t not in beads for t in named if t in dependents):  # a blocker outside the convoy
        gates = _gates(snapshot.edges, beads)
    ready = frozenset(ready_among(sorted(affected), now))
    failed = snapshot.failed
    if changes.kinds & FAILED_KINDS:  # a dispatch row was written, or a status changed
        failed = (failed - affected) | failed_among(sorted(affected))
    blockers, target_types = snapshot.blockers, snapshot.target_types
    if not changes.blockers_stand():
        blockers = dict(blockers)
        for bead_id in affected:
            blockers.pop(bead_id, None)
        blockers.update(blocked_by(sorted(affected)))
        targets = {t for ts in blockers.values() for t in ts}
        still = targets - named  # blockers whose type the parent read and no event changed
        known = {t: kind for t, kind in target_types.items() if t in still}
        target_types = known | _types(targets - known.keys(), beads)
    elif named & target_types.keys():  # a blocker's type may have changed
        target_types = dict(target_types) | _types(named & target_types.keys(), beads)
    return replace(
        snapshot,
        beads=beads,
        gates=gates,
        ready=(snapshot.ready - affected) | ready,
        failed=failed,
        blockers=blockers,
        target_types=target_types,
        # The untouched beads' workers may only have sent heartbeats since: their horizon
        # holds (a dead worker's bead would have stopped the carrying already).
        valid_until=min(snapshot.valid_until, _horizon([beads[i] for i in touched], now)),
        derived=_carried(snapshot, touched, affected, changes),
    )


def _carried(
    snapshot: Snapshot, touched: set[str], affected: set[str], changes: Changes
) -> dict[str, Any]:
    """What a snapshot carried forward from `snapshot` starts with: its graph to patch and the
    beads re-read ("from", "touched"), its memo, and for `carried` the values kept with it,
    the beads whose readiness or blockers may have changed and what the events changed."""
    derived = snapshot.derived
    return {
        "from": derived.get("graph"),
        "touched": touched,
        "memo": derived.get("memo", {}),  # keyed by what the values depend on
        "carried": derived.get("kept", {}),  # the values `carried` kept with the parent
        "affected": affected,
        "changes": changes,
    }


def obtain(
    convoy: Convoy,
    seq: int,
    now: datetime,
    since: int | None = None,
    changes: Changes | None = None,
    fresh: bool = False,
) -> Snapshot:
    """The snapshot for a page drawn at `seq`: carried forward from the one a live page was
    drawn from (`since`, over `changes`) when this process has it and may, else loaded.
    With CONVOY_RELOAD_FROM_KEPT a full render (no `since`) carries forward the newest
    snapshot this process keeps of the convoy the same way (a big convoy's reload then reads
    only what changed since), unless `fresh` (a hard reload: everything read afresh)."""
    if since is None and settings.CONVOY_RELOAD_FROM_KEPT and not fresh:
        with _lock:
            seqs = [k[2] for k in _cache if k[:2] == (convoy.pk, convoy.created_at)]
        if seqs and max(seqs) <= seq:
            since = max(seqs)
            changes = changes_since(since, seq)
    snapshot = None
    # The convoy's creation time in the key: a database reset (tests, `demo --reset`) may
    # bring back the same id and sequence numbers.
    if since is not None:
        with _lock:
            previous = _cache.get((convoy.pk, convoy.created_at, since))
        if previous is not None:
            snapshot = advance(previous, changes, now)
    if snapshot is None:
        snapshot = load(convoy, now)
    key = (convoy.pk, convoy.created_at, seq)
    budget = settings.CONVOY_PAGE_CACHE_MB * 2**20
    with _lock:
        _cache[key] = snapshot
        _cache.move_to_end(key)
        mine = [k for k in _cache if k[:2] == key[:2]]
        for old in sorted(mine, key=lambda k: k[2])[:-KEEP_PER_CONVOY]:
            del _cache[old]
        while _cache and sum(map(cost, _cache.values())) > budget:
            _cache.popitem(last=False)  # the least recently used first; maybe this one
    return snapshot


def cost(snapshot: Snapshot) -> int:
    """The bytes a kept snapshot is estimated to hold (BYTES_PER_BEAD)."""
    return BYTES_PER_BEAD * len(snapshot.beads) + BYTES_PER_EDGE * len(snapshot.edges)


def held() -> int:
    """The estimated bytes of every snapshot this process keeps."""
    with _lock:
        return sum(map(cost, _cache.values()))


def kept(convoy: Convoy, seq: int) -> Snapshot | None:
    """The snapshot kept for a page of `convoy` drawn at `seq`, or None."""
    with _lock:
        return _cache.get((convoy.pk, convoy.created_at, seq))


def graph_of(
    snapshot: Snapshot, build: Callable[[], T], patch: Callable[[T, set[str]], T | None]
) -> T:
    """The snapshot's graph, made once: `patch(parent's graph, touched ids)` when it was
    carried forward (None: cannot), else `build()`."""
    derived = snapshot.derived
    with _lock:
        graph = derived.get("graph")
        parent, touched = derived.get("from"), derived.get("touched", ())
    if graph is None:
        graph = (patch(parent, touched) if parent is not None else None) or build()
        with _lock:
            derived["graph"] = graph
            derived.pop("from", None)  # the parent's graph may go
    return graph


def carried(
    snapshot: Snapshot,
    name: str,
    carry: Callable[[T, set[str], Changes], T | None],
    build: Callable[[], T],
) -> T:
    """The snapshot's value `name`: `carry(the value of the snapshot it was carried from, the
    beads whose readiness or blockers its events may have changed, the rows.Changes of those
    events)` (None: cannot), else `build()`. Kept for the snapshots carried from this one; a
    second call for this snapshot carries from the parent's value again (what time changes,
    a cooldown running out, is read again)."""
    derived = snapshot.derived
    with _lock:
        previous = derived.get("carried", {}).get(name)
        affected, changes = derived.get("affected"), derived.get("changes")
    value = None
    if previous is not None and affected is not None and changes is not None:
        value = carry(previous, affected, changes)
    if value is None:
        value = build()
    with _lock:
        derived["kept"] = {**derived.get("kept", {}), name: value}
    return value


def memo(snapshot: Snapshot, key: Any, objects: Any, compute: Callable[[], T]) -> T:
    """`compute()` once per `key` and graph structure (`objects`: what the value depends on
    besides `key`, e.g. the graph's edges and its waves), kept with the snapshot and the
    snapshots carried forward from it, which share their graph's structure."""
    objects = objects if isinstance(objects, tuple) else (objects,)
    memos = snapshot.derived.setdefault("memo", {})
    full = (key, *map(id, objects))
    with _lock:
        found = memos.get(full)
    # The same objects, not new ones at a reused address:
    if found is not None and all(a is b for a, b in zip(found[0], objects, strict=True)):
        kept_value: T = found[1]
        return kept_value
    value = compute()
    with _lock:
        if len(memos) >= MEMOS:
            memos.clear()
        memos[full] = (objects, value)
    return value


def forget() -> None:
    """Drop every kept snapshot (tests that write rows without events)."""
    with _lock:
        _cache.clear()


_cache: OrderedDict[tuple[str, datetime, int], Snapshot] = OrderedDict()
_lock = threading.Lock()


def dependents_of(snapshot: Snapshot) -> dict[str, list[str]]:
    """{target: [the tracked beads whose dependency names it]}, made once per edge list."""

    def index() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for issue, target, _ in snapshot.edges:
            out.setdefault(target, []).append(issue)
        return out

    return memo(snapshot, "dependents", snapshot.edges, index)


def _tracking(convoy: Convoy) -> Any:
    return TrackedBead.objects.filter(convoy=convoy).values("bead_id")


def _gates(edges: list[Edge], beads: dict[str, TrackedRow]) -> list[Gate]:
    """Untracked non-slingable blockers (a decision): the page draws and names them."""
    outside = {t for _, t, kind in edges if t not in beads and kind in EXECUTION_TYPES}
    if not outside:
        return []
    rows = Bead.objects.filter(pk__in=sorted(outside)).exclude(issue_type__in=SLINGABLE_TYPES)
    return list(rows.values_list("id", "title", "issue_type", "status"))


def _types(ids: Iterable[str], beads: dict[str, TrackedRow]) -> dict[str, str]:
    """{id: issue type}: from `beads` (the rows re-read) where they hold the id, else read."""
    known = {i: beads[i].issue_type for i in ids if i in beads}
    rest = sorted(set(ids) - known.keys())
    if rest:
        known.update(Bead.objects.filter(pk__in=rest).values_list("id", "issue_type"))
    return known


def _horizon(rows: Iterable[TrackedRow], now: datetime) -> datetime:
    """When time alone may next change a bead's readiness: an assigned, unfinished bead is
    ready once its worker has been silent CONVOY_WORKER_TIMEOUT (readiness.worker_dead), and
    no longer ready after a heartbeat (no event). `now` when a worker is dead already."""
    timeout = timedelta(seconds=settings.CONVOY_WORKER_TIMEOUT)
    held = [r for r in rows if r.assignee and r.status in ("open", *ACTIVE_WORK_STATUSES)]
    if not held:
        return datetime.max.replace(tzinfo=now.tzinfo)
    seen = dict(
        Worker.objects.filter(name__in={r.assignee for r in held}).values_list("name", "last_seen")
    )
    first = min((seen[r.assignee] if r.assignee in seen else r.updated_at) for r in held)
    return max(first + timeout, now)
