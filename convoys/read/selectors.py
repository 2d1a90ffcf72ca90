"""Read-side queries shared by pages, API and CLI; each runs a fixed number of queries."""

import copy
import statistics
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, NamedTuple, TypedDict

from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db.models import Max, Min, Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from convoys.core import dag as dagmod
from convoys.core import layout
from convoys.core.formatting import ACTOR_CHANNELS, duration, percent_done, person, several
from convoys.core.ids import quoted_url_segment
from convoys.core.parsing import whole_number
from convoys.log.events import last_seq
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    CONVOY_OPEN,
    CONVOY_STATUSES,
    DONE_STATUSES,
    STAGED_STATUSES,
    Bead,
    Convoy,
    ConvoyFacts,
    Dependency,
    Dispatch,
    Event,
    Rig,
    SourcedRecord,
    Subscription,
    TrackedBead,
    Worker,
    status_symbol,
)
from convoys.read import projection, snapshots
from convoys.rules import breaker, capacity, stranding
from convoys.rules import causes as causemod
from convoys.rules.readiness import blocked_by, is_ready, ready_beads
from convoys.rules.rows import (
    Changes as Changes,  # and changes_since: re-exported, views read them here
)
from convoys.rules.rows import TrackedRow, failed_beads
from convoys.rules.rows import changes_since as changes_since
from convoys.services import notify

SEGMENTS = projection.SEGMENTS
segment_for = projection.segment_for  # the one segment rule, re-exported for the pages


class Summary(TypedDict):
    """A convoy's progress (`summarise`): beads per segment, their total and percents, when
    its beads last changed, the one stranded rule's verdict."""

    done: int
    active: int
    failed: int
    ready: int
    blocked: int
    unknown: int
    total: int
    last_activity: datetime
    spin: bool  # a spin warning in the last hour
    percent: dict[str, float]  # per segment
    percent_complete: int  # 100 only when all are done
    state: stranding.Verdict
    stranded: bool


class ConvoyGraph(NamedTuple):
    """What `convoy_graph` reads of a convoy: its tracked ids (in order), their rows, the DAG,
    the waves and the gated beads."""

    tracked: list[str]
    beads: dict[str, TrackedRow]
    graph: dagmod.DAG
    waves: list[list[str]]
    gated: list[dagmod.Gated]


Params = Mapping[str, str]  # a page's query parameters (request.GET)
# (graph, waves, gated, gates): what a snapshot's graph is built into
Built = tuple[dagmod.DAG, list[list[str]], list[dagmod.Gated], list[snapshots.Gate]]


def segment_of(
    bead: TrackedRow | Bead | None, ready_ids: Set[str], failed_ids: Set[str] = frozenset()
) -> str:
    if bead is None:
        return "unknown"
    return segment_for(bead.pk, bead.status, ready_ids, failed_ids)


def progress_json(summary: Summary) -> dict[str, int]:
    """Seed 003's progress shape, from a summary."""
    return {
        "total": summary["total"],
        "complete": summary["done"],
        "inProgress": summary["active"],
        "ready": summary["ready"],
        "blocked": summary["blocked"],
        "failed": summary["failed"],
        "unknown": summary["unknown"],
        "percentComplete": summary["percent_complete"],
    }


def convoy_summary(
    convoy: Convoy,
    tracked: list[str],
    beads: dict[str, TrackedRow],
    now: datetime | None = None,
    snapshot: snapshots.Snapshot | None = None,
) -> tuple[Summary, Set[str]]:
    """One convoy's summary and its ready bead ids from beads already read by
    `tracked_beads` (one query for the ready rule, one for spin), or with a
    `snapshots.Snapshot` (its ready, failed and blocker sets: no query for those)."""
    now = now or timezone.now()
    if snapshot is not None:
        kept = _kept_summary(convoy, tracked, beads, now, snapshot)
        return _after_grace(convoy, kept, now), snapshot.ready
    tracking = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    ready_ids = set(
        ready_beads(Bead.objects.filter(pk__in=tracking), now).values_list("pk", flat=True)
    )
    failed = failed_beads(Bead.objects.filter(pk__in=tracking))
    rows = [(convoy.pk, bead_id) for bead_id in tracked]
    loaded = _statuses(beads, beads)
    verdicts = stranding.classify(
        [convoy], now, explain=True, loaded=(rows, loaded, ready_ids), facts=None
    )
    spin = spinning([convoy.pk], now)
    summary = summarise([convoy], rows, loaded, ready_ids, spin, verdicts, failed)[convoy.pk]
    return _after_grace(convoy, summary, now), ready_ids


def _after_grace(convoy: Convoy, summary: Summary, now: datetime) -> Summary:
    """The summary with the stranded flag pages show (`stranding.shown_stranded`): the read
    model knows since when the convoy has been feedable."""
    if summary["state"].kind != stranding.FEEDABLE:
        return summary
    since = (
        ConvoyFacts.objects.filter(pk=convoy.pk).values_list("feedable_since", flat=True).first()
    )
    return {**summary, "stranded": stranding.shown_stranded(summary["state"], since, now)}


