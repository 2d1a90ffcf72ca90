"""The one stranded/stuck rule: why an open convoy is or is not moving.

Every open convoy is exactly one of:
- feedable: ready beads that the feeder may dispatch now (not cooling down after a failed
  dispatch, and under the convoy's max in flight);
- moving: nothing to dispatch now, but work is in progress, or its ready work waits in the
  town's queue while the town is at its cap (code "waiting_for_capacity");
- stuck: tracked work, none of it ready or in progress, with the reason (gated, parked rig,
  blocked outside the convoy, dispatch failing, no rig, not dispatchable, held, unknown beads,
  or complete and waiting to land);
- empty: it tracks nothing.
Feedable, stuck and empty convoys are stranded: they need attention and wear a badge.
`convoy stranded`, /stranded/ and /api/stranded list every open convoy, as the original's
`gt convoy stranded` does (its "stuck" is any convoy with tracked work and none
ready, so it covers our moving convoys too), each with its cause (`Verdict.detail`). The
dashboard badge, the convoy page, the API, the stranded page, `convoy stranded` and the
stranded scan all read `classify`; the convoy page's ETA asks `estimate_blocker`.
"""

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from django.conf import settings
from django.utils import timezone

from convoys.core.formatting import person
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    CONVOY_CLOSED,
    CONVOY_OPEN,
    DONE_STATUSES,
    SLINGABLE_TYPES,
    STAGED_STATUSES,
    Bead,
    Convoy,
    Rig,
    TrackedBead,
)
from convoys.rules import capacity, merging
from convoys.rules.breaker import cooling_down, parked_among, recent_failures
from convoys.rules.readiness import blocked_by, ready_beads

FEEDABLE, MOVING, STUCK, EMPTY = "feedable", "moving", "stuck", "empty"
STRANDED_KINDS = (FEEDABLE, STUCK, EMPTY)
# Root causes, most actionable first; the first present names a stuck convoy.
CAUSES = (
    "complete",
    "paused",
    "dispatch_failing",
    "parked_rig",
    "gated",
    "blocked",
    "no_rig",
    "not_dispatchable",
    "held",
    "merging",  # closed beads waiting for their merge, and beads that wait on them
    "unknown",
)
CAUSE_WORDS = {
    "complete": "waiting to land",
    "merging": "waiting to merge",
    "paused": "stuck: paused",
    "dispatch_failing": "stuck: dispatch failing",
    "parked_rig": "stuck: parked rig",
    "gated": "stuck: gated",
    "blocked": "stuck: blocked",
    "no_rig": "stuck: no rig",
    "not_dispatchable": "stuck: not dispatchable",
    "held": "stuck: on hold",
    "unknown": "stuck: unknown beads",
}
# Causes that leave a landing time unknowable even while other work moves.
NO_ESTIMATE_CAUSES = ("parked_rig", "gated", "blocked", "no_rig", "not_dispatchable", "unknown")

# What classify reads of the convoys' beads, when the caller has it: ((convoy id, bead id) rows
# in tracking order, {bead id: (status, …)}, the ready bead ids).
Loaded = tuple[list[tuple[str, str]], dict[str, tuple[Any, ...]], AbstractSet[str]]
# A convoy page's snapshot of its beads: ({bead id: row with status, assignee, issue_type,
# rig_id}, {bead id: unfinished blocker ids}, {blocker id: issue type}).
StrandingFacts = tuple[
    Mapping[str, Any], Mapping[str, list[str]], Mapping[str, str], Mapping[str, str]
]


