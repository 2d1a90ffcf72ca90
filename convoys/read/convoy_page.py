"""The convoy page's read model: the head, the graph, the wave table and the bead table, whole for
a small convoy and as a bounded overview for a big one."""

from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, NamedTuple

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Q
from django.utils import timezone

from convoys.core import dag as dagmod
from convoys.core import forecast
from convoys.core.formatting import several
from convoys.core.parsing import whole_number
from convoys.log.kinds import LOG
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    DONE_STATUSES,
    BeadFacts,
    Convoy,
    Event,
    Rig,
    SourcedRecord,
    Subscription,
    TrackedBead,
    Worker,
)
from convoys.read import snapshots
from convoys.read.graph import (
    Dag,
    bead_url_maker,
    convoy_graph,
    drawn_geometry,
    merge_edges,
    outside_convoy,
    overview_drawn,
)
from convoys.read.sizes import (
    BAND_PAGE,
    CHIPS_PER_WAVE,
    COLLAPSE_AT,
    CRITICAL_LISTED,
    MAX_CHIPS,
    MAX_ROWS,
    OVERVIEW_AT,
    ROWS_PAGE,
    TIMELINE,
)
from convoys.read.summaries import Params, Summary, convoy_summary, segment_of
from convoys.rules import causes as causemod
from convoys.rules import forecasting, merging, stranding
from convoys.rules.forecasting import estimate, samples
from convoys.rules.rows import TrackedRow


@dataclass
class ConvoyPage:
    convoy: Convoy
    summary: Summary
    listed: list[dict[str, Any]]  # the bead table's rows (unfinished first, capped when big)
    hidden_rows: int
    waves: list[dict[str, Any]]  # the wave table's rows
    frontier: int | None  # the first wave not done (None: all done)
    gated: list[dagmod.Gated]
    critical: list[tuple[str, str]]  # [(id, href)]
    eta: dict[str, Any] | None
    no_estimate: str | None  # why there is no ETA; None when closed (no landing ahead)
    timeline: list[Event]
    collapsed: list[int]
    focus: str
    focus_found: bool  # the focused id is drawn (else the page says it is not in the graph)
    summary_line: str
    dag: Dag | None  # None: nothing to draw
    big: bool
    capped: bool  # more unfinished beads than the bead table lists
    wave_of: dict[str, int]
    graph: dagmod.DAG
    user: User | None = None  # whose page (`subscribed`)
    sourced: SourcedRecord | None = None  # the convoy's record's source (`beads sync`)
    plan_moved: dict[str, Any] = field(default_factory=dict)
    # [(kind, count)] of the unfinished beads' causes
    causes: list[tuple[str, int]] = field(default_factory=list)
    waiting: bool = False  # some wait for capacity: any dispatch moves their positions
    watch_beads: list[str] = field(default_factory=list)  # untracked blockers and gates
    watch_kinds: list[str] = field(default_factory=list)  # town-wide events that move causes
    overview: bool = False  # OVERVIEW_AT: a page whose size does not grow with the convoy
    opened: list[int] = field(default_factory=list)  # waves opened in the overview (?open=N,M)
    # the wave rows listed (a window in an overview)
    bands: list[dict[str, Any]] = field(default_factory=list)
    wave_pages: int = 1
    wpage: int = 1
    bead_pages: int = 1
    bpage: int = 1
    critical_length: int = 0
    can_show_all: bool = True  # ?all=1 is honoured: at most CONVOY_SHOW_ALL_MAX beads

    blockers: Mapping[str, list[str]] = field(default_factory=dict, repr=False)

    @cached_property
    def rows(self) -> list[dict[str, Any]]:
        """The bead table's rows with what each shows beside (`rows_of`)."""
        return self.rows_of(r["id"] for r in self.listed)

    def rows_of(self, bead_ids: Iterable[str]) -> list[dict[str, Any]]:
        """Those of the listed rows, with each bead's blockers, where it comes from and its
        worker's last heartbeat (read for these rows only: a live update draws a few)."""
        wanted = set(bead_ids)
        rows = [r for r in self.listed if r["id"] in wanted]
        origins = SourcedRecord.of(r["id"] for r in rows)
        assignees = {r["bead"].assignee for r in rows if r["bead"] and r["bead"].assignee}
        seen = dict(Worker.objects.filter(name__in=assignees).values_list("name", "last_seen"))
        working = [r["id"] for r in rows if r["bead"] and r["bead"].status in ACTIVE_WORK_STATUSES]
        said = (
            dict(
                BeadFacts.objects.filter(bead_id__in=working)
                .exclude(last_log="")
                .values_list("bead_id", "last_log")
            )
            if working
            else {}
        )
        return [
            row
            | {
                "blocked_by": self.blockers.get(row["id"], []),
                "sourced": origins.get(row["id"]),
                "worker_seen": seen.get(row["bead"].assignee) if row["bead"] else None,
                "last_log": said.get(row["id"], ""),
            }
            for row in rows
        ]

    @property
    def unfinished(self) -> int:
        """Tracked beads not done (the close and land confirmations name how many)."""
        return self.summary["total"] - self.summary["done"] - self.summary["skipped"]

    @cached_property
    def subscribed(self) -> Subscription | None:
        """The user's subscription to the convoy (read when the page's actions are drawn)."""
        return Subscription.objects.filter(user=self.user, convoy=self.convoy).first()

    @cached_property
    def subscribed_to_all(self) -> bool:
        """The user hears about every convoy (a subscription without one)."""
        return Subscription.objects.filter(user=self.user, convoy__isnull=True).exists()

    def affected(self, bead_ids: Iterable[str]) -> set[str]:
        """The tracked beads whose row or node a change of `bead_ids` may alter: those beads
        and the beads they block (their readiness and blockers change)."""
        nodes = self.graph.nodes
        out = {i for i in bead_ids if i in nodes}
        for bead_id in list(out):
            out.update(nodes[bead_id].blocks)
        return out

    @cached_property
    def deadline(self) -> dict[str, Any] | None:
        """Its due time, what it says now and in words (`forecasting.deadline_of`)."""
        due = self.convoy.due_at
        if due is None:
            return None
        now = timezone.now()
        state, found = forecasting.deadline_of(self.convoy, now)
        return {"due": due, "state": state, "words": forecast.described(due, state, found, now)}

    @property
    def strategy(self) -> str:
        """How its work reaches the target: direct, mr or local (`merging.strategy`)."""
        return merging.strategy(self.convoy)

    @property
    def skips(self) -> bool:
        """Some of its beads were skipped: the wave table counts them in a column."""
        return bool(self.summary["skipped"])

    @property
    def merges(self) -> bool:
        """It merges by `mr`: its closed beads wait for their merge."""
        return self.strategy == merging.MR