def _kept_summary(
    convoy: Convoy,
    tracked: list[str],
    beads: dict[str, TrackedRow],
    now: datetime,
    snapshot: snapshots.Snapshot,
) -> Summary:
    """The summary from a snapshot: its statuses, ready, failed and blocker sets, and the
    ready beads the feeders skip (parked or cooling down)."""
    ready = snapshot.ready
    kept = _cooling(ready, now)
    loaded = _statuses(beads, beads)
    rows = [(convoy.pk, bead_id) for bead_id in tracked]
    verdicts = stranding.classify(
        [convoy],
        now,
        explain=True,
        loaded=(rows, loaded, ready),
        facts=(snapshot.beads, snapshot.blockers, snapshot.target_types, snapshot.rigs),
        cap=snapshot.cap,
        cooling=kept.parked | kept.recent,
    )
    spin = spinning([convoy.pk], now)
    return summarise([convoy], rows, loaded, ready, spin, verdicts, snapshot.failed)[convoy.pk]


class Cooling(NamedTuple):
    """The ready beads the feeders skip: parked by the breaker (until a retry: an event names
    the bead) and cooling down after a failed dispatch (until the cooldown runs out)."""

    parked: frozenset[str]
    recent: frozenset[str]


def _cooling(ready: Set[str], now: datetime) -> Cooling:
    found = stranding.cooling_among(ready, now)
    parked = frozenset(breaker.parked_among(sorted(found))) if found else frozenset()
    return Cooling(parked, frozenset(found) - parked)


def _statuses(
    bead_ids: Iterable[str], beads: Mapping[str, TrackedRow]
) -> dict[str, tuple[Any, ...]]:
    """{id: (status, updated_at)} of those of `bead_ids` that `beads` holds."""
    return {i: (beads[i].status, beads[i].updated_at) for i in bead_ids if i in beads}


def convoy_summaries(convoys: Sequence[Convoy], now: datetime | None = None) -> dict[str, Summary]:
    """{convoy id: counts per segment, total, last activity, stranded and spin flags}, read
    from the read model kept with the event log (`projection`): one row per convoy, and one
    query for the spin flags, whatever the number of beads."""
    now = now or timezone.now()
    ids = [c.pk for c in convoys]
    kept = {
        row["convoy_id"]: row
        for row in ConvoyFacts.objects.filter(convoy_id__in=ids).values(
            "convoy_id", *projection.CONVOY_FIELDS
        )
    }
    spin = spinning(ids, now)
    result: dict[str, Summary] = {}
    for convoy in convoys:
        facts = kept.get(convoy.pk)
        if facts is None:  # derived in a transaction that has not committed yet
            facts = projection.derive_convoys([convoy.pk], now).get(convoy.pk, {})
        result[convoy.pk] = _summary_of(convoy, facts, convoy.pk in spin, now)
    return result


def _summary_of(convoy: Convoy, facts: Mapping[str, Any], spin: bool, now: datetime) -> Summary:
    n = {segment: int(facts.get(segment) or 0) for segment in SEGMENTS}
    total = int(facts.get("total") or 0)
    share = total or 1
    verdict = (
        stranding.Verdict(facts["verdict"], facts["reason"], facts["code"])
        if facts.get("verdict")
        else stranding.NOT_OPEN
    )
    return Summary(
        done=n["done"],
        active=n["active"],
        failed=n["failed"],
        ready=n["ready"],
        blocked=n["blocked"],
        unknown=n["unknown"],
        total=total,
        last_activity=facts.get("last_activity") or convoy.updated_at,
        spin=spin,
        percent={k: round(100 * n[k] / share, 2) for k in SEGMENTS},
        percent_complete=percent_done(n["done"], total),
        state=verdict,
        stranded=stranding.shown_stranded(verdict, facts.get("feedable_since"), now),
    )


def spinning(convoy_ids: Iterable[str], now: datetime) -> set[str]:
    """The convoys that recorded a spin warning in the last hour."""
    return set(
        Event.objects.filter(
            kind="spin", convoy_id__in=convoy_ids, created_at__gte=now - timedelta(hours=1)
        ).values_list("convoy_id", flat=True)
    )


def summarise(
    convoys: Iterable[Convoy],
    rows: Iterable[tuple[str, str]],
    beads: Mapping[str, tuple[Any, ...]],
    ready_ids: Set[str],
    spin: Set[str],
    verdicts: Mapping[str, stranding.Verdict],
    failed_ids: Set[str] = frozenset(),
    latest: Mapping[str, datetime | None] | None = None,
) -> dict[str, Summary]:
    """The summaries from loaded data: `rows` (convoy id, bead id), `beads` {id: (status,
    updated_at)}, the ready bead ids, the spinning convoy ids, `stranding.classify` and the
    beads whose last dispatch failed. With `latest` ({convoy id: its beads' latest update}),
    `beads` need only hold (status,)."""
    counts: dict[str, dict[str, int]] = {}
    last: dict[str, datetime] = {}
    for convoy in convoys:
        counts[convoy.pk] = dict.fromkeys(SEGMENTS, 0)
        newest = latest.get(convoy.pk) if latest is not None else None
        last[convoy.pk] = max(convoy.updated_at, newest) if newest else convoy.updated_at
    for convoy_id, bead_id in rows:
        status, *updated = beads.get(bead_id, (None, None))
        counts[convoy_id][segment_for(bead_id, status, ready_ids, failed_ids)] += 1
        if latest is None and updated[0] is not None and updated[0] > last[convoy_id]:
            last[convoy_id] = updated[0]
    result: dict[str, Summary] = {}
    for convoy_id, n in counts.items():
        total = sum(n.values())
        share = total or 1
        result[convoy_id] = Summary(
            done=n["done"],
            active=n["active"],
            failed=n["failed"],
            ready=n["ready"],
            blocked=n["blocked"],
            unknown=n["unknown"],
            total=total,
            last_activity=last[convoy_id],
            spin=convoy_id in spin,
            percent={k: round(100 * n[k] / share, 2) for k in SEGMENTS},
            percent_complete=percent_done(n["done"], total),
            # The one stranded rule (stranding.py): kind, reason and badge words.
            state=verdicts[convoy_id],
            stranded=verdicts[convoy_id].stranded,
        )
    return result


