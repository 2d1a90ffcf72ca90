"""Pure dependency-graph logic for staging: no Django here.

Build the DAG of a set of beads (execution edges vs parent-child hierarchy vs ignored types),
find one cycle the way Gas Town reports it, compute dispatch waves with Kahn's algorithm,
list gated tasks, detect errors and warnings, choose the staged status, and find the
critical path. Behaviour and messages follow Gas Town's `gt convoy stage` (docs/graph.md).
"""

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from convoys.core.history import DONE_STATUSES
from convoys.core.lazy import lazy_module

if TYPE_CHECKING:
    import networkx as nx
else:
    nx = lazy_module("networkx")  # staging and graphs only, not every command's start-up

SLINGABLE_TYPES = frozenset({"task", "bug", "feature", "chore", ""})
EXECUTION_TYPES = frozenset({"blocks", "conditional-blocks", "waits-for", "merge-blocks"})
HIERARCHY_TYPE = "parent-child"
DONE = frozenset(DONE_STATUSES)  # skipped too: not needed is as good as done for a plan
CAPACITY_THRESHOLD = 5

EPIC, TASKS, CONVOY = "epic", "tasks", "convoy"


def is_slingable(issue_type: str | None) -> bool:
    return (issue_type or "") in SLINGABLE_TYPES


@dataclass
class Node:
    id: str
    title: str = ""
    type: str = "task"
    status: str = "open"
    rig: str = ""
    blocks: list[str] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    parent: str = ""

    @property
    def slingable(self) -> bool:
        return is_slingable(self.type)

    @property
    def done(self) -> bool:
        return self.status in DONE


@dataclass
class Finding:
    category: str
    severity: str
    bead_ids: list[str]
    message: str
    suggested_fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "category": self.category,
            "bead_ids": list(self.bead_ids),
            "message": self.message,
        }
        if self.suggested_fix:
            data["suggested_fix"] = self.suggested_fix
        return data


@dataclass
class Gated:
    id: str
    gated_by: list[str]


class Waves(NamedTuple):
    """compute_waves' result: `waves` (ids per wave, in dispatch order) and the slingable
    beads left out because a non-slingable blocker gates them."""

    waves: list[list[str]]
    gated: list[Gated]


class Parallelism(NamedTuple):
    """The largest wave: its size and its number (1-based; 0 when there are no waves)."""

    size: int
    wave: int


class NoSlingableTasks(ValueError):
    def __init__(self) -> None:
        super().__init__("no slingable tasks in DAG (need task, bug, feature, or chore)")


class DAG:
    """Nodes by id plus the execution graph (edge blocker -> blocked)."""

    def __init__(self, nodes: dict[str, Node]) -> None:
        self.nodes = nodes
        self.graph: nx.DiGraph[str] = nx.DiGraph()
        self.graph.add_nodes_from(nodes)
        # Blocking edges to ids outside the graph, (target, issue), and how a page names those
        # targets ({id: (kind, title, status)}): set by the reader that knows the store.
        self.ghost_edges: list[tuple[str, str]] = []
        self.ghosts: dict[str, tuple[str, str, str]] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def slingable_ids(self) -> list[str]:
        return sorted(n.id for n in self.nodes.values() if n.slingable)


def build_dag(nodes: Iterable[Node], deps: Iterable[tuple[str, str, str]]) -> DAG:
    """`nodes`: iterable of Node; `deps`: iterable of (issue_id, depends_on_id, type).

    A dependency with either end outside the node set is dropped; execution types make
    edges, parent-child sets the hierarchy, every other type is ignored.
    """
    by_id = {node.id: node for node in nodes}
    dag = DAG(by_id)
    for issue_id, target_id, dep_type in deps:
        issue, target = by_id.get(issue_id), by_id.get(target_id)
        if issue is None or target is None:
            continue
        if dep_type in EXECUTION_TYPES:
            target.blocks.append(issue_id)
            issue.blocked_by.append(target_id)
            dag.graph.add_edge(target_id, issue_id)
        elif dep_type == HIERARCHY_TYPE:
            target.children.append(issue_id)
            if not issue.parent:
                issue.parent = target_id
    return dag


