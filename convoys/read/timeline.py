"""Read models of a convoy's story over time: the per-wave timeline (Gantt), the time
slider's step and "since your last visit". The replay itself is pure (`history`)."""

from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.db.models.fields.json import KT

from convoys.core import dag as dagmod
from convoys.core import history
from convoys.core.formatting import percent_done
from convoys.core.parsing import whole_number
from convoys.log.kinds import LOG
from convoys.models import Convoy, ConvoyVisit, Event, TrackedBead
from convoys.read.convoy_page import ConvoyPage, _wave_rows
from convoys.read.graph import bead_url_maker
from convoys.read.sizes import COLLAPSE_AT, OVERVIEW_AT
from convoys.read.snapshots import Snapshot
from convoys.read.summaries import SEGMENTS
from convoys.rules.rows import TrackedRow

GANTT_ROWS = 150  # beads of one wave drawn in the timeline; the rest are counted
SINCE_CHIPS = 60
PHASE_WORDS = {
    "waiting": "waiting",
    "ready": "ready, nobody took it (idle)",
    "active": "in progress",
    "done": "done",
    "skipped": "skipped (not needed)",
    "unknown": "unknown",
}


def blocking_edges(edges: Iterable[tuple[str, str, str]]) -> dict[str, list[tuple[str, str]]]:
    """{bead: [(target, type)]} of the blocking edges among (issue, target, type)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for issue, target, dep_type in edges:
        if dep_type in history.BLOCKING_TYPES:
            out.setdefault(issue, []).append((target, dep_type))
    return out


# What the replay reads of an event: its status, assignee and close reason, read out of `data`
# as text by the database (KT), not the whole JSON decoded in Python.
FIELDS = ("seq", "kind", "bead_id", "convoy_id", "created_at", "status", "assignee", "reason")
VALUES = {
    "status": KT("data__status"),
    "assignee": KT("data__assignee"),
    "reason": KT("data__close_reason"),
}


def _as_events(rows: Iterable[Sequence[Any]]) -> list[history.Ev]:
    out: list[history.Ev] = []
    for seq, kind, bead, convoy, at, status, assignee, reason in rows:
        data: dict[str, Any] = {"status": status, "assignee": assignee}
        if reason is not None:
            data["close_reason"] = reason
        out.append(history.Ev(seq, kind, bead, convoy, at, data))
    return out


def stream(convoy: Convoy, targets: Sequence[str] = ()) -> tuple[QuerySet[Event], QuerySet[Event]]:
    """The convoy's events as two querysets (each walks an index; together in log order by
    `events`): those of its tracked beads and of the untracked targets its beads depend on
    (`targets`), and its own that name no bead."""
    tracked = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    about_beads = Event.objects.filter(bead_id__in=tracked)
    if targets:
        about_beads = Event.objects.filter(Q(bead_id__in=tracked) | Q(bead_id__in=list(targets)))
    # A worker's log lines change no state: no step of the story.
    return about_beads.exclude(kind=LOG), Event.objects.filter(convoy_id=convoy.pk, bead_id="")


def events(parts: Iterable[QuerySet[Event]], upto: int | None = None) -> list[history.Ev]:
    """The events of `parts` (querysets) in log order, up to seq `upto`."""
    rows: list[tuple[Any, ...]] = []
    for part in parts:
        part = part if upto is None else part.filter(seq__lte=upto)
        rows += part.annotate(**VALUES).values_list(*FIELDS)
    rows.sort(key=lambda r: r[0])
    return _as_events(rows)


def seqs(parts: Iterable[QuerySet[Event]]) -> list[int]:
    """Every seq of `parts`, sorted (the slider's steps)."""
    out: list[int] = []
    for part in parts:
        out += part.values_list("seq", flat=True)
    out.sort()
    return out


# --- the timeline (Gantt) --------------------------------------------------------------------
@dataclass
class Gantt:
    wave: int | None
    waves: list[int]  # wave numbers to choose from
    rows: list[dict[str, Any]]  # [{id, href, state, bars: [{phase, x, width, title}]}]
    hidden: int
    start: datetime | None
    end: datetime | None
    idle_count: int = 0
    idle_longest: float = 0.0

    @property
    def idle_longest_words(self) -> str:
        return _duration(self.idle_longest)

    steps: int = 0  # events in the slider's stream


def gantt(
    convoy: Convoy,
    page: ConvoyPage,
    snapshot: Snapshot,
    params: Mapping[str, str],
    now: datetime,
    upto: int | None = None,
) -> Gantt:
    """The timeline of one wave (`?twave=N`, default the frontier, else the last), from the
    events of its beads, their blockers and the convoy's launches: bounded by the wave; as of
    the event `upto` (the seq the page is drawn at), so that a live update equals a reload."""
    numbers = sorted({w["number"] for w in page.waves})
    wave = whole_number(params.get("twave"))
    if wave not in numbers:
        wave = page.frontier or (numbers[-1] if numbers else None)
    members = sorted(i for i, n in page.wave_of.items() if n == wave)
    shown = members[:GANTT_ROWS]
    # An overview reads only the beads it draws: the wave's size is its kept count.
    size = next((w["total"] for w in page.waves if w["number"] == wave), len(members))
    hidden = max(size, len(members)) - len(shown)
    targets = _outside_targets(snapshot)
    spans, read = _spans(convoy, snapshot, shown, upto)
    # The axis runs from the convoy's creation to its last event (not to "now": the
    # drawing changes only with events, so a live update equals a reload).
    parts = stream(convoy, targets)
    if upto is not None:
        parts = (parts[0].filter(seq__lte=upto), parts[1].filter(seq__lte=upto))
    last = [p.order_by("-seq").values_list("created_at", flat=True)[:1] for p in parts]
    start = convoy.created_at
    end = max([start, *(t for one in last for t in one), *(e.at for e in read)])
    steps = sum(p.count() for p in parts)
    return _drawn(wave, numbers, shown, hidden, spans, start, end, steps)


def _spans(
    convoy: Convoy, snapshot: Snapshot, beads: list[str], upto: int | None = None
) -> tuple[dict[str, list[history.Span]], list[history.Ev]]:
    """({bead: spans}, the events read) for `beads`, from their events, their blockers' and
    the convoy's launches and stops (up to the event `upto`)."""
    every = blocking_edges(snapshot.edges)
    blocking = {b: every[b] for b in beads if b in every}
    ids = set(beads) | {t for edges in blocking.values() for t, _ in edges}
    launches = history.LAUNCH_KINDS | history.STOP_KINDS
    read = events(
        [
            Event.objects.filter(bead_id__in=sorted(ids)).exclude(kind=LOG),
            Event.objects.filter(convoy_id=convoy.pk, bead_id="", kind__in=launches),
        ],
        upto,
    )
    return history.spans(read, beads, blocking, convoy.pk), read


def _drawn(
    wave: int | None,
    numbers: list[int],
    shown: list[str],
    hidden: int,
    spans: dict[str, list[history.Span]],
    start: datetime,
    end: datetime,
    steps: int,
) -> Gantt:
    """The Gantt of `shown` beads' spans on the axis from `start` to `end`."""
    total = max((end - start).total_seconds(), 1e-6)
    href = bead_url_maker()
    out, idle, longest = [], 0, 0.0
    for bead in shown:
        bars = []
        for span in spans.get(bead, ()):
            a = max(span.start, start)
            b = min(span.end or end, end)
            # A closed span of no length is not drawn; the current one always is (thinly).
            if span.phase == "waiting" or b < a or (b == a and span.end is not None):
                continue
            seconds = (b - a).total_seconds()
            if span.phase == "ready":
                idle += 1
                longest = max(longest, seconds)
            bars.append(
                {
                    "phase": span.phase,
                    "x": round(min((a - start).total_seconds() / total * 100, 99.85), 3),
                    "width": round(max(seconds / total * 100, 0.15), 3),
                    "title": f"{PHASE_WORDS[span.phase]} for {_duration(seconds)}",
                }
            )
        current = spans[bead][-1].phase if spans.get(bead) else "unknown"
        out.append({"id": bead, "href": href(bead), "state": current, "bars": bars})
    return Gantt(
        wave=wave,
        waves=numbers,
        rows=out,
        hidden=hidden,
        start=start,
        end=end,
        idle_count=idle,
        idle_longest=longest,
        steps=steps,
    )


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 1:
        return "under 1 s"
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _outside_targets(snapshot: Snapshot) -> list[str]:
    tracked = set(snapshot.tracked)
    return sorted(
        {t for _, t, kind in snapshot.edges if kind in history.BLOCKING_TYPES and t not in tracked}
    )


# --- the time slider -------------------------------------------------------------------------
@dataclass
class Step:
    step: int  # 1-based position in the stream
    steps: int
    seq: int
    at: datetime
    kind: str
    bead_id: str
    states: dict[
        str, str
    ]  # {bead: page state}: done, active, ready, blocked, unknown (the DAG's st-*)
    waves: list[dict[str, Any]]  # wave rows as the page's wave table draws them
    frontier: int | None
    counts: dict[
        str, Any
    ]  # the head's summary as it was: each segment, total, percent, percent_complete


def step(
    convoy: Convoy,
    snapshot: Snapshot,
    graph: dagmod.DAG,
    waves: list[list[str]],
    number: int,
) -> Step | None:
    """The convoy page's progress after the `number`-th event of its stream (1-based; clamped
    to the stream), replayed from the log. None when the convoy has no events."""
    parts = stream(convoy, _outside_targets(snapshot))
    every = seqs(parts)
    if not every:
        return None
    steps = len(every)
    number = min(max(number, 1), steps)
    read = events(parts, upto=every[number - 1])
    blocking = blocking_edges(snapshot.edges)
    run = history.replay(read, blocking, convoy.pk)
    ev = read[-1]
    tracked = snapshot.tracked
    state = {b: run.state(b) for b in tracked}
    ready = {b for b, s in state.items() if s == "ready"}
    beads: dict[str, TrackedRow] = {}
    for b in tracked:
        row = snapshot.beads.get(b)
        status = run.status.get(b)
        if row is not None and status is not None:
            beads[b] = row._replace(status=status)
    # A past page shows a closed bead as done: the replay knows no convoy's merge strategy.
    counts: dict[str, Any] = dict.fromkeys(SEGMENTS, 0)
    for s in state.values():
        counts[s] += 1
    counts["failed"] = 0  # a past dispatch failure is not replayed as a state
    counts["total"] = len(tracked)
    whole = counts["total"] or 1
    counts["percent"] = {k: round(100 * counts[k] / whole, 2) for k in SEGMENTS}
    counts["percent_complete"] = percent_done(counts["done"], counts["total"])

    def chip(bead_id: str) -> str:
        s = state.get(bead_id, "unknown")
        return s if s in ("ready", "unknown") else run.status.get(bead_id, "unknown")

    rows, frontier = _past_wave_rows(
        waves,
        beads,
        ready,
        graph,
        chip,
        bead_url_maker(),
        len(tracked) > COLLAPSE_AT,
        chips=0 if len(tracked) > OVERVIEW_AT else None,
    )
    return Step(
        step=number,
        steps=steps,
        seq=ev.seq,
        at=ev.at,
        kind=ev.kind,
        bead_id=ev.bead_id,
        states=state,
        waves=rows,
        frontier=frontier,
        counts=counts,
    )


def _past_wave_rows(
    waves: list[list[str]],
    beads: dict[str, TrackedRow],
    ready_ids: AbstractSet[str],
    graph: dagmod.DAG,
    state: Callable[[str], str],
    href: Callable[[str], str],
    big: bool,
    chips: int | None = None,
) -> tuple[list[dict[str, Any]], int | None]:
    """The page's wave rows, without causes: why a bead waited then is not replayed."""
    return _wave_rows(waves, beads, ready_ids, graph, state, href, big, cause_of={}, chips=chips)


# --- since your last visit -------------------------------------------------------------------
@dataclass
class SinceVisit:
    at: datetime
    seq: int
    beads: list[str]  # changed tracked bead ids, sorted
    hidden: int = 0


def since_visit(convoy: Convoy, previous: ConvoyVisit | None, as_of: int) -> SinceVisit | None:
    """The tracked beads named by events after the user's previous visit (a ConvoyVisit or
    None: a first visit marks nothing)."""
    if previous is None or previous.seq >= as_of:
        return SinceVisit(previous.at, previous.seq, []) if previous else None
    tracked = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    changed = sorted(
        set(
            Event.objects.filter(seq__gt=previous.seq, seq__lte=as_of, bead_id__in=tracked)
            .exclude(kind=LOG)
            .values_list("bead_id", flat=True)
            .distinct()
        )
    )
    return SinceVisit(previous.at, previous.seq, changed)