def convoy_status_json(convoy: Convoy, window: slice | None = None) -> dict[str, Any]:
    """The `convoy status --json` shape; `window`: only those tracked beads (in position
    order) are listed, the counts cover them all."""
    every = list(TrackedBead.objects.filter(convoy=convoy).values_list("bead_id", flat=True))
    tracked = every if window is None else every[window]
    cause_of = causemod.for_convoy(convoy)
    beads = Bead.objects.in_bulk(tracked)
    workers = dict(
        Worker.objects.filter(
            name__in={b.assignee for b in beads.values() if b.assignee}
        ).values_list("name", "last_seen")
    )
    origins = SourcedRecord.of(tracked)
    items = []
    for bead_id in tracked:
        bead = beads.get(bead_id)
        origin = origins.get(bead_id)
        items.append(
            {
                "id": bead_id,
                "title": bead.title if bead else "",
                "status": bead.status if bead else "unknown",
                "issue_type": bead.issue_type if bead else "",
                "assignee": bead.assignee if bead else "",
                "rig": (bead.rig_id or "") if bead else "",
                "worker_seen": workers.get(bead.assignee) if bead and bead.assignee else None,
                "cause": causemod.jsonable(cause_of.get(bead_id)),
                "source": origin.source if origin else None,
                "missing_from_source": bool(origin and origin.missing_since),
            }
        )
    if window is None:
        completed = sum(1 for i in items if i["status"] in DONE_STATUSES)
    else:
        tracking = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
        done = Bead.objects.filter(pk__in=tracking, status__in=DONE_STATUSES)
        completed = done.count()
    origin = convoy.sourced
    return {
        "id": convoy.id,
        "title": convoy.title,
        "status": convoy.status,
        "owner": convoy.owner,
        "source": origin.source if origin else None,
        "missing_from_source": bool(origin and origin.missing_since),
        "tracked": items,
        "completed": completed,
        "total": len(every),
        "progress": progress_json(convoy_summaries([convoy])[convoy.pk]),
        "causes": dict(causemod.counts(cause_of)),
    }


def last_activity(convoy_ids: Iterable[str]) -> dict[str, datetime]:
    return dict(
        Event.objects.filter(convoy_id__in=convoy_ids)
        .values("convoy_id")
        .annotate(last=Max("created_at"))
        .values_list("convoy_id", "last")
    )


# --- page read models: one per page, used for the full page and for its live fragments -------
DASHBOARD_SORTS = {
    "age": ("-created_at", "id"),
    "-age": ("created_at", "id"),
    "id": ("id",),
    "title": ("title", "id"),
}
# Sorts by what beads do: any change may reorder the table.
DASHBOARD_LIVE_SORTS = ("activity", "progress", "-progress")
DASHBOARD_LIMIT = 500


@dataclass
class DashboardRow:
    convoy: Convoy
    s: Summary


@dataclass
class DashboardPage:
    rows: list[DashboardRow]
    status: str
    sort: str
    owners: list[str]
    rigs: list[Rig]


SEARCH_MAX = 500  # longer search text is cut: SQLite refuses LIKE patterns over 50 kB


def filter_text(value: str) -> str:
    """A filter or search value from a query string, safe for every database: without NUL
    (PostgreSQL refuses it in a query) and at most SEARCH_MAX characters."""
    return value.replace("\x00", "").strip()[:SEARCH_MAX]


STATUS_FILTERS = ("active", "staged", "all", *CONVOY_STATUSES)


def status_filter_problem(status: str) -> str | None:
    """Why `status` is no convoy status filter (the dashboard's and the API's), or None."""
    if status in STATUS_FILTERS:
        return None
    shown = status if len(status) <= 40 else status[:40] + "…"
    return f"unknown status filter {shown!r}: use one of {', '.join(STATUS_FILTERS)}"


def convoys_with_status(status: str) -> QuerySet[Convoy]:
    """The convoys a status filter selects, on the dashboard and in the API: "active" (open
    or staged), "staged" (ready or with warnings), "all", or one status (STATUS_FILTERS;
    callers refuse any other word with `status_filter_problem`)."""
    queryset = Convoy.objects.all()
    if status == "active":
        return queryset.filter(status__in=(CONVOY_OPEN, *STAGED_STATUSES))
    if status == "staged":
        return queryset.filter(status__in=STAGED_STATUSES)
    if status == "all":
        return queryset
    return queryset.filter(status=status)