@dataclass
class Cause:
    code: str
    text: str
    beads: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    kind: str  # feedable | moving | stuck | empty, or "" for a convoy that is not open
    reason: str = ""  # one line for people
    code: str = ""  # the cause's code for stuck convoys; "in_progress" (or
    # "waiting_for_capacity") for moving ones
    ready: list[str] = field(default_factory=list)  # dispatchable ready beads, in tracking order
    tracked_count: int = 0
    causes: list[Cause] = field(default_factory=list)  # every root cause found (Cause)

    @property
    def stranded(self) -> bool:
        return self.kind in STRANDED_KINDS

    @property
    def detail(self) -> str:
        """The reason, and for a moving convoy what else holds its stalled beads (`explain`):
        "1 in progress; gt-roll gated by gt-go"."""
        if self.kind != MOVING or not self.causes:
            return self.reason
        return "; ".join([self.reason, *(cause.text for cause in self.causes)])

    @property
    def label(self) -> str:
        """Words for a badge: "stranded", "stuck: gated", "empty", "in progress"."""
        if self.kind == STUCK:
            return CAUSE_WORDS.get(self.code, "stuck")
        if self.code == WAITING_FOR_CAPACITY:
            return "waiting for capacity"
        return {FEEDABLE: "stranded", MOVING: "in progress", EMPTY: "empty"}.get(self.kind, "")


NOT_OPEN = Verdict("")
# Ready work while the town is at its cap (rules/capacity.py): not stranded, the town's
# queue serves it as slots free.
WAITING_FOR_CAPACITY = "waiting_for_capacity"
COOLING_LOOKUP = 500


def shown_stranded(verdict: Verdict, feedable_since: datetime | None, now: datetime) -> bool:
    """Whether pages call the convoy stranded: never a feedable one whose ready work has
    waited less than one feed interval (the feeder takes it this instant)."""
    if verdict.kind == FEEDABLE and feedable_since is not None:
        return (now - feedable_since).total_seconds() >= settings.CONVOY_FEED_INTERVAL
    return verdict.stranded


def classify(
    convoys: Sequence[Convoy],
    now: datetime | None = None,
    explain: bool = False,
    loaded: Loaded | None = None,
    facts: StrandingFacts | None = None,
    cap: int | None = None,
    cooling: AbstractSet[str] | None = None,
) -> dict[str, Verdict]:
    """{convoy id: Verdict} for the given convoys (only open ones get a kind).

    `loaded`, when the caller has read them already: (rows of (convoy id, bead id) in
    tracking order, {bead id: (status, …)}, the ready bead ids); else three queries read
    them. Then one query for cooling dispatches, and two or three for the causes of stuck
    convoys (of every convoy with `explain`, which the convoy page's ETA needs); one with
    `facts`, what a convoy page's snapshot holds of its beads: ({bead id: row with status,
    assignee, issue_type, rig_id}, {bead id: unfinished blocker ids}, {blocker id: type},
    {rig: state}), and `cap`, the town's cap it read, and `cooling` (`cooling_among`)."""
    now = now or timezone.now()
    open_ = [c for c in convoys if c.status == CONVOY_OPEN]
    result = {c.pk: NOT_OPEN for c in convoys}
    if not open_:
        return result
    rows, status_of, ready = loaded if loaded is not None else _load(open_, now)
    per_convoy: dict[str, list[str]] = {c.pk: [] for c in open_}
    for convoy_id, bead_id in rows:
        if convoy_id in per_convoy:
            per_convoy[convoy_id].append(bead_id)
    if cooling is None:
        cooling = cooling_among(ready, now)
    to_explain, town = [], town_full(now, cap)
    closed = [i for i, row in status_of.items() if row[0] == "closed"]
    shown = {i for i, row in status_of.items() if row[0] == merging.SUBMITTED}
    submitted = merging.awaiting_among(closed) | shown
    for convoy in open_:
        statuses = {i: status_of[i][0] for i in per_convoy[convoy.pk] if i in status_of}
        verdict = _first_pass(convoy, per_convoy[convoy.pk], statuses, ready, cooling, submitted)
        verdict = judge(convoy, verdict, town)
        result[convoy.pk] = verdict
        if (verdict.kind == STUCK and not verdict.code) or (
            explain and verdict.kind in (FEEDABLE, MOVING)
        ):
            to_explain.append(convoy.pk)
    if to_explain:
        _explain({pk: per_convoy[pk] for pk in to_explain}, result, ready, cooling, facts)
    return result


def cooling_among(ready: AbstractSet[str], now: datetime) -> AbstractSet[str]:
    """Which `ready` beads are cooling down or parked: a few ready beads are looked up by id
    (the parked beads of the whole database are a scan of every bead); many, by one range
    scan."""
    if len(ready) <= COOLING_LOOKUP:
        return cooling_down(sorted(ready), now) if ready else set()
    return recent_failures(now) & ready


