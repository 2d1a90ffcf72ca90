"""Pure DAG logic: the original's unit cases and property tests (no database)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convoys.core import dag, formatting
from convoys.core.dag import Node, build_dag, compute_waves, find_cycle


def make(spec, deps=(), **kinds):
    """spec: ids or (id, type, status, rig); deps: (blocker, blocked[, type])."""
    nodes = []
    for item in spec:
        if isinstance(item, str):
            item = (item, kinds.get(item, "task"), "open", "gastown")
        nodes.append(
            Node(id=item[0], title=f"Task {item[0]}", type=item[1], status=item[2], rig=item[3])
        )
    edges = [(d[1], d[0], d[2] if len(d) > 2 else "blocks") for d in deps]
    return build_dag(nodes, edges)


# --- cycles (U-01…U-05) ---------------------------------------------------------------------
def test_u01_two_node_cycle():
    assert find_cycle(make("ab", [("a", "b"), ("b", "a")])) == ["b", "a"]


def test_u02_linear_chain_has_no_cycle():
    assert find_cycle(make("abc", [("a", "b"), ("b", "c")])) is None


def test_u03_self_loop():
    assert find_cycle(make("a", [("a", "a")])) == ["a"]


def test_u04_diamond_has_no_cycle():
    assert find_cycle(make("abcd", [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])) is None


def test_u05_back_edge_in_long_chain():
    graph = make("abcd", [("a", "b"), ("b", "c"), ("c", "d"), ("d", "b")])
    assert find_cycle(graph) == ["c", "d", "b"]


def test_three_cycle_path():
    assert find_cycle(make("abc", [("a", "b"), ("b", "c"), ("c", "a")])) == ["b", "c", "a"]


# --- waves (U-06…U-14) ----------------------------------------------------------------------
def waves(graph):
    return compute_waves(graph)[0]


def test_u06_all_independent():
    assert waves(make("cab")) == [["a", "b", "c"]]


def test_u07_linear_chain():
    assert waves(make("abc", [("a", "b"), ("b", "c")])) == [["a"], ["b"], ["c"]]


def test_u08_diamond():
    graph = make("abcd", [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    assert waves(graph) == [["a"], ["b", "c"], ["d"]]


def test_u09_mixed_parallel_serial():
    assert waves(make("abcd", [("a", "b"), ("b", "d")])) == [["a", "c"], ["b"], ["d"]]


def test_u11_u12_non_slingable_excluded():
    graph = make(
        [
            ("d1", "decision", "closed", "g"),
            ("e1", "epic", "open", "g"),
            ("t1", "task", "open", "g"),
            ("b1", "bug", "open", "g"),
            ("f1", "feature", "open", "g"),
            ("c1", "chore", "open", "g"),
        ]
    )
    assert waves(graph) == [["b1", "c1", "f1", "t1"]]


def test_u13_parent_child_is_not_an_execution_edge():
    graph = make(
        [("e", "epic", "open", "g"), "a", "b"],
        [("e", "a", "parent-child"), ("e", "b", "parent-child")],
    )
    assert waves(graph) == [["a", "b"]]
    assert graph.nodes["a"].parent == "e" and sorted(graph.nodes["e"].children) == ["a", "b"]
    assert graph.nodes["a"].blocked_by == []


def test_u14_empty_or_no_slingable_is_an_error():
    with pytest.raises(dag.NoSlingableTasks):
        compute_waves(make([]))
    with pytest.raises(dag.NoSlingableTasks):
        compute_waves(make([("e", "epic", "open", "g"), ("d", "decision", "open", "g")]))


@pytest.mark.parametrize("dep_type", ["blocks", "conditional-blocks", "waits-for", "merge-blocks"])
def test_u15_u17_execution_types_create_edges(dep_type):
    graph = make("ab", [("a", "b", dep_type)])
    assert graph.nodes["a"].blocks == ["b"] and graph.nodes["b"].blocked_by == ["a"]


@pytest.mark.parametrize("dep_type", ["related", "tracks", "discovered-from"])
def test_u19_other_types_ignored(dep_type):
    graph = make("ab", [("a", "b", dep_type)])
    assert graph.nodes["a"].blocks == [] and graph.nodes["b"].parent == ""


def test_dependencies_outside_the_set_are_dropped():
    graph = build_dag([Node("a")], [("a", "elsewhere", "blocks")])
    assert graph.nodes["a"].blocked_by == []


def test_closed_tasks_keep_their_wave_and_gate_dependents():
    graph = make([("a", "task", "closed", "g"), "b"], [("a", "b")])
    assert waves(graph) == [["a"], ["b"]]


def test_open_decision_gates_and_closed_decision_does_not():
    gated = make([("d", "decision", "open", "g"), "a", "b", "c"], [("d", "a"), ("a", "b")])
    result, gated_list = compute_waves(gated)
    assert result == [["c"]]
    assert [(g.id, g.gated_by) for g in gated_list] == [("a", ["d"]), ("b", [])]
    free = make([("d", "decision", "closed", "g"), "a"], [("d", "a")])
    assert waves(free) == [["a"]]


def test_all_gated():
    result, gated_list = compute_waves(make([("e", "epic", "open", "g"), "a"], [("e", "a")]))
    assert result == [] and [g.id for g in gated_list] == ["a"]


# --- errors, warnings, status (U-20…U-27, U-34, U-35) --------------------------------------
def test_u20_u21_errors():
    cyc = dag.detect_errors(make("ab", [("a", "b"), ("b", "a")]))
    assert [f.category for f in cyc] == ["cycle"]
    assert cyc[0].message == "dependency cycle detected: b → a"
    norig = dag.detect_errors(make([("a", "task", "open", "")]))
    assert [f.category for f in norig] == ["no-rig"]
    assert "has no valid rig" in norig[0].message


def test_u22_parked_and_docked_rig():
    graph = make([("a", "task", "open", "r1"), ("b", "task", "open", "r2")])
    found = dag.detect_warnings(graph, dag.TASKS, {"r1": "parked", "r2": "docked"})
    blocked = [f for f in found if f.category == "blocked-rig"]
    assert [f.bead_ids for f in blocked] == [["a"], ["b"]]
    assert "parked" in blocked[0].message and "unpark" in blocked[0].suggested_fix
    assert "docked" in blocked[1].message and "undock" in blocked[1].suggested_fix


def test_u23_orphans_only_for_epic_input():
    graph = make("abc", [("a", "b")])
    orphans = [f for f in dag.detect_warnings(graph, dag.EPIC) if f.category == "orphan"]
    assert [f.bead_ids for f in orphans] == [["c"]]
    assert not [f for f in dag.detect_warnings(graph, dag.TASKS) if f.category == "orphan"]


def test_decision_gated_task_is_not_an_orphan():
    graph = make([("d", "decision", "open", "g"), "a"], [("d", "a")])
    assert not [f for f in dag.detect_warnings(graph, dag.EPIC) if f.category == "orphan"]


def test_u24_missing_branch_on_sub_epic():
    graph = make(
        [("root", "epic", "open", "g"), ("sub", "epic", "open", "g"), "a", "b"],
        [
            ("root", "sub", "parent-child"),
            ("sub", "a", "parent-child"),
            ("sub", "b", "parent-child"),
        ],
    )
    found = [f for f in dag.detect_warnings(graph, dag.EPIC) if f.category == "missing-branch"]
    assert [f.bead_ids for f in found] == [["sub"]] and "sub" in found[0].suggested_fix


def test_u34_cross_rig():
    graph = make(
        [
            ("gt-a", "task", "open", "gastown"),
            ("gt-b", "task", "open", "gastown"),
            ("bd-c", "task", "open", "beads"),
        ]
    )
    found = [f for f in dag.detect_warnings(graph, dag.TASKS) if f.category == "cross-rig"]
    assert [f.bead_ids for f in found] == [["bd-c"]] and '"gastown"' in found[0].message


def test_u35_capacity():
    found = [f for f in dag.detect_warnings(make("abcdef"), dag.TASKS) if f.category == "capacity"]
    assert len(found) == 1 and "wave 1" in found[0].message and "6 tasks" in found[0].message
    assert not [
        f for f in dag.detect_warnings(make("abcde"), dag.TASKS) if f.category == "capacity"
    ]


def test_u25_u27_choose_status():
    assert dag.choose_status([], []) == "staged_ready"
    assert dag.choose_status([], ["w"]) == "staged_warnings"
    assert dag.choose_status(["e"], ["w"]) == ""


# --- rendering (U-28…U-39, SN-*) ------------------------------------------------------------
def test_u28_flat_tree_for_task_list():
    text = formatting.render_tree(make("ba", [("a", "b")]), dag.TASKS)
    assert text.splitlines()[0].startswith("  a [task]") and "├──" not in text


def test_u29_sn01_nested_epic_tree():
    graph = make(
        [
            ("root", "epic", "open", "g"),
            ("sub", "epic", "open", "g"),
            ("subsub", "epic", "open", "g"),
            "task",
        ],
        [
            ("root", "sub", "parent-child"),
            ("sub", "subsub", "parent-child"),
            ("subsub", "task", "parent-child"),
        ],
    )
    lines = formatting.render_tree(graph, dag.EPIC, "root").splitlines()
    assert len(lines) == 4 and lines[0].startswith("root [epic]")
    indents = [len(line) - len(line.lstrip("│ ├└─")) for line in lines]
    assert indents == sorted(indents) and len(set(indents)) == 4


def test_u36_u37_node_line():
    graph = make(["task-a", "task-b"], [("task-a", "task-b")])
    line = formatting.node_line(graph.nodes["task-b"])
    assert line == "task-b [task] Task task-b (rig: gastown) [open] ← blocked by: task-a"


def test_u30_u38_wave_table():
    text = formatting.render_wave_table(make("abc", [("a", "c")]), [["a", "b"], ["c"]])
    assert "  Wave   ID" in text and "─" * 80 in text
    row = next(line for line in text.splitlines() if line.strip().startswith("2"))
    assert row.split()[1] == "c" and row.rstrip().endswith("a")
    assert "3 tasks across 2 waves (max parallelism: 2 in wave 1)" in text
    assert "0 tasks across 0 waves (max parallelism: 0 in wave 0)" in formatting.render_wave_table(
        make([]), []
    )


def test_wave_table_truncates_by_characters():
    graph = build_dag([Node("a", title="ÄÖÜ" * 20, rig="")], [])
    assert "ÄÖÜ" * 9 + "Ä.." in formatting.render_wave_table(graph, [["a"]])


def test_u39_render_errors():
    text = formatting.render_findings(
        "Errors", dag.detect_errors(make("ab", [("a", "b"), ("b", "a")]))
    )
    assert "[cycle]" in text and "Affected: b, a" in text and "Fix: remove one" in text


def test_u31_sn06_json_shapes():
    graph = make(
        [("root", "epic", "open", "g"), "b", "a"],
        [("root", "a", "parent-child"), ("root", "b", "parent-child"), ("a", "b")],
    )
    tree = formatting.tree_json(graph, dag.EPIC, "root")
    assert len(tree) == 1 and [c["id"] for c in tree[0]["children"]] == ["a", "b"]
    waves_json = formatting.waves_json(graph, [["a"], ["b"]])
    assert waves_json[1]["tasks"][0]["blocked_by"] == ["a"]
    json.dumps(waves_json)


def test_critical_path_skips_done_work():
    graph = make([("a", "task", "closed", "g"), "b", "c", "d"], [("a", "b"), ("b", "c")])
    assert dag.critical_path(graph) == ["b", "c"]


# --- properties (PT-01…PT-06) ---------------------------------------------------------------
@st.composite
def acyclic(draw, max_nodes=25):
    count = draw(st.integers(min_value=1, max_value=max_nodes))
    ids = [f"t{i:02d}" for i in range(count)]
    edges = draw(
        st.lists(
            st.tuples(st.integers(0, count - 1), st.integers(0, count - 1)), max_size=count * 2
        )
    )
    deps = [(ids[min(a, b)], ids[max(a, b)]) for a, b in edges if a != b]
    return ids, deps


@settings(max_examples=150, deadline=None)
@given(acyclic())
def test_pt01_to_pt03_every_task_once_never_before_its_blocker(graph_spec):
    ids, deps = graph_spec
    graph = make(ids, deps)
    result, gated = compute_waves(graph)
    assert result and result[0] and not gated
    placed = [n for wave in result for n in wave]
    assert sorted(placed) == sorted(ids) and len(placed) == len(set(placed))
    position = dag.wave_of(result)
    for blocker, blocked in deps:
        assert position[blocked] > position[blocker]
    assert find_cycle(graph) is None


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=2, max_value=30), st.data())
def test_pt04_back_edge_always_found(length, data):
    ids = [f"n{i:02d}" for i in range(length)]
    chain = [(ids[i], ids[i + 1]) for i in range(length - 1)]
    start = data.draw(st.integers(0, length - 1))
    graph = make(ids, [*chain, (ids[-1], ids[start])])
    cycle = find_cycle(graph)
    assert cycle and set(cycle) == set(ids[start:])


@settings(max_examples=50, deadline=None)
@given(acyclic())
def test_pt05_deterministic(graph_spec):
    ids, deps = graph_spec
    first = compute_waves(make(ids, deps))[0]
    for _ in range(5):
        assert compute_waves(make(list(reversed(ids)), list(reversed(deps))))[0] == first


@settings(max_examples=80, deadline=None)
@given(acyclic(), st.data())
def test_pt06_parent_child_does_not_affect_waves(graph_spec, data):
    ids, deps = graph_spec
    plain = compute_waves(make(ids, deps))[0]
    parents = [f"epic{i}" for i in range(3)]
    hierarchy = [
        (data.draw(st.sampled_from(parents)), i, "parent-child")
        for i in ids
        if data.draw(st.floats(0, 1)) < 0.6
    ]
    spec = [*ids, *[(p, "epic", "open", "gastown") for p in parents]]
    with_epics = compute_waves(make(spec, [*deps, *hierarchy]))[0]
    assert with_epics == plain
    assert not any(p in wave for wave in with_epics for p in parents)