def dashboard_convoys(params: Params) -> QuerySet[Convoy]:
    """The convoys the dashboard lists for these query parameters (a queryset, unsorted)."""
    params = {key: filter_text(params.get(key) or "") for key in ("status", "rig", "owner", "q")}
    queryset = convoys_with_status(params["status"] or "active")
    if params.get("rig"):
        rig_beads = Bead.objects.filter(rig_id=params["rig"]).values("id")
        queryset = queryset.filter(tracked__bead_id__in=rig_beads).distinct()
    if params.get("owner"):
        owner = params["owner"]
        queryset = queryset.filter(owner__in=[owner] + [c + owner for c in ACTOR_CHANNELS])
    if params.get("q"):
        q = params["q"]
        queryset = queryset.filter(Q(id__icontains=q) | Q(title__icontains=q))
    return queryset


def dashboard_rows(params: Params, only: Iterable[str] | None = None) -> list[DashboardRow]:
    """The dashboard's rows, sorted; `only`: just these convoys (those a live update touched)."""
    sort = params.get("sort", "age")
    queryset = dashboard_convoys(params)
    if only is not None:
        queryset = queryset.filter(pk__in=only)
    convoys = list(
        queryset.order_by(*DASHBOARD_SORTS.get(sort, DASHBOARD_SORTS["age"]))[:DASHBOARD_LIMIT]
    )
    summaries = convoy_summaries(convoys)
    if sort in DASHBOARD_LIVE_SORTS:

        def done_share(c: Convoy) -> float:
            return float(summaries[c.pk]["done"] / (summaries[c.pk]["total"] or 1))

        key = {
            "progress": done_share,
            "-progress": lambda c: -done_share(c),
            "activity": lambda c: -summaries[c.pk]["last_activity"].timestamp(),
        }[sort]
        convoys.sort(key=key)
    return [DashboardRow(c, summaries[c.pk]) for c in convoys]


def dashboard_page(params: Params) -> DashboardPage:
    owners = Convoy.objects.exclude(owner="").values_list("owner", flat=True).distinct()[:200]
    return DashboardPage(
        rows=dashboard_rows(params),
        status=params.get("status", "active"),
        sort=params.get("sort", "age"),
        owners=sorted({person(o) for o in owners}),
        rigs=list(Rig.objects.all()),
    )


COLLAPSE_AT = 150  # more tracked beads than this: completed waves collapse, lists are capped
# More tracked beads than this: the page is an overview whose size does not grow with the
# convoy (?all=1 draws everything): the graph draws the frontier wave, the next beads of the
# critical path, the focused bead's wave and the waves opened (?open=N,M), at most
# WAVE_DRAWN beads of each; the wave table lists BAND_PAGE waves around the frontier
# (?wpage=N); the bead table ROWS_PAGE rows a page (?bpage=N); the critical path's first
# CRITICAL_LISTED beads are linked.
OVERVIEW_AT = 500
WAVE_DRAWN = 60
CRITICAL_DRAWN = 8
OPEN_MAX = 4
BAND_PAGE = 30
ROWS_PAGE = 100
CRITICAL_LISTED = 40
MAX_ROWS = 300
MAX_CHIPS = 600  # wave-table links on a big convoy's page; the DAG and ?all=1 show the rest
CHIPS_PER_WAVE = 60
TIMELINE = 100


def status_class(status: str) -> tuple[str, str]:
    """A node's (css class, icon) for a bead state."""
    icon = status_symbol(status)
    if status in DONE_STATUSES:
        return "st-done", icon
    if status in ACTIVE_WORK_STATUSES:
        return "st-active", icon
    if status in ("unknown", "ready"):
        return f"st-{status}", icon
    return "st-blocked", icon


def bead_url_maker() -> Callable[[str], str]:
    """reverse() once, then string substitution: a 5,000-node graph needs 5,000 links."""
    template = reverse("bead", args=["__ID__"])
    return lambda bead_id: template.replace("__ID__", quoted_url_segment(bead_id))


def convoy_graph(convoy: Convoy, snapshot: snapshots.Snapshot | None = None) -> ConvoyGraph:
    """A convoy's tracked ids, {id: TrackedRow}, DAG, waves, gated beads and raw edges (read,
    or from a `snapshots.Snapshot`)."""
    if snapshot is not None:
        tracked, beads, edges = snapshot.tracked, snapshot.beads, snapshot.edges
        built = _build_graph(beads, edges, snapshot.gates)
    else:
        tracked, beads, edges, gates = projection.graph_rows(convoy)
        built = _build_graph(beads, edges, gates)
    graph, waves, gated = built[:3]
    graph = with_ghosts(graph)
    return ConvoyGraph(tracked, beads, graph, waves, gated)


def with_ghosts(graph: dagmod.DAG) -> dagmod.DAG:
    """A copy of `graph` naming its blocking targets outside it (a task of another convoy, an
    unknown id, an external:<x>:<id>), drawn as ghosts: two small queries, only when any."""
    graph = copy.copy(graph)  # the ghosts are this request's
    graph.ghosts = {}
    if graph.ghost_edges:
        targets = {t for t, _ in graph.ghost_edges}
        for bead_id, title, status in Bead.objects.filter(pk__in=targets).values_list(
            "id", "title", "status"
        ):
            graph.ghosts[bead_id] = ("outside", title, status)
        raw = Dependency.objects.filter(
            issue_id__in=[i for _, i in graph.ghost_edges], depends_on_id__in=targets
        ).filter(raw_target__startswith="external:")
        for target, written in raw.values_list("depends_on_id", "raw_target"):
            graph.ghosts.setdefault(target, ("external", written, "unknown"))
    return graph