def _load(convoys: Sequence[Convoy], now: datetime) -> Loaded:
    tracking = TrackedBead.objects.filter(convoy_id__in=[c.pk for c in convoys])
    rows = list(tracking.values_list("convoy_id", "bead_id"))
    tracked = Bead.objects.filter(pk__in=tracking.values("bead_id"))
    status_of = {row[0]: row[1:] for row in tracked.values_list("id", "status")}
    return rows, status_of, set(ready_beads(tracked, now).values_list("pk", flat=True))


def classify_one(convoy: Convoy, now: datetime | None = None, explain: bool = True) -> Verdict:
    return classify([convoy], now, explain)[convoy.pk]


def open_verdicts(
    now: datetime | None = None, explain: bool = False
) -> list[tuple[Convoy, Verdict]]:
    """[(convoy, Verdict)] for every open convoy, by id."""
    convoys = list(Convoy.objects.filter(status=CONVOY_OPEN).order_by("id"))
    verdicts = classify(convoys, now, explain)
    return [(c, verdicts[c.pk]) for c in convoys]


class Tally(NamedTuple):
    """What the first pass counts of a convoy's tracked beads."""

    tracked: int
    unfinished: int  # not done (unknown beads too)
    dispatchable: int  # ready and not cooling down
    busy: int  # in progress by a live worker
    submitted: int = 0  # closed, waiting for their merge (counted in `unfinished`)


def _first_pass(
    convoy: Convoy,
    ids: Sequence[str],
    statuses: Mapping[str, str],
    ready: AbstractSet[str],
    cooling: AbstractSet[str],
    submitted: AbstractSet[str] = frozenset(),
) -> Verdict:
    """The kind from statuses alone (`first_pass` of their tally), with the ready ids."""
    waiting = [i for i in ids if i in submitted]
    unfinished = [i for i in ids if statuses.get(i) not in DONE_STATUSES or i in submitted]
    dispatchable = [i for i in unfinished if i in ready and i not in cooling]
    busy = [i for i in unfinished if i not in ready and statuses.get(i) in ACTIVE_WORK_STATUSES]
    tally = Tally(len(ids), len(unfinished), len(dispatchable), len(busy), len(waiting))
    verdict = first_pass(convoy, tally)
    if verdict.kind == FEEDABLE:
        verdict.ready = dispatchable
    return verdict


def first_pass(convoy: Convoy, tally: Tally) -> Verdict:
    """The kind from counts alone: ready work, work in progress, or neither (a stuck convoy's
    cause is found by `_explain`)."""
    if not tally.tracked:
        return Verdict(EMPTY, "tracks no beads", "empty")
    if not tally.unfinished:
        text = "every tracked bead is done: waiting to land"
        return Verdict(STUCK, text, "complete", [], tally.tracked, [Cause("complete", text)])
    if tally.submitted and tally.submitted == tally.unfinished:
        text = f"{tally.submitted} submitted, waiting to merge"
        return Verdict(STUCK, text, "merging", [], tally.tracked, [Cause("merging", text)])
    limit = convoy.max_in_flight
    capped = bool(limit and tally.busy >= limit)
    if tally.dispatchable and not capped:
        text = f"{tally.dispatchable} ready, nobody on them"
        return Verdict(FEEDABLE, text, "ready", [], tally.tracked)
    if tally.busy:
        text = f"{tally.busy} in progress"
        if tally.dispatchable:
            text += f" (max in flight {convoy.max_in_flight}; {tally.dispatchable} ready waiting)"
        return Verdict(MOVING, text, "in_progress", [], tally.tracked)
    return Verdict(STUCK, "", "", [], tally.tracked)


def judge(convoy: Convoy, verdict: Verdict, town: tuple[int, int] | None) -> Verdict:
    """The first pass's verdict with the town's capacity (`town_full`) and the pause."""
    if verdict.kind == FEEDABLE and town:
        verdict = _waiting_for_capacity(verdict, *town)
    if convoy.paused_at and verdict.code not in ("empty", "complete", "merging"):
        verdict = _paused(convoy, verdict)
    return verdict


