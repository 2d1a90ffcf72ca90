"""A big convoy's page, read from the read model kept with the event log and a window of beads.

A convoy tracking more than `sizes.OVERVIEW_AT` beads is shown as an overview: its counts,
its waves' counts and causes, its critical path and its counts by cause are what the
projection keeps on its `ConvoyFacts` row (and each bead's wave on its tracking row); the
beads it lists and draws (a page of unfinished beads, the frontier wave and the waves opened,
the gated ones, the next beads of the critical path, the focused bead, the timeline's wave)
are read by id, a few hundred at most. So the page costs the same whichever web process
answers, on a first view, a hard reload or a live update, and whatever the convoy's size.
"""

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Q

from convoys.core import dag as dagmod
from convoys.core import ids
from convoys.core.formatting import several
from convoys.core.parsing import whole_number
from convoys.log.kinds import LOG
from convoys.models import DONE_STATUSES, Bead, BeadFacts, Convoy, ConvoyFacts, Event, TrackedBead
from convoys.read import convoy_page, projection, snapshots, summaries, timeline
from convoys.read.convoy_page import ConvoyPage
from convoys.read.graph import (
    Dag,
    bead_url_maker,
    drawn_geometry,
    merge_edges,
    outside_convoy,
    with_ghosts,
)
from convoys.read.sizes import (
    CRITICAL_DRAWN,
    CRITICAL_LISTED,
    OPEN_MAX,
    OVERVIEW_AT,
    ROWS_PAGE,
    TIMELINE,
    WAVE_DRAWN,
)
from convoys.read.summaries import Params
from convoys.rules import capacity, forecasting, stranding
from convoys.rules import causes as causemod
from convoys.rules.rows import read_rows

SAMPLES = 500  # the latest closes the ETA's median is taken over


def applies(convoy: Convoy, params: Params) -> ConvoyFacts | None:
    """The kept facts of `convoy` when its page is an overview (else None): more than
    OVERVIEW_AT beads and not `?all=1` within CONVOY_SHOW_ALL_MAX."""
    facts = ConvoyFacts.objects.filter(pk=convoy.pk).first()
    if facts is None or facts.total <= OVERVIEW_AT:
        return None
    if params.get("all") == "1" and facts.total <= settings.CONVOY_SHOW_ALL_MAX:
        return None
    return facts