_node = projection.node_of
_build_graph = projection.build_graph


def _geometry(
    convoy: Convoy,
    graph: dagmod.DAG,
    waves: list[list[str]],
    gated: list[dagmod.Gated],
    collapsed: frozenset[int],
    drawn: dict[int, list[str]] | None = None,
) -> tuple[layout.Geometry, str]:
    """(geometry, fingerprint), cached. `drawn` ({wave: ids}, an overview; gated beads under
    key 0): only those beads are laid out, with the edges among them."""
    ghosts = graph.ghost_edges
    outside = sorted(
        {i for i, n in graph.nodes.items() if not n.slingable} | {t for t, _ in ghosts}
    )
    if drawn is None:
        exec_edges = [(a, b) for a, b in graph.graph.edges] + ghosts
        gated_ids = [g.id for g in gated]
        node_ids: Collection[str] = list(graph.nodes)
        columns = [outside, *waves, sorted(gated_ids)]
        by_wave = None
    else:
        gated_ids = list(drawn.get(0, ()))
        by_wave = {n: ids for n, ids in drawn.items() if n}
        node_ids = {i for ids in drawn.values() for i in ids} | set(outside)
        exec_edges = [
            (a, b)
            for a in node_ids
            if a in graph.graph
            for b in graph.graph.successors(a)
            if b in node_ids
        ] + [(t, i) for t, i in ghosts if i in node_ids]
        # the waves' sizes, as text: a drawing of other waves' beads is another drawing
        columns = [outside, [str(len(w)) for w in waves], sorted(gated_ids)]
    key = layout.fingerprint(node_ids, exec_edges, collapsed, columns, by_wave)
    geometry: layout.Geometry | None = cache.get("dag:" + convoy.pk + ":" + key)
    if geometry is None:
        geometry = layout.compute(waves, gated_ids, exec_edges, collapsed, outside, drawn=by_wave)
        cache.set("dag:" + convoy.pk + ":" + key, geometry, 3600)
    return geometry, key


def _overview_drawn(
    waves: list[list[str]],
    gated: list[dagmod.Gated],
    frontier: int | None,
    critical: list[str],
    wave_number: dict[str, int],
    focus: str,
    params: Params,
    done: Set[str],
) -> tuple[dict[int, list[str]], list[int]]:
    """{wave: ids drawn} of an overview (gated beads under 0): the frontier wave, the waves
    opened (?open=N,M) and the focused bead's, the next CRITICAL_DRAWN beads of the critical
    path; at most WAVE_DRAWN beads of a wave, unfinished first (the focused and critical
    ones always)."""
    opened = []
    for part in params.get("open", "").split(","):
        number = whole_number(part)
        if number is not None and 1 <= number <= len(waves) and number not in opened:
            opened.append(number)
    opened = opened[:OPEN_MAX]
    whole = set(opened)
    if frontier:
        whole.add(frontier)
    if focus in wave_number:
        whole.add(wave_number[focus])
    drawn = {n: sorted(waves[n - 1], key=lambda i: i in done)[:WAVE_DRAWN] for n in sorted(whole)}
    extra = [i for i in critical[:CRITICAL_DRAWN]]
    if focus:
        extra.append(focus)
    gated_ids = [g.id for g in gated]
    gated_set = set(gated_ids)
    drawn[0] = gated_ids[:WAVE_DRAWN]
    for bead_id in extra:
        if bead_id in wave_number:
            ids = drawn.setdefault(wave_number[bead_id], [])
        elif bead_id in gated_set:
            ids = drawn[0]
        else:
            continue
        if bead_id not in ids:
            ids.append(bead_id)
    return drawn, sorted(opened)


def _outside(graph: dagmod.DAG, geometry: layout.Geometry) -> dict[str, tuple[str, str, str]]:
    """{id: (kind, title, status)} of the drawn beads that are no tracked task: gates and
    decisions ("gate"), tasks outside the convoy ("outside"), unknown and external targets."""
    out = {}
    ghosts = graph.ghosts
    for bead_id in geometry["outside"]:
        node = graph.nodes.get(bead_id)
        if node is not None:
            out[bead_id] = ("gate", node.title, node.status)
        else:
            out[bead_id] = ghosts.get(bead_id, ("unknown", "", "unknown"))
    return out


class Samples(NamedTuple):
    """How long beads took from their first dispatch to their close (seconds), and whose."""

    seconds: list[float]
    basis: str  # "this convoy" or "its rigs"


# Events after which the samples may differ: a close or reopen, a dispatch.


