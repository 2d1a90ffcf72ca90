"""A convoy's story over time, replayed from the gap-free event log (no Django).

Every event about a bead carries the bead's status (and assignee, and a close's reason) after
it, so replaying a bead's events in sequence order gives its status at any point of the log.
From the statuses and the convoy's blocking edges this module derives, purely:

- `states(...)`: each bead's page state after a given event (done, active, ready, blocked,
  unknown): the convoy page's progress as it was then (the time slider);
- `spans(...)`: for each bead, the phases it went through as timed spans (the timeline):
  waiting (blocked, or ready before the convoy was launched), ready (launched, unblocked,
  open and nobody took it: an idle gap), active (hooked or in progress), done.

"Ready" here is the readiness rule's dependency part over the replayed statuses: open and
unassigned, and no blocking dependency on an existing (seen in the log) target that is not
done (merge-blocks: closed with a reason starting "Merged in "). Rig states and worker
liveness of the past are not replayed (a dead worker's bead counts as active).
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from convoys.core.merges import self_merged

SKIPPED = "skipped"  # closed as not needed: done for what it blocks
DONE_STATUSES = ("closed", "tombstone", SKIPPED)
ACTIVE_STATUSES = ("hooked", "in_progress")
BLOCKING_TYPES = ("blocks", "conditional-blocks", "waits-for", "merge-blocks")
MERGE_KINDS = frozenset({"bead.merged", "merge.abandoned"})
# Convoy events after which its ready beads are expected to be taken.
LAUNCH_KINDS = frozenset({"convoy.launched", "convoy.reopened"})
STOP_KINDS = frozenset({"convoy.landed", "convoy.closed"})
PHASES = ("waiting", "ready", "active", "done", SKIPPED, "unknown")
Blocking = Mapping[str, Sequence[tuple[str, str]]]  # {bead: [(target, dependency type)]}


@dataclass(frozen=True)
class Ev:
    """One event as the log holds it."""

    seq: int
    kind: str
    bead_id: str
    convoy_id: str
    at: datetime
    data: Mapping[str, Any]


@dataclass(frozen=True)
class Span:
    phase: str
    start: datetime
    end: datetime | None  # None: still in this phase


def target_blocks(
    dep_type: str, status: str, close_reason: str | None, merged: bool = False
) -> bool:
    """Does an existing target with this status block along an edge of this type? The
    readiness rule's edge test, for rows and for replayed values alike: a `merge-blocks` edge
    waits for the target's merge, recorded (`merged`) or said by its own close reason."""
    if dep_type not in BLOCKING_TYPES or status in ("tombstone", SKIPPED):
        return False
    if status == "closed":
        return dep_type == "merge-blocks" and not (merged or self_merged(close_reason or ""))
    return True


