"""The convoy DAG's layout against the drawing it replaced, on the same graphs: edge crossings
(counted in each channel between two columns), edges drawn through a box that is not their
end, layout time (median of --runs) and the size of the edges' SVG.

"column order" is the old drawing: each wave a column sorted by id, every edge one curve from
its source to its target (through whatever lies between). "layered" is convoys/core/layout.py:
lanes through the columns in between and barycenter sweeps.

Graphs: the two real epics (gt-si8rq, bd-f8b764c9 from ../shared/data/beads, skipped when
absent) and generated epics shaped like bench/pages.py's (each bead blocked by some of the
beads 7, 14 and 21 before it) and with random long edges.

    .venv/bin/python bench/layout.py [--runs 5] [--sizes 1000,5000]
"""

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from convoys.core import dag as dagmod  # noqa: E402
from convoys.core import layout  # noqa: E402
from convoys.core.layout import checks  # noqa: E402

SHARED = ROOT.parent / "shared" / "data" / "beads"
W, H, GAP, PAD = layout.NODE_W, layout.NODE_H, layout.COL_GAP, layout.PAD
EXEC = dagmod.EXECUTION_TYPES


def column_order(waves, gated, edges):
    """The old drawing (convoys/core/layout.py before the layered layout)."""
    columns = [list(w) for w in waves] + ([sorted(gated)] if gated else [])
    pos = {}
    for col, ids in enumerate(columns):
        for row, node_id in enumerate(ids):
            pos[node_id] = (PAD + col * (W + GAP), PAD + row * (H + 12))
    paths = []
    for a, b in edges:
        if a in pos and b in pos:
            x1, y1 = pos[a][0] + W, pos[a][1] + H // 2
            x2, y2 = pos[b][0], pos[b][1] + H // 2
            mid = (x1 + x2) // 2
            paths.append((a, b, f"M{x1},{y1}C{mid},{y1} {mid},{y2} {x2},{y2}"))
    return pos, paths


def epic(path, epic_id):
    records = [json.loads(line) for line in path.open() if line.strip()]
    by_id = {r["id"]: r for r in records if "id" in r}
    members, frontier = set(), {epic_id}
    while frontier:  # the epic's descendants
        kids = {
            r["id"]
            for r in records
            for d in r.get("dependencies") or []
            if d.get("type") == "parent-child" and d.get("depends_on_id") in frontier
        }
        frontier = kids - members
        members |= kids
    nodes = [
        dagmod.Node(i, by_id[i].get("title", ""), by_id[i].get("issue_type", "task"))
        for i in members
    ]
    deps = [
        (i, d["depends_on_id"], d["type"])
        for i in members
        for d in by_id[i].get("dependencies") or []
        if d.get("type") in EXEC
    ]
    outside = sorted({t for _, t, _ in deps if t not in members})
    nodes += [dagmod.Node(t, "", by_id.get(t, {}).get("issue_type", "?")) for t in outside]
    return nodes, deps


def generated(n, seed, long_edges=False):
    rng = random.Random(seed)
    nodes = [dagmod.Node(f"g{i:05d}") for i in range(n)]
    deps = []
    for i in range(n):
        for back in (1, 2, 3):
            if i - back * 7 >= 0 and rng.random() < 0.5:
                deps.append((f"g{i:05d}", f"g{i - back * 7:05d}", "blocks"))
        if long_edges and i > 50 and rng.random() < 0.05:
            deps.append((f"g{i:05d}", f"g{rng.randrange(i - 50):05d}", "blocks"))
    return nodes, deps


def prepare(nodes, deps):
    graph = dagmod.build_dag(nodes, deps)
    waves, gated = dagmod.compute_waves(graph)
    outside = sorted(i for i, n in graph.nodes.items() if not n.slingable)
    return waves, [g.id for g in gated], list(graph.graph.edges), outside


def channels(xs):
    xs = sorted(set(xs))
    return [(x + W, nx) for x, nx in zip(xs, xs[1:], strict=False)]


def measure(name, nodes, deps, runs):
    waves, gated, edges, outside = prepare(nodes, deps)
    old_times, new_times = [], []
    for _ in range(runs):
        started = time.perf_counter()
        pos, old_paths = column_order(waves, gated, edges)
        old_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        geometry = layout.compute(waves, gated, edges, outside=outside)
        new_times.append(time.perf_counter() - started)
    old_boxes = {k: (x, y, W, H) for k, (x, y) in pos.items()}
    new_boxes = {k: (x, y, W, H) for k, (x, y) in geometry["nodes"].items()}
    new_paths = [(a, b, d) for a, b, d, _ in geometry["edges"]]
    old_cross = checks.crossings(old_paths, channels(x for x, _ in pos.values()))
    new_cross = checks.crossings(new_paths, channels(x for x, _ in geometry["columns"]))
    old_hits = len({(a, b) for a, b, _ in checks.through_boxes(old_boxes, old_paths)})
    new_hits = len({(a, b) for a, b, _ in checks.through_boxes(new_boxes, new_paths)})
    old_t, new_t = statistics.median(old_times), statistics.median(new_times)
    ratio = f"{old_cross / new_cross:.1f}x" if new_cross else ("-" if not old_cross else "all")
    old_kb = sum(len(d) + 60 for _, _, d in old_paths) / 1024  # 60: the element around d
    new_kb = sum(len(d) + 60 for _, _, d in new_paths) / 1024
    print(
        f"{name:<34} {len(geometry['nodes']):>6} {len(edges):>6} {len(waves):>5}"
        f" {old_cross:>8} {new_cross:>8} {ratio:>6}"
        f" {old_hits:>6} {new_hits:>5}"
        f" {old_t * 1000:>8.1f} {new_t * 1000:>9.1f} {new_t / max(old_t, 1e-9):>7.0f}x"
        f" {old_kb:>7.0f} {new_kb:>7.0f}"
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", default="1000,5000")
    args = parser.parse_args()
    print(
        f"{'graph':<34} {'nodes':>6} {'edges':>6} {'waves':>5}"
        f" {'x old':>8} {'x new':>8} {'fewer':>6} {'thru old':>6} {'new':>5}"
        f" {'ms old':>8} {'ms layered':>9} {'ratio':>7} {'KB old':>7} {'KB new':>7}"
    )
    cases = []
    for file, epic_id in (
        ("steveyegge+gastown+issues.jsonl", "gt-si8rq"),
        ("steveyegge+beads+issues@ce622f5.jsonl", "bd-f8b764c9"),
    ):
        path = SHARED / file
        if path.exists():
            cases.append((f"real epic {epic_id}", *epic(path, epic_id)))
        else:
            print(f"(skipped {epic_id}: {path} is absent)")
    for size in [int(s) for s in args.sizes.split(",") if s]:
        cases.append((f"generated {size:,} (pages.py shape)", *generated(size, 5)))
        cases.append((f"generated {size:,} + long edges", *generated(size, 7, True)))
    for name, nodes, deps in cases:
        measure(name, nodes, deps, args.runs)
    print(
        "x: edge crossings (pairs of edges whose order swaps in a channel); thru: edges drawn"
        " through a box that is not their end; ms: layout time, median of"
        f" {args.runs}; ratio: layered / column order; KB: the edges' SVG"
    )


if __name__ == "__main__":
    main()