def samples(tracked_rows: Iterable[TrackedRow]) -> Samples:
    """The convoy's closed beads' times (else, with fewer than three, its rigs' recent ones)."""
    tracked_rows = list(tracked_rows)
    closed = [b for b in tracked_rows if b.status == "closed" and b.closed_at]
    started = dict(
        Dispatch.objects.filter(bead_id__in=[b.pk for b in closed], ok=True)
        .values("bead_id")
        .annotate(first=Min("created_at"))
        .values_list("bead_id", "first")
    )
    seconds = [
        (b.closed_at - started[b.pk]).total_seconds()
        for b in closed
        if b.pk in started and b.closed_at > started[b.pk]
    ]
    if len(seconds) >= 3:
        return Samples(seconds, "this convoy")
    rigs = {b.rig_id for b in tracked_rows if b.rig_id}
    recent = (
        Dispatch.objects.filter(rig__in=rigs, ok=True)
        .values("bead_id")
        .annotate(first=Min("created_at"))
        .values_list("bead_id", "first")[:500]
    )
    firsts = dict(recent)
    closes = dict(
        Bead.objects.filter(pk__in=firsts, status="closed").values_list("id", "closed_at")
    )
    seconds = [
        (closes[i] - firsts[i]).total_seconds()
        for i in closes
        if closes[i] and closes[i] > firsts[i]
    ]
    return Samples(seconds, "its rigs")


def estimate(found: Samples, remaining: int, now: datetime) -> dict[str, Any] | None:
    """Median time a bead of this convoy (else of its rigs) took from dispatch to close, times
    the beads left on the critical path; None without samples."""
    if not found.seconds or not remaining:
        return None
    median = statistics.median(found.seconds)
    return {
        "median": duration(median),
        "samples": len(found.seconds),
        "basis": found.basis,
        "eta": now + timedelta(seconds=median * remaining),
    }


@dataclass
class Dag:
    """What the convoy page draws of its graph: geometry (cached per graph) and states."""

    geometry: layout.Geometry
    fingerprint: str
    states: dict[str, tuple[str, str]]  # {id: (title, state)}
    marks: dict[str, list[str]]  # {id: ["gated", "parked", "stranded"]}
    critical: list[str]
    href: Callable[[str], str]
    # {id: (kind, title, status)}: gates, ghosts
    outside: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    def svg(self) -> str:
        return layout.svg(
            self.geometry,
            self.states,
            status_class,
            self.marks,
            self.critical,
            self.href,
            self.outside,
        )

    def node(self, bead_id: str) -> str:
        if bead_id in self.outside:
            kind, title, state = self.outside[bead_id]
            return layout.node(self.geometry, bead_id, title, state, status_class, self.href, kind)
        title, state = self.states.get(bead_id, ("", "unknown"))
        return layout.node(self.geometry, bead_id, title, state, status_class, self.href)

    def overlay(self) -> str:
        return layout.overlay(self.geometry, self.marks, self.critical)

    def drawn(self, bead_ids: Iterable[str]) -> list[str]:
        """Those of `bead_ids` that are drawn as nodes (not in a collapsed wave)."""
        return [i for i in bead_ids if i in self.geometry["nodes"]]


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
        return [
            row
            | {
                "blocked_by": self.blockers.get(row["id"], []),
                "sourced": origins.get(row["id"]),
                "worker_seen": seen.get(row["bead"].assignee) if row["bead"] else None,
            }
            for row in rows
        ]

    @property
    def unfinished(self) -> int:
        """Tracked beads not done (the close and land confirmations name how many)."""
        return self.summary["total"] - self.summary["done"]

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