def page(
    convoy: Convoy, facts: ConvoyFacts, params: Params, user: User, now: datetime
) -> tuple[ConvoyPage, snapshots.Snapshot]:
    """The overview page of `convoy` from its kept `facts`, and the window of its beads it
    read (what the page's timeline reads instead of a snapshot)."""
    summary = summaries.convoy_summaries([convoy], now)[convoy.pk]
    wave_rows = [_wave_row(n, row) for n, row in enumerate(facts.waves or [], start=1)]
    frontier = convoy_page._frontier(wave_rows)
    critical: list[str] = list(facts.critical or [])
    focus = params.get("focus", "")
    if ids.id_problem(focus):
        focus = ""  # a bead that cannot exist is not looked up
    opened = _opened(params, len(wave_rows))
    shown = sorted({*opened, *([frontier] if frontier else [])})
    focus_wave = _waves_of(convoy, [focus]).get(focus) if focus else None
    if focus_wave:
        shown = sorted({*shown, focus_wave})
    drawn = {n: _members(convoy, n, WAVE_DRAWN) for n in shown}
    drawn[0] = _members(convoy, 0, WAVE_DRAWN)
    unfinished = max(summary["total"] - summary["done"], 0)
    bead_pages = max(1, -(-unfinished // ROWS_PAGE))
    bpage = convoy_page._page_number(params.get("bpage"), bead_pages, 1)
    listed_ids = _unfinished(convoy, (bpage - 1) * ROWS_PAGE, ROWS_PAGE)
    twave = whole_number(params.get("twave"))
    timeline_wave = twave if twave and 1 <= twave <= len(wave_rows) else frontier or len(wave_rows)
    timeline_ids = _members(convoy, timeline_wave, timeline.GANTT_ROWS, done_last=False)
    extra = [i for i in [*critical[:CRITICAL_DRAWN], focus] if i]
    window = list(
        dict.fromkeys(
            [*listed_ids, *(i for ids in drawn.values() for i in ids), *extra, *timeline_ids]
        )
    )
    wave_of = _waves_of(convoy, window)
    for bead_id in extra:  # the critical path's next beads and the focused one, in their wave
        number = wave_of.get(bead_id)
        if number is not None and bead_id not in drawn.setdefault(number, []):
            drawn[number].append(bead_id)
    drawn = {n: ids for n, ids in drawn.items() if n == 0 or n in shown or ids}
    snapshot = snapshots.load_window(convoy, window, now)
    cause_of = causemod.load(window, window, now, known=snapshot)
    graph = _graph(convoy, snapshot)
    gated_ids = {i for i, n in wave_of.items() if n == 0}
    href = bead_url_maker()
    ready_ids = snapshot.ready

    def state(bead_id: str) -> str:
        bead = snapshot.beads.get(bead_id)
        if bead is None:
            return "unknown"
        if bead_id in ready_ids:
            return "ready"
        return "blocked" if bead.status == "open" else bead.status

    bead_facts = convoy_page.ConvoyPageFacts(
        cause_of, snapshot.beads, graph, [], wave_of, gated_ids, ready_ids, state, href
    )
    rows = [bead_facts.row(i) for i in listed_ids]
    # the waves by size only: an overview lays out and weighs a wave by its length
    sizes = cast(list[list[str]], [range(w["total"]) for w in wave_rows])
    dag = None
    focus_found = False
    if wave_rows or gated_ids:
        geometry, key = drawn_geometry(
            convoy, graph, sizes, [dagmod.Gated(i, []) for i in drawn[0]], frozenset(), drawn
        )
        focus_found = bool(focus) and focus in geometry["nodes"]
        drawn_ids = [i for ids in drawn.values() for i in ids]
        dag = Dag(
            geometry=geometry,
            fingerprint=key,
            states={i: bead_facts.node(i) for i in drawn_ids},
            marks=convoy_page._marks(drawn_ids, snapshot.beads, gated_ids, snapshot.rigs, ()),
            critical=critical,
            href=href,
            outside=outside_convoy(graph, geometry),
            merge_edges=merge_edges(snapshot.edges),
        )
    bands, wave_pages, wpage = convoy_page.band_window(wave_rows, frontier, params.get("wpage"))
    size, at = dagmod.max_parallelism(sizes)
    no_estimate = stranding.estimate_blocker(convoy, summary["state"])
    by_cause, waiting = _causes(convoy, facts, now)
    tracking = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    events = list(
        Event.objects.filter(Q(convoy_id=convoy.pk) | Q(bead_id__in=tracking))
        .exclude(kind=LOG)
        .order_by("-seq")[:TIMELINE]
    )
    overview = ConvoyPage(
        convoy=convoy,
        summary=summary,
        listed=rows,
        blockers=snapshot.blockers,
        hidden_rows=summary["done"],
        waves=wave_rows,
        frontier=frontier,
        gated=[dagmod.Gated(i, _gates_of(cause_of.get(i))) for i in drawn[0]],
        critical=[(i, href(i)) for i in critical[:CRITICAL_LISTED]],
        critical_length=len(critical),
        can_show_all=summary["total"] <= settings.CONVOY_SHOW_ALL_MAX,
        eta=forecasting.estimate(
            _samples(convoy, snapshot),
            len(critical),
            now,
            convoy,
            summary["total"] - summary["done"],
        )
        if critical and no_estimate == ""
        else None,
        no_estimate=no_estimate,
        timeline=events,
        collapsed=[],
        focus=focus,
        focus_found=focus_found,
        summary_line=f"{several(sum(len(s) for s in sizes), 'bead')} across "
        f"{several(len(sizes), 'wave')} (max parallelism: {size} in wave {at})",
        dag=dag,
        big=True,
        capped=bead_pages > 1,
        overview=True,
        opened=opened,
        bands=bands,
        wave_pages=wave_pages,
        wpage=wpage,
        bead_pages=bead_pages,
        bpage=bpage,
        wave_of=wave_of,
        graph=graph,
        user=user,
        sourced=convoy.sourced,
        plan_moved=(convoy.extra or {}).get("plan", {}),
        causes=by_cause,
        waiting=waiting,
        watch_beads=causemod.outside_blockers(cause_of, window),
        watch_kinds=causemod.watch_kinds(cause_of),
    )
    return overview, snapshot


def _wave_row(number: int, kept: Mapping[str, Any]) -> dict[str, Any]:
    counts = {
        k: int(kept.get(k) or 0)
        for k in ("done", "skipped", "submitted", "active", "ready", "blocked")
    }
    total = int(kept.get("total") or 0)
    return {
        "number": number,
        "counts": counts,
        "total": total,
        "hidden": total,
        "causes": causemod.summary_of(kept.get("causes") or {}),
        "beads": [],
    }


def _opened(params: Params, waves: int) -> list[int]:
    """The waves opened in the drawing (?open=N,M), at most OPEN_MAX."""
    opened: list[int] = []
    for part in params.get("open", "").split(","):
        number = whole_number(part)
        if number is not None and 1 <= number <= waves and number not in opened:
            opened.append(number)
    return sorted(opened[:OPEN_MAX])


def _tables() -> tuple[str, str]:
    quote = connection.ops.quote_name
    return quote(TrackedBead._meta.db_table), quote(BeadFacts._meta.db_table)


def _members(convoy: Convoy, wave: int, limit: int, done_last: bool = True) -> list[str]:
    """Up to `limit` beads of wave `wave` (0: the gated ones) by id, unfinished first."""
    tracked, facts = _tables()
    order = "(f.segment = 'done'), t.bead_id" if done_last else "t.bead_id"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT t.bead_id FROM {tracked} t LEFT JOIN {facts} f ON f.bead_id = t.bead_id "
            f"WHERE t.convoy_id = %s AND t.wave = %s ORDER BY {order} LIMIT %s",
            [convoy.pk, wave, limit],
        )
        return [row[0] for row in cursor.fetchall()]


def _unfinished(convoy: Convoy, offset: int, limit: int) -> list[str]:
    """A page of the convoy's beads not done, in tracking order."""
    tracked, facts = _tables()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT t.bead_id FROM {tracked} t LEFT JOIN {facts} f ON f.bead_id = t.bead_id "
            "WHERE t.convoy_id = %s AND (f.segment IS NULL OR f.segment <> 'done') "
            "ORDER BY t.position, t.id LIMIT %s OFFSET %s",
            [convoy.pk, limit, offset],
        )
        return [row[0] for row in cursor.fetchall()]


