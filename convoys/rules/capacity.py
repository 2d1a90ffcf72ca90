"""Town-wide capacity: at most `cap()` beads in flight across all convoys.

The cap is CONVOY_MAX_IN_FLIGHT (0 = unlimited, the default) unless an operator set one at
run time (`convoy capacity --set N`, a TownSetting row written by `controls.set_cap`;
`--unset` goes back to the environment's). It is read at every use, so the next event in every
process obeys a change, with no restart; raising it feeds the town at once.

In flight is derived from rows each time, never kept in a counter that could drift: a bead is
in flight while it is hooked or in progress, its assignee is the worker one of our dispatches
named (imported work somebody else assigned is not ours to count), and that worker is alive
(readiness.worker_dead). A claim that committed and whose process was killed keeps its slot
until the claim is released or its worker is found dead; nothing else has to be repaired.

Waiting beads form one queue (`queue()`): the ready beads of open, unpaused convoys (not
cooling down, not parked, within their convoy's own max_in_flight), ordered by priority, then
round-robin across convoys (each convoy's first bead before anyone's second; among those, the
convoy whose last dispatch is oldest goes first, so no convoy starves another), then id. The
first `free` of them take the free slots at the next feed; the rest wait for capacity, and
`queue_positions()` numbers them 1, 2, … (1 = the next to go when a slot frees).

Race freedom: `dispatch.claim` calls `lock_town()` before anything else and counts the beads
in flight in the same transaction as its conditional UPDATE. On PostgreSQL the lock is a
transaction-level advisory lock (every claim of the town takes it, then reads committed rows);
SQLite runs write transactions one at a time (IMMEDIATE), which gives the same order.
"""

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, Max, OuterRef, QuerySet
from django.utils import timezone

from convoys.log.kinds import NOTE_KINDS
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    CONVOY_OPEN,
    Bead,
    Convoy,
    Dispatch,
    TownSetting,
    TrackedBead,
)
from convoys.rules.breaker import recent_failures
from convoys.rules.readiness import ready_beads, worker_dead
from convoys.rules.rows import Changes

# pg_advisory_xact_lock key: "conv" "cap" as two 32-bit halves, fixed for every process.
LOCK_KEY = 0x636F6E76_00636170
NEVER = datetime.min.replace(tzinfo=UTC)
SETTING = "max-in-flight"
CAP_LIMIT = 1_000_000
# The bead fields `panel()` reads: the count in flight reads status and assignee; with a cap,
# the queue reads readiness (type, rig), its order (priority) and its rows' titles too.
COUNTED_FIELDS = frozenset({"status", "assignee"})
QUEUED_FIELDS = COUNTED_FIELDS | {"title", "priority", "issue_type", "rig", "rig_id"}


@dataclass(frozen=True)
class CapOrigin:
    """Where the cap comes from: "override" (a row an operator set: who, when) or
    "CONVOY_MAX_IN_FLIGHT" (the environment)."""

    source: str
    set_by: str = ""
    set_at: datetime | None = None


def cap() -> int:
    """The town's cap on beads in flight; 0 means unlimited."""
    override = TownSetting.objects.filter(pk=SETTING).values_list("value", flat=True).first()
    limit: int = settings.CONVOY_MAX_IN_FLIGHT if override is None else override
    return max(limit, 0)


def cap_source() -> tuple[int, CapOrigin]:
    """(cap, where it comes from): the override's row, or the environment."""
    row = TownSetting.objects.filter(pk=SETTING).first()
    if row is None:
        limit: int = settings.CONVOY_MAX_IN_FLIGHT
        return max(limit, 0), CapOrigin("CONVOY_MAX_IN_FLIGHT")
    return row.value, CapOrigin("override", set_by=row.set_by, set_at=row.set_at)


def lock_town() -> None:
    """Serialise claims town-wide until the current transaction ends (PostgreSQL advisory
    lock; a no-op on SQLite, whose IMMEDIATE transactions already run one at a time). Taken
    before any row lock a claim takes, so it never waits inside a lock cycle."""
    if connection.vendor == "postgresql" and connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])