def convoy_page(
    convoy: Convoy,
    params: Params,
    user: User,
    now: datetime,
    snapshot: snapshots.Snapshot | None = None,
) -> ConvoyPage:
    """The convoy page's read model, from a `snapshots.Snapshot` (loaded when not given)."""
    snapshot = snapshot or snapshots.load(convoy, now)
    tracked, beads, graph, waves, gated = convoy_graph(convoy, snapshot)
    summary, ready_ids = convoy_summary(convoy, tracked, beads, now, snapshot)
    wave_number = dagmod.wave_of(waves)
    gated_ids = {g.id for g in gated}
    cause_of = causemod.for_convoy(convoy, now, known=snapshot)  # each unfinished bead's cause

    def state(bead_id: str) -> str:
        bead = beads.get(bead_id)
        if bead is None:
            return "unknown"
        if bead.pk in ready_ids:
            return "ready"
        # Open and not ready: waiting on something (its cause says what), as the bar counts it.
        return "blocked" if bead.status == "open" else bead.status

    # ?all=1 draws and lists everything, up to CONVOY_SHOW_ALL_MAX beads (a bounded page).
    show_all = params.get("all") == "1" and len(tracked) <= settings.CONVOY_SHOW_ALL_MAX
    big = len(tracked) > COLLAPSE_AT and not show_all
    overview = len(tracked) > OVERVIEW_AT and not show_all
    chips = 0 if overview else None
    href = bead_url_maker()
    # Per bead: its row, its node's state, the wave table.
    facts = ConvoyPageFacts(
        cause_of, beads, graph, waves, wave_number, gated_ids, ready_ids, state, href
    )
    parts = _parts(facts, tracked, big, chips)
    rows = list(parts.rows.values())
    hidden_rows, capped = 0, False
    bead_pages, bpage = 1, 1
    if overview:
        # Unfinished beads, ROWS_PAGE a page (?bpage=N); the done ones are counted.
        unfinished = [r for r in rows if r["state"] not in DONE_STATUSES]
        bead_pages = max(1, -(-len(unfinished) // ROWS_PAGE))
        bpage = _page_number(params.get("bpage"), bead_pages, 1)
        hidden_rows = len(rows) - len(unfinished)
        capped = bead_pages > 1
        rows = unfinished[(bpage - 1) * ROWS_PAGE : bpage * ROWS_PAGE]
    elif big:
        # Large convoys list unfinished beads first and keep the page light; ?all=1 shows all.
        unfinished = [r for r in rows if r["state"] not in DONE_STATUSES]
        hidden_rows = len(rows) - min(len(unfinished), MAX_ROWS)
        capped = len(unfinished) > MAX_ROWS
        rows = unfinished[:MAX_ROWS]
    tracked_q = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    wave_rows, frontier, done = parts.waves, parts.frontier, parts.done
    critical = dagmod.critical_path(graph, set(done))
    collapsed = set()
    focus = params.get("focus", "")
    drawn: dict[int, list[str]] | None = None
    opened: list[int] = []
    bands, wave_pages, wpage = wave_rows, 1, 1
    if overview:
        drawn, opened = _overview_drawn(
            waves, gated, frontier, critical, wave_number, focus, params, done
        )
        bands, wave_pages, wpage = band_window(wave_rows, frontier, params.get("wpage"))
    elif len(graph.nodes) > COLLAPSE_AT and params.get("expand") != "1":
        collapsed = {r["number"] for r in wave_rows if r["counts"]["done"] == r["total"]}
        collapsed.discard(wave_number.get(focus))  # the focused bead is drawn
    dag = None
    focus_found = False
    if waves or gated:
        geometry, key = _geometry(convoy, graph, waves, gated, frozenset(collapsed), drawn)
        focus_found = bool(focus) and focus in geometry["nodes"]
        dag = Dag(
            geometry=geometry,
            fingerprint=key,
            states=parts.states,
            marks=_marks(tracked, beads, gated_ids, snapshot.rigs, summary["state"].ready),
            critical=critical,
            href=href,
            outside=_outside(graph, geometry),
        )
    size, at = dagmod.max_parallelism(waves)
    no_estimate = stranding.estimate_blocker(convoy, summary["state"])
    timeline = list(
        Event.objects.filter(Q(convoy_id=convoy.pk) | Q(bead_id__in=tracked_q)).order_by("-seq")[
            :TIMELINE
        ]
    )
    return ConvoyPage(
        convoy=convoy,
        summary=summary,
        listed=rows,
        blockers=snapshot.blockers,
        hidden_rows=hidden_rows,
        waves=wave_rows,
        frontier=frontier,
        gated=gated,
        critical=[(i, href(i)) for i in (critical[:CRITICAL_LISTED] if overview else critical)],
        critical_length=len(critical),
        can_show_all=len(tracked) <= settings.CONVOY_SHOW_ALL_MAX,
        eta=estimate(samples(beads.values()), len(critical), now)
        if critical and no_estimate == ""
        else None,
        no_estimate=no_estimate,
        timeline=timeline,
        collapsed=sorted(collapsed),
        focus=focus,
        focus_found=focus_found,
        summary_line=f"{several(sum(len(w) for w in waves), 'bead')} across "
        f"{several(len(waves), 'wave')} (max parallelism: {size} in wave {at})",
        dag=dag,
        big=big,
        capped=capped,
        overview=overview,
        opened=opened,
        bands=bands,
        wave_pages=wave_pages,
        wpage=wpage,
        bead_pages=bead_pages,
        bpage=bpage,
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
    counts = {"done": 0, "active": 0, "ready": 0, "blocked": 0}
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
        shown = 0 if big and n["done"] == len(wave) else min(len(wave), CHIPS_PER_WAVE)
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
        if row["counts"]["done"] < row["total"]:
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


# --- the bead page, the stage page's epics, the subscriptions page -----------------------------
DEPS_PER_PAGE = 200


@dataclass
class BeadState:
    """Whether a bead moves and why not: the bead page and the API's bead detail."""

    ready: bool
    blocked_by: list[str]  # its unfinished blockers (all of them)
    cause: dict[str, Any] | None  # None when it is done


def bead_state(bead: Bead, now: datetime | None = None) -> BeadState:
    return BeadState(
        ready=is_ready(bead, now),
        blocked_by=blocked_by([bead.pk]).get(bead.pk, []),
        cause=causemod.for_bead(bead.pk, now),
    )


@dataclass
class BeadPage:
    bead: Bead
    ready: bool
    cause: dict[str, Any] | None
    blocked_by: list[str]  # the first DEPS_PER_PAGE
    blocked_by_more: int
    deps: dict[str, int]  # page, pages, per_page, outgoing, incoming (totals)
    outgoing: list[tuple[Dependency, Bead | None]]  # this page of its dependencies
    incoming: list[tuple[Dependency, Bead | None]]  # this page of its dependents
    convoys: list[Convoy]
    events: list[Event]
    dispatches: list[Dispatch]
    watch: str  # the live topics of what the page shows


def bead_page(bead_id: str, deps_page: int, now: datetime) -> BeadPage | None:
    """The bead page's read model (None: no such bead). Dependencies a page at a time both
    ways: a bead with 140,000 of them was a 13 MB page."""
    bead = Bead.objects.filter(pk=bead_id).select_related("rig").first()
    if bead is None:
        return None
    window = slice((deps_page - 1) * DEPS_PER_PAGE, deps_page * DEPS_PER_PAGE)
    outgoing_all = bead.dependencies.order_by("depends_on_id")
    incoming_all = Dependency.objects.filter(depends_on_id=bead.pk).order_by("issue_id")
    outgoing, incoming = list(outgoing_all[window]), list(incoming_all[window])
    totals = {"outgoing": outgoing_all.count(), "incoming": incoming_all.count()}
    related = [d.depends_on_id for d in outgoing] + [d.issue_id for d in incoming]
    others = Bead.objects.in_bulk(related)
    state = bead_state(bead, now)
    convoys = list(Convoy.objects.filter(tracked__bead_id=bead.pk).distinct())
    # The page shows its neighbours' states, its convoys' statuses and its rig's state.
    watch = [f"bead:{bead.pk}", "kind:rig.state"]
    watch += [f"bead:{i}" for i in sorted(set(related))] + [f"convoy:{c.pk}" for c in convoys]
    return BeadPage(
        bead=bead,
        ready=state.ready,
        cause=state.cause,
        blocked_by=state.blocked_by[:DEPS_PER_PAGE],
        blocked_by_more=max(len(state.blocked_by) - DEPS_PER_PAGE, 0),
        deps={
            "page": deps_page,
            "pages": max(-(-max(totals.values()) // DEPS_PER_PAGE), 1),
            "per_page": DEPS_PER_PAGE,
            **totals,
        },
        outgoing=[(d, others.get(d.depends_on_id)) for d in outgoing],
        incoming=[(d, others.get(d.issue_id)) for d in incoming],
        convoys=convoys,
        events=list(Event.objects.filter(bead_id=bead.pk).order_by("-seq")[:100]),
        dispatches=list(Dispatch.objects.filter(bead_id=bead.pk)[:20]),
        watch=",".join(watch),
    )


def epics_to_stage(limit: int = 500) -> list[tuple[str, str]]:
    """(id, title) of the epics not yet done, for the stage page's picker."""
    epics = Bead.objects.filter(issue_type="epic").exclude(status__in=DONE_STATUSES)
    return list(epics.order_by("id").values_list("id", "title")[:limit])


@dataclass
class SubscriptionsPage:
    subs: list[Subscription]  # to one convoy each
    all_sub: Subscription | None  # to every convoy
    delivery: notify.Preference


def subscriptions_page(user: User) -> SubscriptionsPage:
    subs = list(Subscription.objects.filter(user=user).select_related("convoy"))
    return SubscriptionsPage(
        subs=[s for s in subs if s.convoy_id],
        all_sub=next((s for s in subs if s.convoy_id is None), None),
        delivery=notify.preference(user),
    )


def find_beads(
    *,
    status: str | None = None,
    rig: str | None = None,
    assignee: str | None = None,
    q: str | None = None,
    ready: bool = False,
    limit: int = 200,
) -> list[Bead]:
    """The beads the filters select (the API's list, `beads ready`): ready ones in the feed's
    order (priority, id), the others by id; `assignee` matches a prefix, `q` the id or title."""
    queryset = Bead.objects.all()
    if status:
        queryset = queryset.filter(status=status)
    if rig:
        queryset = queryset.filter(rig_id=rig)
    if assignee:
        queryset = queryset.filter(assignee__startswith=assignee)
    if q:
        queryset = queryset.filter(Q(id__icontains=q) | Q(title__icontains=q))
    queryset = ready_beads(queryset) if ready else queryset.order_by("id")
    return list(queryset[:limit])


def wave_tasks(convoy: Convoy) -> tuple[ConvoyGraph, Summary, list[dict[str, Any]]]:
    """A convoy's graph, summary and waves as lists of tasks (the API's convoy detail)."""
    found = convoy_graph(convoy)
    summary, _ = convoy_summary(convoy, found.tracked, found.beads)
    nodes = found.graph.nodes
    waves = [
        {
            "number": number,
            "tasks": [
                {
                    "id": i,
                    "title": nodes[i].title,
                    "status": nodes[i].status,
                    "rig": nodes[i].rig,
                    "blocked_by": sorted(nodes[i].blocked_by),
                }
                for i in wave
            ],
        }
        for number, wave in enumerate(found.waves, start=1)
    ]
    return found, summary, waves


# --- serve's line a minute --------------------------------------------------------------------
class TownMinute(NamedTuple):
    """What the town did between two reads: `serve`'s status line."""

    seq: int  # the log's last event when read (the next read starts after it)
    moving: int  # open convoys with an event since the last read
    landed: int  # convoys that landed since the last read
    in_flight: int  # beads in flight now
    failed: int  # dispatches that failed since `since`


def town_minute(after: int, since: datetime) -> TownMinute:
    """The town since event `after` and the moment `since`: a few indexed queries (the log's
    sequence, the dispatch times), whatever the town's size."""
    top = last_seq()
    recent = Event.objects.filter(seq__gt=after, seq__lte=top)
    moving = Convoy.objects.filter(status=CONVOY_OPEN).filter(
        Q(pk__in=recent.exclude(convoy_id="").values("convoy_id"))
        | Q(tracked__bead_id__in=recent.exclude(bead_id="").values("bead_id"))
    )
    return TownMinute(
        seq=top,
        moving=moving.distinct().count(),
        landed=recent.filter(kind="convoy.landed").count(),
        in_flight=capacity.in_flight(),
        failed=Dispatch.objects.filter(created_at__gte=since, ok=False).count(),
    )
