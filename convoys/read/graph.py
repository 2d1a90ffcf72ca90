"""A convoy's dependency graph as a page draws it: the tracked beads' DAG and waves, the ghosts
of blockers outside the convoy, and the geometry (whole, or an overview's drawn part)."""

import copy
from collections.abc import Callable, Collection, Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.core.cache import cache
from django.urls import reverse

from convoys.core import dag as dagmod
from convoys.core import layout
from convoys.core.ids import quoted_url_segment
from convoys.core.parsing import whole_number
from convoys.models import (
    Bead,
    Convoy,
    Dependency,
)
from convoys.read import projection, snapshots
from convoys.read.sizes import CRITICAL_DRAWN, OPEN_MAX, WAVE_DRAWN
from convoys.read.summaries import Params, Summary, convoy_summary, status_class
from convoys.rules import merging
from convoys.rules.rows import TrackedRow


class ConvoyGraph(NamedTuple):
    """What `convoy_graph` reads of a convoy: its tracked ids (in order), their rows, the DAG,
    the waves and the gated beads."""

    tracked: list[str]
    beads: dict[str, TrackedRow]
    graph: dagmod.DAG
    waves: list[list[str]]
    gated: list[dagmod.Gated]


# (graph, waves, gated, gates): what a snapshot's graph is built into
Built = tuple[dagmod.DAG, list[list[str]], list[dagmod.Gated], list[snapshots.Gate]]


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


def drawn_geometry(
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


def overview_drawn(
    waves: list[list[str]],
    gated: list[dagmod.Gated],
    frontier: int | None,
    critical: list[str],
    wave_number: Mapping[str, int],
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


def merge_edges(edges: Iterable[tuple[str, str, str]]) -> frozenset[tuple[str, str]]:
    """(blocker, blocked) of the `merge-blocks` edges among (issue, target, type) rows."""
    return frozenset((target, issue) for issue, target, kind in edges if kind == "merge-blocks")


def outside_convoy(graph: dagmod.DAG, geometry: layout.Geometry) -> dict[str, tuple[str, str, str]]:
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
    merge_edges: frozenset[tuple[str, str]] = frozenset()  # (blocker, blocked) of merge-blocks

    def svg(self) -> str:
        return layout.svg(
            self.geometry,
            self.states,
            status_class,
            self.marks,
            self.critical,
            self.href,
            self.outside,
            merge_edges=self.merge_edges,
        )

    def node(self, bead_id: str) -> str:
        if bead_id in self.outside:
            kind, title, state = self.outside[bead_id]
            return layout.node(self.geometry, bead_id, title, state, status_class, self.href, kind)
        title, state = self.states.get(bead_id, ("", "unknown"))
        return layout.node(self.geometry, bead_id, title, state, status_class, self.href)

    def overlay(self) -> str:
        return layout.overlay(self.geometry, self.marks, self.critical, self.merge_edges)

    def drawn(self, bead_ids: Iterable[str]) -> list[str]:
        """Those of `bead_ids` that are drawn as nodes (not in a collapsed wave)."""
        return [i for i in bead_ids if i in self.geometry["nodes"]]


def wave_tasks(convoy: Convoy) -> tuple[ConvoyGraph, Summary, list[dict[str, Any]]]:
    """A convoy's graph, summary and waves as lists of tasks (the API's convoy detail)."""
    found = convoy_graph(convoy)
    summary, _ = convoy_summary(convoy, found.tracked, found.beads)
    nodes = found.graph.nodes
    waiting = merging.awaiting_among([i for i, n in nodes.items() if n.status == "closed"])
    waves = [
        {
            "number": number,
            "tasks": [
                {
                    "id": i,
                    "title": nodes[i].title,
                    "status": merging.SUBMITTED if i in waiting else nodes[i].status,
                    "rig": nodes[i].rig,
                    "blocked_by": sorted(nodes[i].blocked_by),
                }
                for i in wave
            ],
        }
        for number, wave in enumerate(found.waves, start=1)
    ]
    return found, summary, waves
