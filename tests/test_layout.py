"""The DAG layout (pure): layered by waves, long edges routed through lanes between boxes,
so no edge passes through a box other than its endpoints, whatever the graph."""

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from convoys.core import dag as dagmod
from convoys.core import layout
from convoys.core.layout import checks

W, H = layout.NODE_W, layout.NODE_H


def status_class(status):
    return {"closed": ("st-done", "✓"), "unknown": ("st-unknown", "?")}.get(
        status, ("st-blocked", "○")
    )


def boxes(geometry):
    out = {k: (x, y, W, H) for k, (x, y) in geometry["nodes"].items()}
    for number, (x, y, _) in geometry["summaries"].items():
        out[("summary", number)] = (x, y, W, H)
    return out


def paths(geometry):
    return [(a, b, d) for a, b, d, _ in geometry["edges"]]


def check(geometry, edges):
    """The invariants every drawing keeps."""
    assert checks.through_boxes(boxes(geometry), paths(geometry)) == []
    # boxes never overlap, and keep their gap in a column
    by_column = {}
    for x, y, _, _ in boxes(geometry).values():
        by_column.setdefault(x, []).append(y)
    for ys in by_column.values():
        ys.sort()
        assert all(b - a >= H + layout.ROW_GAP for a, b in zip(ys, ys[1:], strict=False))
    pos = geometry["nodes"]
    drawn = {(a, b) for a, b, _, _ in geometry["edges"]}
    expected = {(a, b) for a, b in edges if a in pos and b in pos}
    assert drawn == expected
    for a, b, d, reverse in geometry["edges"]:
        points = checks.edge_points(d)
        start, end = (b, a) if reverse else (a, b)
        (x1, y1), (x2, y2) = points[0], points[-1]
        assert (x1, y1) == (pos[start][0] + W, pos[start][1] + H // 2)
        if pos[start][0] == pos[end][0]:  # two boxes of one column: back into its right side
            assert (x2, y2) == (pos[end][0] + W, pos[end][1] + H // 2)
        else:
            assert (x2, y2) == (pos[end][0], pos[end][1] + H // 2)
    for x, y in pos.values():
        assert 0 <= x and x + W <= geometry["width"] and 0 <= y and y + H <= geometry["height"]


def waves_of(n, edges, gates=()):
    nodes = [dagmod.Node(f"b{i}") for i in range(n)] + [
        dagmod.Node(g, type="decision") for g in gates
    ]
    graph = dagmod.build_dag(nodes, [(b, a, "blocks") for a, b in edges])
    waves, gated = dagmod.compute_waves(graph)
    return waves, [g.id for g in gated]


def test_a_long_edge_goes_round_the_box_in_between():
    # mwrg8 -> s3nxj -> m6b2u and mwrg8 -> m6b2u: the long edge used to cross s3nxj's box
    edges = [("mwrg8", "s3nxj"), ("s3nxj", "m6b2u"), ("mwrg8", "m6b2u")]
    geometry = layout.compute([["mwrg8"], ["s3nxj"], ["m6b2u"]], [], edges)
    check(geometry, edges)
    long = next(d for a, b, d, _ in geometry["edges"] if (a, b) == ("mwrg8", "m6b2u"))
    assert "h" in long  # it passes wave 2 in a lane


def test_gates_and_ghosts_are_drawn_before_wave_1_and_their_edges_too():
    edges = [("dec", "roll"), ("a", "roll"), ("external:beads:bd-1", "a"), ("gone-1", "b")]
    geometry = layout.compute(
        [["a", "b"]], ["roll"], edges, outside=["dec", "external:beads:bd-1", "gone-1"]
    )
    check(geometry, edges)
    assert [label for _, label in geometry["columns"]] == ["Gates & outside", "Wave 1", "Gated"]
    assert geometry["nodes"]["dec"][0] == layout.PAD
    outside = {
        "dec": ("gate", "Decide: go / no-go", "open"),
        "external:beads:bd-1": ("external", "", "unknown"),
        "gone-1": ("unknown", "", "unknown"),
    }
    states = {i: ("t", "open") for i in ("a", "b", "roll")}
    svg = layout.svg(geometry, states, status_class, {"roll": ["gated"]}, (), None, outside)
    assert re.search(r'<g class="node st-blocked gate" data-id="dec"[^>]*><polygon', svg)
    assert "<title>gate dec Decide: go / no-go (open)</title>" in svg
    assert 'class="node ghost external"' in svg and 'class="node ghost unknown"' in svg
    assert 'data-from="dec" data-to="roll"' in svg
    assert 'class="edge ghost" data-from="gone-1" data-to="b"' in svg
    assert ">⊘</text>" in svg


def test_marks_and_the_critical_path_are_in_the_overlay():
    edges = [("a", "b"), ("b", "c"), ("a", "c")]
    geometry = layout.compute([["a"], ["b"], ["c"]], [], edges)
    overlay = layout.overlay(
        geometry, {"a": ["parked", "stranded"], "b": ["gated"]}, ["a", "b", "c"]
    )
    assert overlay.count('class="edge critical"') == 2  # a->b, b->c: the path, not a->c
    assert overlay.count('<rect class="critical"') == 3
    assert ">∥⚠</text>" in overlay and ">⊘</text>" in overlay


def test_gated_chains_and_cycles_get_their_own_layers():
    edges = [("g1", "g2"), ("g2", "g3"), ("g3", "g2"), ("a", "g1")]
    geometry = layout.compute([["a"]], ["g1", "g2", "g3"], edges)
    check(geometry, edges)
    xs = {k: x for k, (x, _) in geometry["nodes"].items()}
    assert xs["a"] < xs["g1"] < xs["g2"] < xs["g3"]
    assert [r for a, b, _, r in geometry["edges"] if (a, b) == ("g3", "g2")] == [True]


def test_collapsed_waves_are_one_box_that_edges_go_round():
    edges = [("a", "x"), ("a", "y"), ("x", "y")]
    geometry = layout.compute([["a"], ["x", "z"], ["y"]], [], edges, collapsed={2})
    check(geometry, edges)
    assert set(geometry["summaries"]) == {2} and "x" not in geometry["nodes"]


def test_fewer_crossings_than_the_column_order():
    # two interleaved chains that the id order draws crossed
    waves = [["a1", "b1"], ["a2", "b2"], ["a3", "b3"]]
    edges = [("a1", "b2"), ("b1", "a2"), ("b2", "a3"), ("a2", "b3")]
    geometry = layout.compute(waves, [], edges)
    check(geometry, edges)
    assert geometry["crossings"] == 0
    assert checks.crossings(paths(geometry), channels(geometry)) == 0


def channels(geometry):
    xs = sorted({x for x, _ in geometry["columns"]})
    return [(x + W, nx) for x, nx in zip(xs, xs[1:], strict=False)]


def test_the_checks_catch_an_edge_through_a_box():
    geometry = {"nodes": {"a": (0, 0), "m": (260, 0), "b": (520, 0)}, "summaries": {}}
    straight = [("a", "b", f"M{W},{H // 2}C{W + 100},{H // 2} 420,{H // 2} 520,{H // 2}")]
    assert checks.through_boxes(boxes(geometry), straight) == [("a", "b", "m")]
    crossed = [("a", "b", "M0,0C5,0 5,10 10,10"), ("c", "d", "M0,10C5,10 5,0 10,0")]
    assert checks.crossings(crossed, [(0, 10)]) == 1


@st.composite
def graphs(draw):
    n = draw(st.integers(1, 40))
    pairs = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))
    raw = draw(st.lists(pairs, max_size=80))
    edges = sorted({(f"b{min(a, b)}", f"b{max(a, b)}") for a, b in raw if a != b})
    gates = [f"g{i}" for i in range(draw(st.integers(0, 2)))]
    for g in gates:
        for k in draw(st.lists(st.integers(0, n - 1), max_size=3)):
            edges.append((g, f"b{k}"))
    ghosts = [f"external:r:{i}" for i in range(draw(st.integers(0, 2)))]
    ghost_edges = [(g, f"b{draw(st.integers(0, n - 1))}") for g in ghosts]
    return n, edges, gates, ghosts, ghost_edges, draw(st.sets(st.integers(1, 6), max_size=2))


@settings(max_examples=150, deadline=None)
@given(graphs())
def test_no_edge_passes_through_a_box_in_any_graph(graph):
    n, edges, gates, ghosts, ghost_edges, collapse = graph
    waves, gated = waves_of(n, edges, gates)
    everything = edges + ghost_edges
    geometry = layout.compute(waves, gated, everything, collapse, outside=gates + ghosts)
    check(geometry, everything)
    # the sweeps never end worse than where they started (the column order, in lanes)
    unswept = layout.compute(waves, gated, everything, collapse, gates + ghosts, sweeps=0)
    assert geometry["crossings"] <= unswept["crossings"]


@settings(max_examples=60, deadline=None)
@given(graphs())
def test_the_svg_keeps_its_contract(graph):
    n, edges, gates, ghosts, ghost_edges, _ = graph
    waves, gated = waves_of(n, edges, gates)
    geometry = layout.compute(waves, gated, edges + ghost_edges, outside=gates + ghosts)
    outside = {g: ("gate", "", "open") for g in gates} | {
        g: ("external", "", "unknown") for g in ghosts
    }
    states = {f"b{i}": (f"title <{i}>", "open") for i in range(n)}
    svg = layout.svg(geometry, states, status_class, {}, (), lambda i: f"/beads/{i}/", outside)
    assert sorted(re.findall(r'<g class="node[^"]*" (?:id="[^"]*" )?data-id="([^"]+)"', svg)) == (
        sorted(geometry["nodes"])
    )
    drawn = re.findall(r'<path class="edge[^"]*" data-from="([^"]+)" data-to="([^"]+)"', svg)
    assert sorted(drawn) == sorted((a, b) for a, b, _, _ in geometry["edges"])
    assert "<i>" not in svg