def convoy_page(
    convoy: Convoy,
    params: Params,
    user: User,
    now: datetime,
    snapshot: snapshots.Snapshot | None = None,
) -> ConvoyPage:
    """The convoy page's read model, from a `snapshots.Snapshot` (loaded when not given): the
    beads and their causes, which rows are listed, which waves are drawn, the drawing, the
    timeline and the estimate."""
    snapshot = snapshot or snapshots.load(convoy, now)
    tracked, beads, graph, waves, gated = convoy_graph(convoy, snapshot)
    summary, ready_ids = convoy_summary(convoy, tracked, beads, now, snapshot)
    wave_number = dagmod.wave_of(waves)
    gated_ids = {g.id for g in gated}
    cause_of = causemod.for_convoy(convoy, now, known=snapshot)  # each unfinished bead's cause
    # ?all=1 draws and lists everything, up to CONVOY_SHOW_ALL_MAX beads (a bounded page).
    show_all = params.get("all") == "1" and len(tracked) <= settings.CONVOY_SHOW_ALL_MAX
    big = len(tracked) > COLLAPSE_AT and not show_all
    overview = len(tracked) > OVERVIEW_AT and not show_all
    href = bead_url_maker()
    # Per bead: its row, its node's state, the wave table.
    state = _state_rule(beads, ready_ids)
    facts = ConvoyPageFacts(
        cause_of, beads, graph, waves, wave_number, gated_ids, ready_ids, state, href
    )
    parts = _parts(facts, tracked, big, 0 if overview else None)
    listing = _listing(list(parts.rows.values()), params, big, overview)
    critical = dagmod.critical_path(graph, set(parts.done))
    focus = params.get("focus", "")
    shown = _shown_waves(facts, gated, parts, critical, params, overview)
    dag = None
    if waves or gated:
        geometry, key = drawn_geometry(
            convoy, graph, waves, gated, frozenset(shown.collapsed), shown.drawn
        )
        dag = Dag(
            geometry=geometry,
            fingerprint=key,
            states=parts.states,
            marks=_marks(tracked, beads, gated_ids, snapshot.rigs, summary["state"].ready),
            critical=critical,
            href=href,
            outside=outside_convoy(graph, geometry),
            merge_edges=merge_edges(snapshot.edges),
        )
    size, at = dagmod.max_parallelism(waves)
    no_estimate = stranding.estimate_blocker(convoy, summary["state"])
    return ConvoyPage(
        convoy=convoy,
        summary=summary,
        listed=listing.rows,
        blockers=snapshot.blockers,
        hidden_rows=listing.hidden,
        waves=parts.waves,
        frontier=parts.frontier,
        gated=gated,
        critical=[(i, href(i)) for i in (critical[:CRITICAL_LISTED] if overview else critical)],
        critical_length=len(critical),
        can_show_all=len(tracked) <= settings.CONVOY_SHOW_ALL_MAX,
        eta=estimate(
            samples(beads.values()),
            len(critical),
            now,
            convoy,
            summary["total"] - summary["done"] - summary["skipped"],
        )
        if critical and no_estimate == ""
        else None,
        no_estimate=no_estimate,
        timeline=_timeline(convoy),
        collapsed=sorted(shown.collapsed),
        focus=focus,
        focus_found=dag is not None and bool(focus) and focus in dag.geometry["nodes"],
        summary_line=f"{several(sum(len(w) for w in waves), 'bead')} across "
        f"{several(len(waves), 'wave')} (max parallelism: {size} in wave {at})",
        dag=dag,
        big=big,
        capped=listing.capped,
        overview=overview,
        opened=shown.opened,
        bands=shown.bands,
        wave_pages=shown.wave_pages,
        wpage=shown.wpage,
        bead_pages=listing.pages,
        bpage=listing.page,
        wave_of=wave_number,
        graph=graph,
        user=user,
        sourced=convoy.sourced,
        plan_moved=(convoy.extra or {}).get("plan", {}),
        causes=causemod.counts(cause_of),
        waiting=any(c["kind"] == "waiting-for-capacity" for c in cause_of.values()),
        watch_beads=causemod.outside_blockers(cause_of, tracked),
        watch_kinds=causemod.watch_kinds(cause_of),
    )