def find_cycle(dag: DAG) -> list[str] | None:
    """One cycle path over execution edges, or None.

    Depth-first from nodes in sorted order, neighbours sorted; on a back edge from -> to the
    path is to, then from's ancestors back to `to`, reversed: a<->b gives [b, a], a->a [a].
    """
    white, gray, black = 0, 1, 2
    colour = dict.fromkeys(dag.nodes, white)
    parent: dict[str, str] = {}
    successors = {n: sorted(set(dag.nodes[n].blocks)) for n in dag.nodes}
    for start in sorted(dag.nodes):
        if colour[start] != white:
            continue
        colour[start] = gray
        stack = [(start, iter(successors[start]))]
        while stack:
            node, children = stack[-1]
            advanced = False
            for child in children:
                if colour[child] == gray:
                    path, cur = [child], node
                    while cur != child:
                        path.append(cur)
                        cur = parent[cur]
                    path.reverse()
                    return path
                if colour[child] == white:
                    colour[child] = gray
                    parent[child] = node
                    stack.append((child, iter(successors[child])))
                    advanced = True
                    break
            if not advanced:
                colour[node] = black
                stack.pop()
    return None


def compute_waves(dag: DAG) -> Waves:
    """Kahn's algorithm among slingable nodes -> Waves(waves, gated).

    A slingable node's in-degree counts every slingable blocker (whatever its status: closed
    tasks keep their wave) plus every open non-slingable blocker (a gate, never released).
    Each wave is sorted by id. Nodes left when nothing has in-degree 0 are gated.
    """
    slingable = {n.id for n in dag.nodes.values() if n.slingable}
    if not slingable:
        raise NoSlingableTasks()
    indegree: dict[str, int] = {}
    for node_id in slingable:
        count = 0
        for blocker in dag.nodes[node_id].blocked_by:
            other = dag.nodes[blocker]
            if other.slingable or other.status not in DONE:
                count += 1
        indegree[node_id] = count
    pending = set(slingable)
    waves: list[list[str]] = []
    ready = sorted(n for n in pending if indegree[n] == 0)
    while ready:
        waves.append(ready)
        following: list[str] = []
        for node_id in ready:
            pending.discard(node_id)
        for node_id in ready:
            for blocked in dag.nodes[node_id].blocks:
                if blocked in pending:
                    indegree[blocked] -= 1
                    if indegree[blocked] == 0:
                        following.append(blocked)
        ready = sorted(set(following))
    gated: list[Gated] = []
    for node_id in sorted(pending):
        gates = sorted(
            b
            for b in set(dag.nodes[node_id].blocked_by)
            if not dag.nodes[b].slingable and dag.nodes[b].status not in DONE
        )
        gated.append(Gated(node_id, gates))
    return Waves(waves, gated)


def detect_errors(dag: DAG) -> list[Finding]:
    findings: list[Finding] = []
    cycle = find_cycle(dag)
    if cycle:
        chain = " → ".join(cycle)
        findings.append(
            Finding(
                "cycle",
                "error",
                cycle,
                f"dependency cycle detected: {chain}",
                f"remove one blocking dependency in the chain: {chain}",
            )
        )
    for node_id in dag.slingable_ids():
        if not dag.nodes[node_id].rig:
            findings.append(
                Finding(
                    "no-rig",
                    "error",
                    [node_id],
                    f"bead {node_id} has no valid rig (prefix not mapped in routes.jsonl or "
                    "resolves to empty)",
                    f"add a routes.jsonl entry mapping the prefix of {node_id} to a rig, or check "
                    "that the bead ID has a valid prefix",
                )
            )
    return _sorted(findings)