@dataclass
class Replay:
    """Bead statuses as of the last applied event. `blocking`: {bead: [(target, type)]}."""

    blocking: Blocking
    convoy_id: str = ""
    status: dict[str, str] = field(default_factory=dict)
    assignee: dict[str, str] = field(default_factory=dict)
    reason: dict[str, str] = field(default_factory=dict)
    merged: set[str] = field(default_factory=set)
    launched: bool = False
    seq: int = 0

    def apply(self, ev: Ev) -> bool:
        """Apply one event; True when it changed what `state` reads (a bead's values or the
        convoy's launch)."""
        self.seq = ev.seq
        data = ev.data if isinstance(ev.data, Mapping) else {}
        if not ev.bead_id:
            if ev.convoy_id == self.convoy_id and ev.kind in LAUNCH_KINDS | STOP_KINDS:
                launched = ev.kind in LAUNCH_KINDS
                changed = launched != self.launched
                self.launched = launched
                return changed
            return False
        if ev.convoy_id == self.convoy_id and ev.kind in LAUNCH_KINDS:
            self.launched = True
        if ev.kind in MERGE_KINDS:
            before_merged = ev.bead_id in self.merged
            if ev.kind == "bead.merged":
                self.merged.add(ev.bead_id)
            else:
                self.merged.discard(ev.bead_id)
            return before_merged != (ev.bead_id in self.merged)
        status = data.get("status")
        if not isinstance(status, str):
            return False
        bead = ev.bead_id
        before = (self.status.get(bead), self.assignee.get(bead), self.reason.get(bead))
        self.status[bead] = status
        if isinstance(data.get("assignee"), str):
            self.assignee[bead] = data["assignee"]
        if status in DONE_STATUSES:
            if isinstance(data.get("close_reason"), str):
                self.reason[bead] = data["close_reason"]
        else:
            self.reason.pop(bead, None)
        return before != (self.status.get(bead), self.assignee.get(bead), self.reason.get(bead))

    def blocked(self, bead: str) -> bool:
        for target, dep_type in self.blocking.get(bead, ()):
            status = self.status.get(target)
            merged = target in self.merged
            if status is not None and target_blocks(
                dep_type, status, self.reason.get(target), merged
            ):
                return True
        return False

    def state(self, bead: str) -> str:
        """The page's state: done, active, ready, blocked or unknown (never seen)."""
        status = self.status.get(bead)
        if status is None:
            return "unknown"
        if status == SKIPPED:
            return SKIPPED
        if status in DONE_STATUSES:
            return "done"
        if status in ACTIVE_STATUSES:
            return "active"
        if status == "open" and not self.assignee.get(bead) and not self.blocked(bead):
            return "ready"
        return "blocked"

    def phase(self, bead: str) -> str:
        """The timeline's phase: a ready bead is only idle once the convoy was launched."""
        state = self.state(bead)
        if state == "ready" and not self.launched:
            return "waiting"
        return "waiting" if state == "blocked" else state


def replay(
    events: Iterable[Ev], blocking: Blocking, convoy_id: str = "", upto: int | None = None
) -> Replay:
    """A `Replay` after every event with seq <= upto (all when None)."""
    run = Replay(blocking, convoy_id)
    for ev in events:
        if upto is not None and ev.seq > upto:
            break
        run.apply(ev)
    return run


def states(
    events: Iterable[Ev], beads: Iterable[str], blocking: Blocking, upto: int | None = None
) -> dict[str, str]:
    """{bead: state} after event `upto` (the slider's step)."""
    run = replay(events, blocking, upto=upto)
    return {bead: run.state(bead) for bead in beads}


def dependents_of(blocking: Blocking) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for bead, edges in blocking.items():
        for target, _ in edges:
            out.setdefault(target, []).append(bead)
    return out


def spans(
    events: Iterable[Ev], beads: Iterable[str], blocking: Blocking, convoy_id: str = ""
) -> dict[str, list[Span]]:
    """{bead: [Span, ...]} in time order, consecutive and non-overlapping; the last one open."""
    wanted = list(beads)
    watched = set(wanted)
    dependents = dependents_of(blocking)
    run = Replay(blocking, convoy_id)
    current: dict[str, tuple[str, datetime]] = {}
    out: dict[str, list[Span]] = {bead: [] for bead in wanted}

    def move(bead: str, at: datetime) -> None:
        phase = run.phase(bead)
        now = current.get(bead)
        if now is not None and now[0] == phase:
            return
        if now is not None and at > now[1]:
            out[bead].append(Span(now[0], now[1], at))
        current[bead] = (phase, at)

    for ev in events:
        launched = run.launched
        if not run.apply(ev):
            continue
        if run.launched != launched:
            touched: Iterable[str] = [b for b in wanted if b in current]
        else:
            touched = [b for b in (ev.bead_id, *dependents.get(ev.bead_id, ())) if b in watched]
        for bead in touched:
            if bead in current or run.status.get(bead) is not None:
                move(bead, ev.at)
    for bead, (phase, start) in current.items():
        out[bead].append(Span(phase, start, None))
    return out