def explain(
    per_convoy: dict[str, list[str]],
    verdicts: dict[str, Verdict],
    ready: AbstractSet[str],
    cooling: AbstractSet[str],
) -> None:
    """Fill the causes (and a stuck convoy's code and reason) of `verdicts`."""
    _explain(per_convoy, verdicts, ready, cooling)


def town_full(now: datetime, cap: int | None = None) -> tuple[int, int] | None:
    """(in flight, cap) when the town is at its cap, else None (`cap`: read already)."""
    limit = capacity.cap() if cap is None else cap
    busy = capacity.in_flight(now) if limit else 0
    return (busy, limit) if limit and busy >= limit else None


def _waiting_for_capacity(verdict: Verdict, busy: int, limit: int) -> Verdict:
    text = f"{len(verdict.ready)} ready, waiting for town capacity ({busy} in flight, cap {limit})"
    return Verdict(MOVING, text, WAITING_FOR_CAPACITY, [], verdict.tracked_count)


def _paused(convoy: Convoy, verdict: Verdict) -> Verdict:
    """A paused convoy is stuck whatever its beads do: nothing feeds it until resumed."""
    text = f"paused by {person(convoy.paused_by) or 'someone'}" + (
        f": {convoy.pause_reason}" if convoy.pause_reason else ""
    )
    return Verdict(STUCK, text, "paused", [], verdict.tracked_count, [Cause("paused", text)])


def _stalled(
    bead_id: str, status: str | None, ready: AbstractSet[str], cooling: AbstractSet[str]
) -> bool:
    """An unfinished bead that is neither dispatchable nor worked on (or not in the database)."""
    if status in DONE_STATUSES:
        return False
    if bead_id in ready:
        return bead_id in cooling
    return status not in ACTIVE_WORK_STATUSES


def _explain(
    per_convoy: dict[str, list[str]],
    verdicts: dict[str, Verdict],
    ready: AbstractSet[str],
    cooling: AbstractSet[str],
    facts: StrandingFacts | None = None,
) -> None:
    """Find the root causes of the unfinished beads that are neither ready nor in progress."""
    if facts is not None:
        rows, blockers, target_types, rig_states = facts
        info = {i: (r.status, r.assignee, r.issue_type, r.rig_id) for i, r in rows.items()}
    else:
        # Subqueries, not lists: a 5,000-bead convoy would make IN lists of thousands of ids.
        tracked = TrackedBead.objects.filter(convoy_id__in=list(per_convoy)).values("bead_id")
        beads = Bead.objects.filter(pk__in=tracked)
        info = {
            row[0]: row[1:]
            for row in beads.values_list("id", "status", "assignee", "issue_type", "rig_id")
        }
        unfinished = beads.exclude(status__in=(*DONE_STATUSES, *ACTIVE_WORK_STATUSES))
        blockers = blocked_by(unfinished.values_list("pk", flat=True))
        targets = {t for ts in blockers.values() for t in ts}
        target_types = dict(Bead.objects.filter(pk__in=targets).values_list("id", "issue_type"))
        rig_states = dict(Rig.objects.values_list("name", "state"))
    parked = parked_among(sorted(cooling)) if cooling else {}  # cooling: a few recent failures
    shown = {i for i, row in info.items() if row[0] == merging.SUBMITTED}
    waiting = merging.awaiting_among([i for i, row in info.items() if row[0] == "closed"]) | shown
    for convoy_id, ids in per_convoy.items():
        verdict = verdicts[convoy_id]
        members = set(ids)
        found: dict[str, list[tuple[str, str]]] = {}
        for bead_id in ids:
            if bead_id in waiting:
                found.setdefault("merging", []).append((bead_id, ""))
                continue
            bead = info.get(bead_id)
            if bead is not None and not _stalled(bead_id, bead[0], ready, cooling):
                continue
            failing = ""  # why a dispatch is not tried now: the breaker parked it, or cooling
            if bead_id in cooling:
                failing = "parked" if bead_id in parked else "cooling"
            cause = _cause(bead_id, bead, blockers, target_types, members, rig_states, failing)
            held_up = blockers.get(bead_id, [])
            if cause is None and held_up and all(t in waiting for t in held_up):
                cause = ("merging", ", ".join(held_up))  # it waits for those to merge
            if cause is not None:
                found.setdefault(cause[0], []).append((bead_id, cause[1]))
        causes = [_summarise(code, found[code]) for code in CAUSES if code in found]
        verdict.causes = causes
        if verdict.kind == STUCK and not verdict.code:
            if causes:
                verdict.code, verdict.reason = causes[0].code, causes[0].text
            else:
                verdict.code = "blocked"
                verdict.reason = "its beads wait on each other (a dependency cycle)"