def detect_warnings(
    dag: DAG,
    input_kind: str,
    rig_states: Mapping[str, str] | None = None,
    branches: Collection[str] = frozenset(),
) -> list[Finding]:
    """Warnings before gating: orphan (epic input), blocked-rig, cross-rig, capacity,
    missing-branch. `rig_states`: {rig: "active"|"parked"|"docked"}; `branches`: sub-epics
    that have an integration branch."""
    rig_states = rig_states or {}
    findings: list[Finding] = []
    slingable = [dag.nodes[i] for i in dag.slingable_ids()]
    if input_kind == EPIC:
        for node in slingable:
            if not node.blocks and not node.blocked_by:
                findings.append(
                    Finding(
                        "orphan",
                        "warning",
                        [node.id],
                        f"task {node.id} has no blocking dependencies with other staged tasks "
                        "(isolated in wave graph)",
                        f"add a blocking dependency for {node.id}, or verify it should be staged "
                        "independently",
                    )
                )
    by_rig: dict[str, list[str]] = {}
    for node in slingable:
        if node.rig:
            by_rig.setdefault(node.rig, []).append(node.id)
    for rig in sorted(by_rig):
        state = rig_states.get(rig, "active")
        if state in ("parked", "docked"):
            ids = sorted(by_rig[rig])
            verb = "unpark" if state == "parked" else "undock"
            findings.append(
                Finding(
                    "blocked-rig",
                    "warning",
                    ids,
                    f'{len(ids)} bead{"" if len(ids) == 1 else "s"} target {state} rig "{rig}": '
                    f"{', '.join(ids)}",
                    f"restore the rig: python manage.py rigs {verb} {rig}",
                )
            )
    if len(by_rig) >= 2:
        primary = min(by_rig, key=lambda r: (-len(by_rig[r]), r))
        for node in slingable:
            if node.rig and node.rig != primary:
                findings.append(
                    Finding(
                        "cross-rig",
                        "warning",
                        [node.id],
                        f'task {node.id} is on rig "{node.rig}" (primary rig is "{primary}")',
                        f"verify cross-rig routing for {node.id} or reassign to {primary}",
                    )
                )
    try:
        waves, _ = compute_waves(dag)
    except NoSlingableTasks:
        waves = []
    for number, wave in enumerate(waves, start=1):
        if len(wave) > CAPACITY_THRESHOLD:
            findings.append(
                Finding(
                    "capacity",
                    "warning",
                    list(wave),
                    f"wave {number} has {len(wave)} tasks (threshold: {CAPACITY_THRESHOLD}) — may "
                    "exceed parallel capacity",
                )
            )
    for node in dag.nodes.values():
        if node.type == "epic" and node.parent and node.children and node.id not in branches:
            findings.append(
                Finding(
                    "missing-branch",
                    "warning",
                    [node.id],
                    f"sub-epic {node.id} has {len(node.children)} children but no integration branch",
                    f"create an integration branch for sub-epic {node.id}",
                )
            )
    return _sorted(findings)


def gated_warnings(gated: Iterable[Gated]) -> list[Finding]:
    findings: list[Finding] = []
    for item in gated:
        gates = ", ".join(item.gated_by)
        findings.append(
            Finding(
                "gated",
                "warning",
                [item.id],
                f"task {item.id} is gated by non-slingable blocker(s): {gates}",
                f"close or tombstone {gates} to include {item.id} in waves",
            )
        )
    return findings


def choose_status(errors: Collection[Finding], warnings: Collection[Finding]) -> str:
    if errors:
        return ""
    return "staged_warnings" if warnings else "staged_ready"


def _sorted(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: f.bead_ids[0] if f.bead_ids else "")


def critical_path(dag: DAG, done: Iterable[str] | None = None) -> list[str]:
    """The longest chain of unfinished slingable beads along execution edges (ids in order).

    One pass in topological order (longest path in a DAG); ties go to the chain whose end
    comes first in that order. [] when there is no unfinished work or the graph has a cycle."""
    done = set(done) if done is not None else {n.id for n in dag.nodes.values() if n.done}
    keep = {n for n, node in dag.nodes.items() if node.slingable and n not in done}
    if not keep:
        return []
    try:
        order = [n for n in nx.topological_sort(dag.graph) if n in keep]
    except nx.NetworkXUnfeasible:
        return []
    length: dict[str, int] = {}
    previous: dict[str, str | None] = {}
    predecessors = dag.graph.pred
    for node in order:
        best, via = 0, None
        parent: str
        for parent in predecessors[node]:
            if parent in keep and length[parent] > best:
                best, via = length[parent], parent
        length[node], previous[node] = best + 1, via
    end: str | None = max(order, key=length.__getitem__)
    path: list[str] = []
    while end is not None:
        path.append(end)
        end = previous[end]
    return path[::-1]


def wave_of(waves: Iterable[Iterable[str]]) -> dict[str, int]:
    return {node_id: number for number, wave in enumerate(waves, start=1) for node_id in wave}


def max_parallelism(waves: Iterable[Collection[str]]) -> Parallelism:
    """The largest wave (size, number); ties go to the earliest wave; (0, 0) when empty."""
    best, number = 0, 0
    for index, wave in enumerate(waves, start=1):
        if len(wave) > best:
            best, number = len(wave), index
    return Parallelism(best, number)