def in_flight_beads(now: datetime | None = None) -> QuerySet[Bead]:
    """The beads in flight: hooked or in progress, held by the worker our dispatch named,
    and that worker not dead."""
    ours = Dispatch.objects.filter(bead_id=OuterRef("pk"), worker=OuterRef("assignee")).exclude(
        ok=False
    )
    return (
        Bead.objects.filter(status__in=ACTIVE_WORK_STATUSES)
        .exclude(assignee="")
        .filter(Exists(ours))
        .exclude(worker_dead(now))
    )


def in_flight(now: datetime | None = None) -> int:
    return in_flight_beads(now).count()


def town_full(
    bead_id: str, now: datetime | None = None, limit: int | None = None
) -> tuple[int, int] | None:
    """(in flight, cap) when the town has no slot for `bead_id`, else None. Inside a claim,
    after `lock_town()`. The bead itself is not counted (a dead worker's bead taken over)."""
    limit = cap() if limit is None else limit
    if not limit:
        return None
    busy = in_flight_beads(now).exclude(pk=bead_id).count()
    return (busy, limit) if busy >= limit else None


def refusal_text(full: tuple[int, int]) -> str:
    busy, limit = full
    return f"town at capacity ({busy} in flight, cap {limit}): waiting for a free slot"


@dataclass
class Queued:
    bead: Bead
    convoy_id: str
    position: int = 0  # 1-based among the waiting; 0 while a free slot is there for it

    @property
    def bead_id(self) -> str:
        return self.bead.pk


@dataclass
class CapState:
    cap: int
    in_flight: int
    queue: list[Queued]  # every queued bead, in dispatch order

    @property
    def free(self) -> int:
        return max(self.cap - self.in_flight, 0) if self.cap else len(self.queue)

    @property
    def waiting(self) -> list[Queued]:
        """The queued beads no free slot is there for (all of them at capacity)."""
        return self.queue[self.free :] if self.cap else []

    def as_json(self) -> dict[str, Any]:
        return {
            "cap": self.cap,
            "in_flight": self.in_flight,
            "free": max(self.cap - self.in_flight, 0) if self.cap else None,
            "queued": len(self.waiting),
            "queue": [
                {
                    "position": q.position,
                    "id": q.bead_id,
                    "convoy": q.convoy_id,
                    "priority": q.bead.priority,
                    "title": q.bead.title,
                }
                for q in self.waiting
            ],
        }


def queue(now: datetime | None = None) -> list[Queued]:
    """Every bead that would be dispatched if the town had room, in dispatch order (module
    docstring). At most seven queries, whatever the number of convoys and beads."""
    now = now or timezone.now()
    convoys = {
        pk: limit
        for pk, limit in Convoy.objects.filter(
            status=CONVOY_OPEN, paused_at__isnull=True
        ).values_list("pk", "max_in_flight")
    }
    if not convoys:
        return []
    tracked = TrackedBead.objects.filter(convoy_id__in=convoys)
    beads = {
        b.pk: b
        for b in ready_beads(Bead.objects.filter(pk__in=tracked.values("bead_id")), now).only(
            "id", "title", "status", "assignee", "priority", "rig_id", "dispatch_failures"
        )
    }
    if not beads:
        return []
    skip = recent_failures(now)
    room: dict[str, int] = {}
    capped = [pk for pk, limit in convoys.items() if limit]
    if capped:
        busy = dict(
            tracked.filter(convoy_id__in=capped)
            .filter(bead_id__in=Bead.objects.filter(status__in=ACTIVE_WORK_STATUSES).values("pk"))
            .values("convoy_id")
            .annotate(n=Count("id"))
            .values_list("convoy_id", "n")
        )
        room = {pk: max((convoys[pk] or 0) - busy.get(pk, 0), 0) for pk in capped}
    last = dict(
        Dispatch.objects.filter(convoy_id__in=convoys)
        .values("convoy_id")
        .annotate(at=Max("created_at"))
        .values_list("convoy_id", "at")
    )
    per_convoy: dict[str, list[Bead]] = {}
    for convoy_id, bead_id in tracked.values_list("convoy_id", "bead_id"):  # no long IN list
        if bead_id in beads and bead_id not in skip:
            per_convoy.setdefault(convoy_id, []).append(beads[bead_id])
    keyed: list[tuple[tuple[int, int, datetime, str, str], Bead]] = []
    for convoy_id, members in per_convoy.items():
        members.sort(key=lambda b: (b.priority, b.pk))
        if convoy_id in room:
            members = members[: room[convoy_id]]
        rank: dict[int, int] = {}
        for bead in members:
            k = rank[bead.priority] = rank.get(bead.priority, -1) + 1
            keyed.append(
                ((bead.priority, k, last.get(convoy_id) or NEVER, convoy_id, bead.pk), bead)
            )
    keyed.sort(key=lambda item: item[0])
    seen: set[str] = set()
    result: list[Queued] = []
    for key, bead in keyed:
        if bead.pk not in seen:  # a bead tracked by two convoys queues once, at its best
            seen.add(bead.pk)
            result.append(Queued(bead, key[3]))
    return result