def _cause(
    bead_id: str,
    info: Sequence[Any] | None,
    blockers: Mapping[str, list[str]],
    target_types: Mapping[str, str],
    members: AbstractSet[str],
    rig_states: Mapping[str, str],
    cooling: str,
) -> tuple[str, str] | None:
    """(code, detail) for one bead that cannot move; None when it waits on convoy work.
    `cooling`: "parked" (the breaker), "cooling" (a recent failed dispatch) or ""."""
    if info is None:
        return "unknown", ""
    status, assignee, issue_type, rig = info
    if (issue_type or "") not in SLINGABLE_TYPES:
        return "not_dispatchable", issue_type
    if status != "open" and status not in ACTIVE_WORK_STATUSES:
        return "held", status
    if assignee and not cooling:  # open, but a live worker holds it
        return "held", f"assigned to {assignee}"
    gates = [t for t in blockers.get(bead_id, []) if target_types.get(t, "") not in SLINGABLE_TYPES]
    if gates:
        return "gated", ", ".join(gates)
    outside = [t for t in blockers.get(bead_id, []) if t not in members]
    if outside:
        return "blocked", ", ".join(outside)
    if blockers.get(bead_id):
        return None
    if not rig:
        return "no_rig", ""
    state = rig_states.get(rig, Rig.ACTIVE)
    if state != Rig.ACTIVE:
        return "parked_rig", f"{rig} ({state})"
    if cooling:
        return "dispatch_failing", cooling
    return None


def _summarise(code: str, items: Sequence[tuple[str, str]]) -> Cause:
    ids = [bead_id for bead_id, _ in items]
    shown = _shown(ids)
    details = sorted({detail for _, detail in items if detail})
    what = ", ".join(details[:3]) + ("…" if len(details) > 3 else "")
    if code == "dispatch_failing":
        return Cause(code, _failing_text(items), ids)
    text = {
        "parked_rig": f"rig {what} holds {shown}",
        "gated": f"{shown} gated by {what}",
        "blocked": f"{shown} blocked by {what} outside the convoy",
        "no_rig": f"{shown} ha{'s' if len(ids) == 1 else 've'} no rig",
        "not_dispatchable": f"{shown} cannot be dispatched (type {what})",
        "held": f"{shown} {'is' if len(ids) == 1 else 'are'} {what}",
        "unknown": f"{shown} not in the database",
        "merging": f"{shown} waiting on merges",
    }[code]
    return Cause(code, text, ids)


def _failing_text(items: Iterable[tuple[str, str]]) -> str:
    """Parked beads wait for a retry; the others are tried again after the cooldown."""
    parked = [bead_id for bead_id, detail in items if detail == "parked"]
    cooling = [bead_id for bead_id, detail in items if detail != "parked"]
    parts = []
    if parked:
        parts.append(
            f"{_shown(parked)} parked by the dispatch breaker (failed dispatches in a row; "
            "a retry clears it)"
        )
    if cooling:
        parts.append(f"dispatch failing for {_shown(cooling)} (retried after the cooldown)")
    return "; ".join(parts)


def _shown(ids: Sequence[str]) -> str:
    return ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")


def estimate_blocker(convoy: Convoy, verdict: Verdict) -> str | None:
    """Why the convoy's landing time cannot be estimated: "" when it can be, None when the
    convoy is closed (no landing ahead, so no ETA at all)."""
    if convoy.status == CONVOY_CLOSED:
        return None
    if convoy.status in STAGED_STATUSES:
        return "not launched yet"
    if verdict.kind in (STUCK, EMPTY):
        return verdict.reason
    for cause in verdict.causes:
        if cause.code in NO_ESTIMATE_CAUSES:
            return cause.text
    return ""