def _waves_of(convoy: Convoy, bead_ids: Sequence[str]) -> dict[str, int]:
    """{bead: its kept wave} of those of `bead_ids` in a wave (0: gated)."""
    rows = TrackedBead.objects.filter(convoy=convoy, bead_id__in=list(bead_ids), wave__isnull=False)
    return {bead_id: wave or 0 for bead_id, wave in rows.values_list("bead_id", "wave")}


def _graph(convoy: Convoy, window: snapshots.Snapshot) -> dagmod.DAG:
    """The window's beads and the edges among them; a blocker outside the window that the
    convoy tracks is no ghost (it is drawn in its own wave, or counted there)."""
    graph = projection.build_graph(window.beads, window.edges, window.gates)[0]
    targets = {t for t, _ in graph.ghost_edges}
    if targets:
        tracked = set(
            TrackedBead.objects.filter(convoy=convoy, bead_id__in=sorted(targets)).values_list(
                "bead_id", flat=True
            )
        )
        graph.ghost_edges = [(t, i) for t, i in graph.ghost_edges if t not in tracked]
    return with_ghosts(graph)


def _gates_of(cause: Mapping[str, Any] | None) -> list[str]:
    return list(cause.get("gates") or []) if cause and cause.get("kind") == "gated" else []


def _causes(
    convoy: Convoy, facts: ConvoyFacts, now: datetime
) -> tuple[list[tuple[str, int]], bool]:
    """The kept counts by cause; the beads kept as ready asked of the capacity queues when
    the convoy or the town has a limit (their places move with every dispatch)."""
    kept = dict(facts.causes or {})
    ready = kept.get("ready", 0)
    if ready and (convoy.max_in_flight or capacity.cap()):
        tracked, table = _tables()
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT t.bead_id FROM {tracked} t JOIN {table} f ON f.bead_id = t.bead_id "
                "WHERE t.convoy_id = %s AND f.cause = 'ready'",
                [convoy.pk],
            )
            ids = [row[0] for row in cursor.fetchall()]
        asked = causemod.counted(causemod.load(ids, ids, now).values())
        kept.pop("ready")
        for kind, n in asked:
            kept[kind] = kept.get(kind, 0) + n
    ordered = causemod.counted_of(kept)
    return ordered, any(kind == "waiting-for-capacity" for kind, _ in ordered)


def _samples(convoy: Convoy, window: snapshots.Snapshot) -> forecasting.Samples:
    """The ETA's samples: the convoy's latest SAMPLES closes (and the window's rigs)."""
    tracking = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    closed = read_rows(
        Bead.objects.filter(pk__in=tracking, status__in=DONE_STATUSES)
        .exclude(closed_at=None)
        .order_by("-closed_at")[:SAMPLES]
    )
    return forecasting.samples([*closed.values(), *_open_rows(window.beads.values())])


def _open_rows(rows: Iterable[Any]) -> list[Any]:
    return [r for r in rows if r.status not in DONE_STATUSES]