def snapshot(now: datetime | None = None, *, heads: bool = False) -> CapState:
    """In flight, cap and the queue, with each waiting bead's position. `heads`: only what a
    feeder needs, so no queue is read while the town is full."""
    now = now or timezone.now()
    limit = cap()
    busy = in_flight(now)
    wanted = limit and not (heads and busy >= limit)
    snap = CapState(limit, busy, queue(now) if wanted else [])
    for position, queued in enumerate(snap.waiting, start=1):
        queued.position = position
    return snap


def report(now: datetime | None = None) -> dict[str, Any]:
    """What `convoy capacity --json` prints: the snapshot with where the cap comes from."""
    snap = snapshot(now)
    _, origin = cap_source()
    return {
        **snap.as_json(),
        "source": origin.source,
        "set_by": origin.set_by,
        "set_at": origin.set_at,
    }


PANEL_ROWS = 20


@dataclass
class Panel:
    """The dashboard's capacity panel: the snapshot, where the cap comes from, and the first
    PANEL_ROWS waiting beads (`convoy capacity` lists them all)."""

    snap: CapState
    origin: CapOrigin
    rows: list[Queued]
    more: int


def panel(now: datetime | None = None) -> Panel:
    """Without a cap only the count of beads in flight is read (one query)."""
    limit, origin = cap_source()
    if not limit:
        return Panel(CapState(0, in_flight(now), []), origin, [], 0)
    snap = snapshot(now)
    waiting = snap.waiting
    return Panel(snap, origin, waiting[:PANEL_ROWS], max(len(waiting) - PANEL_ROWS, 0))


def panel_stands(changes: Changes) -> bool:
    """Whether `panel()` is as it was drawn before `changes`: they hold only notes and edits of
    bead fields it does not read, of beads not at work (an edit refreshes `updated_at`, by which
    a worker that never reported is judged alive)."""
    if changes.kinds - NOTE_KINDS - {"bead.updated"} or changes.dependencies or changes.unlisted:
        return False
    if not changes.fields:
        return True
    if changes.fields & (QUEUED_FIELDS if cap() else COUNTED_FIELDS):
        return False
    at_work = Bead.objects.filter(pk__in=changes.beads, status__in=ACTIVE_WORK_STATUSES)
    return not at_work.exclude(assignee="").exists()


def queue_positions(now: datetime | None = None) -> dict[str, int]:
    """{bead id: 1-based position} of every bead waiting for town capacity (1 = the next to
    be dispatched when a slot frees). Empty when there is no cap or a free slot is there for
    every queued bead."""
    return {q.bead_id: q.position for q in snapshot(now).waiting}