def _marks(
    tracked: list[str],
    beads: Mapping[str, TrackedRow],
    gated: Set[str],
    rigs: Mapping[str, str],
    stranded: Iterable[str],
) -> dict[str, list[str]]:
    """{bead: ["gated", "parked", "stranded"] (those that hold)} for the marked beads, by id:
    the few gated and stranded ones, and (only while a rig is parked) those on parked rigs."""
    found: dict[str, list[str]] = {}
    for bead_id in gated:
        found.setdefault(bead_id, []).append("gated")
    parked = {name for name, state in rigs.items() if state != Rig.ACTIVE}
    if parked:
        for bead_id in tracked:
            row = beads.get(bead_id)
            if row is not None and row.rig_id in parked:
                found.setdefault(bead_id, []).append("parked")
    for bead_id in stranded:
        found.setdefault(bead_id, []).append("stranded")
    return {i: found[i] for i in sorted(found)}


def band_window(
    wave_rows: list[dict[str, Any]], frontier: int | None, wpage: str | None = None
) -> tuple[list[dict[str, Any]], int, int]:
    """An overview's wave rows listed: (BAND_PAGE rows, pages, page), the page `wpage` or by
    default the one holding the frontier."""
    pages = max(1, -(-len(wave_rows) // BAND_PAGE))
    page = _page_number(wpage, pages, ((frontier or 1) - 1) // BAND_PAGE + 1)
    return wave_rows[(page - 1) * BAND_PAGE : page * BAND_PAGE], pages, page


def _page_number(value: str | None, pages: int, default: int) -> int:
    """A 1-based page number from a query parameter (anything else: `default`), clamped."""
    number = whole_number(value)
    return min(max(default if number is None else number, 1), pages)


def _wave_rows(
    waves: list[list[str]],
    beads: dict[str, TrackedRow],
    ready_ids: Set[str],
    graph: dagmod.DAG,
    state: Callable[[str], str],
    href: Callable[[str], str],
    big: bool,
    cause_of: Mapping[str, dict[str, Any]],
    chips: int | None = None,
) -> tuple[list[dict[str, Any]], int | None]:
    """The wave table's rows and the frontier (the first wave not done)."""
    counts = [_wave_counts(wave, beads, ready_ids) for wave in waves]
    plan = _chip_plan(waves, counts, big, chips)
    rows = [
        _wave_row(number, wave, n, shown, graph, state, href, cause_of)
        for number, (wave, n, shown) in enumerate(zip(waves, counts, plan, strict=True), start=1)
    ]
    return rows, _frontier(rows)


def _wave_counts(
    wave: list[str], beads: dict[str, TrackedRow], ready_ids: Set[str]
) -> dict[str, int]:
    counts = {"done": 0, "skipped": 0, "submitted": 0, "active": 0, "ready": 0, "blocked": 0}
    for bead_id in wave:
        bead = beads.get(bead_id)
        counts[segment_of(bead, ready_ids) if bead else "blocked"] += 1
    return counts


def _chip_plan(
    waves: list[list[str]], counts: list[dict[str, int]], big: bool, chips: int | None
) -> list[int]:
    """How many bead links each wave row lists: CHIPS_PER_WAVE at most, MAX_CHIPS in all on a
    big convoy (whose done waves list none), `chips` in all when given. It depends on which
    waves are done only."""
    left = MAX_CHIPS if big else sum(len(w) for w in waves)
    if chips is not None:
        left = chips
    plan = []
    for wave, n in zip(waves, counts, strict=True):
        shown = (
            0 if big and n["done"] + n["skipped"] == len(wave) else min(len(wave), CHIPS_PER_WAVE)
        )
        shown = min(shown, max(left, 0))
        left -= shown
        plan.append(shown)
    return plan


def _wave_row(
    number: int,
    wave: list[str],
    counts: dict[str, int],
    shown: int,
    graph: dagmod.DAG,
    state: Callable[[str], str],
    href: Callable[[str], str],
    cause_of: Mapping[str, dict[str, Any]],
) -> dict[str, Any]:
    return {
        "number": number,
        "counts": counts,
        "total": len(wave),
        "hidden": len(wave) - shown,
        "causes": causemod.summary([cause_of.get(i) for i in wave]),
        "beads": [
            {
                "id": i,
                "href": href(i),
                "title": graph.nodes[i].title,
                "state": state(i),
                "blocked_by": graph.nodes[i].blocked_by,
                "cause": cause_of.get(i),
            }
            for i in wave[:shown]
        ],
    }


def _frontier(wave_rows: list[dict[str, Any]]) -> int | None:
    for row in wave_rows:
        if row["counts"]["done"] + row["counts"].get("skipped", 0) < row["total"]:
            return int(row["number"])
    return None


@dataclass(frozen=True)
class BeadParts:
    """What the convoy page derives per tracked bead."""

    rows: dict[str, dict[str, Any]]  # {id: the bead table's row}, in tracking order
    states: dict[str, tuple[str, str]]  # {id: (title, state)}: the DAG's nodes
    waves: list[dict[str, Any]]  # the wave table's rows
    frontier: int | None
    done: frozenset[str]


class ConvoyPageFacts(NamedTuple):
    """What the convoy page derives each bead's parts from."""

    cause_of: causemod.Causes
    beads: dict[str, TrackedRow]
    graph: dagmod.DAG
    waves: list[list[str]]
    wave_number: Mapping[str, int]
    gated: Set[str]
    ready_ids: Set[str]
    state: Callable[[str], str]
    href: Callable[[str], str]

    def row(self, bead_id: str) -> dict[str, Any]:
        """The bead table's row of `bead_id`."""
        return {
            "id": bead_id,
            "bead": self.beads.get(bead_id),
            "state": self.state(bead_id),
            "wave": self.wave_number.get(bead_id),
            "gated": bead_id in self.gated,
            "cause": self.cause_of.get(bead_id),
            "href": self.href(bead_id),
        }

    def node(self, bead_id: str) -> tuple[str, str]:
        """(title, state) of `bead_id`'s node in the DAG."""
        nodes = self.graph.nodes
        return (nodes[bead_id].title if bead_id in nodes else "", self.state(bead_id))


def _parts(facts: ConvoyPageFacts, tracked: list[str], big: bool, chips: int | None) -> BeadParts:
    f = facts
    wave_rows, frontier = _wave_rows(
        f.waves, f.beads, f.ready_ids, f.graph, f.state, f.href, big, f.cause_of, chips
    )
    return BeadParts(
        rows={i: f.row(i) for i in tracked},
        states={i: f.node(i) for i in tracked},
        waves=wave_rows,
        frontier=frontier,
        done=frozenset(i for i in tracked if i in f.beads and f.beads[i].status in DONE_STATUSES),
    )


def _state_rule(beads: Mapping[str, TrackedRow], ready_ids: Set[str]) -> Callable[[str], str]:
    """A bead's state as the page's nodes and rows show it."""

    def state(bead_id: str) -> str:
        bead = beads.get(bead_id)
        if bead is None:
            return "unknown"
        if bead.pk in ready_ids:
            return "ready"
        # Open and not ready: waiting on something (its cause says what), as the bar counts it.
        return "blocked" if bead.status == "open" else bead.status

    return state


class Listing(NamedTuple):
    """The bead table's rows on this page, how many are left out, and its pages."""

    rows: list[dict[str, Any]]
    hidden: int = 0
    capped: bool = False
    pages: int = 1
    page: int = 1


def _listing(rows: list[dict[str, Any]], params: Params, big: bool, overview: bool) -> Listing:
    """Every row of a small convoy; a big one's unfinished rows first, MAX_ROWS of them; an
    overview's unfinished rows, ROWS_PAGE a page (?bpage=N). The done ones are counted."""
    if not big and not overview:
        return Listing(rows)
    unfinished = [r for r in rows if r["state"] not in DONE_STATUSES]
    if overview:
        pages = max(1, -(-len(unfinished) // ROWS_PAGE))
        page = _page_number(params.get("bpage"), pages, 1)
        listed = unfinished[(page - 1) * ROWS_PAGE : page * ROWS_PAGE]
        return Listing(listed, len(rows) - len(unfinished), pages > 1, pages, page)
    hidden = len(rows) - min(len(unfinished), MAX_ROWS)
    return Listing(unfinished[:MAX_ROWS], hidden, len(unfinished) > MAX_ROWS)


class ShownWaves(NamedTuple):
    """Which waves the drawing shows: collapsed (all done), drawn (an overview's part of each),
    opened (?open=N,M); and the wave table's window of bands."""

    collapsed: set[int]
    drawn: dict[int, list[str]] | None
    opened: list[int]
    bands: list[dict[str, Any]]
    wave_pages: int
    wpage: int


def _shown_waves(
    facts: ConvoyPageFacts,
    gated: list[dagmod.Gated],
    parts: BeadParts,
    critical: list[str],
    params: Params,
    overview: bool,
) -> ShownWaves:
    focus = params.get("focus", "")
    if overview:
        drawn, opened = overview_drawn(
            facts.waves,
            gated,
            parts.frontier,
            critical,
            facts.wave_number,
            focus,
            params,
            parts.done,
        )
        bands, wave_pages, wpage = band_window(parts.waves, parts.frontier, params.get("wpage"))
        return ShownWaves(set(), drawn, opened, bands, wave_pages, wpage)
    collapsed: set[int] = set()
    if len(facts.graph.nodes) > COLLAPSE_AT and params.get("expand") != "1":
        collapsed = {
            r["number"]
            for r in parts.waves
            if r["counts"]["done"] + r["counts"].get("skipped", 0) == r["total"]
        }
        if focus in facts.wave_number:  # the focused bead is drawn
            collapsed.discard(facts.wave_number[focus])
    return ShownWaves(collapsed, None, [], parts.waves, 1, 1)


def _timeline(convoy: Convoy) -> list[Event]:
    """The convoy's last TIMELINE events: its own and its tracked beads'."""
    tracked = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    events = Event.objects.filter(Q(convoy_id=convoy.pk) | Q(bead_id__in=tracked)).exclude(kind=LOG)
    return list(events.order_by("-seq")[:TIMELINE])
