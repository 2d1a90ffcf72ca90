"""Server-side DAG layout: a layered (Sugiyama) layout whose layers are the waves. Pure Python.

Layers, left to right: the beads from outside the convoy's waves (gates and decisions, unknown
and external targets; only when there are any), one layer per wave (a collapsed wave is one
summary box), then the gated beads (split into as many layers as their own chains need). An
edge that spans several layers passes each layer in between through a virtual node: a lane
between two boxes of that column, never through one. Node order in each layer comes from
barycenter sweeps (fewest crossings of the sweeps is kept); vertical positions from
least-squares placement (pool adjacent violators) that keeps long edges straight.

The geometry depends only on the graph (beads and edges), never on statuses, so it is cached
by a fingerprint of the graph and re-used across status changes.

Edge paths: in a channel between two columns (where there are no boxes) a cubic whose control
points share the channel's middle x, so the curve stays inside the channel; across a column
a horizontal segment in its lane.
"""

import hashlib
import math
from bisect import bisect_right, insort
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TypedDict

Edge = tuple[str, str]  # blocker -> blocked


# A bead id, a collapsed wave ("summary", wave, count) or the rest of a wave drawn in part
# ("more", wave, count).
Key = str | tuple[str, int, int]


Point = tuple[float, float]


Box = tuple[float, float, float, float]  # x, y, width, height


StatusClass = Callable[[str], tuple[str, str]]  # status -> (css class, icon)


class Geometry(TypedDict):
    """compute()'s drawing (a plain dict at run time: it is cached as is)."""

    nodes: dict[str, tuple[int, int]]  # bead id -> top left
    summaries: dict[int, tuple[int, int, int]]  # collapsed wave -> x, y, beads in it
    more: dict[int, tuple[int, int, int]]  # wave drawn in part -> x, y, beads not drawn
    edges: list[tuple[str, str, str, bool]]  # from, to, SVG path, drawn reversed
    columns: list[tuple[int, str]]  # x, label
    outside: list[str]
    width: int
    height: int
    crossings: int


NODE_W, NODE_H, COL_GAP, ROW_GAP, PAD = 190, 40, 70, 12, 20


HEAD = 22  # the column labels above the nodes


LANE = 8  # between an edge passing a column and the box or edge next to it


LOOP = 16  # how far into the channel an edge between two boxes of one column bends


OVERLAY_ID = "dag-overlay"


MAX_SWEEPS = 8


# Work caps for big graphs (elements = beads + lanes): fewer sweeps and placement rounds, so
# the layout of a 5,000-bead convoy with many long edges stays within a second or two.
SWEEP_BUDGET = 200_000  # elements x sweeps


PLACE_BUDGET = 60_000  # elements x placement rounds


VIRTUAL_WEIGHT = 4  # a long edge's lanes pull harder than boxes: long edges stay straight


def fingerprint(
    node_ids: Iterable[str],
    edges: Iterable[Edge],
    collapsed: Iterable[int] = (),
    columns: Iterable[Sequence[str]] = (),
    drawn: Mapping[int, Sequence[str]] | None = None,
) -> str:
    """A drawing's key: its nodes, edges, collapsed waves and columns (the waves and the gated
    column, which an open gate's close changes without changing the graph), and which waves
    and beads of them are drawn (an overview's window)."""
    digest = hashlib.sha1()
    digest.update(b"sugiyama-2")
    for part in (sorted(node_ids), sorted(edges), sorted(collapsed), list(columns)):
        digest.update(repr(part).encode())
    if drawn is not None:
        digest.update(repr(sorted((n, list(ids)) for n, ids in drawn.items())).encode())
    return digest.hexdigest()


# --- layers ----------------------------------------------------------------------------------
def _gated_layers(gated_ids: Iterable[str], edges: Iterable[Edge]) -> list[list[str]]:
    """The gated beads in layers by their own chains (Kahn; a cycle is broken at its smallest
    id, so every edge among them goes to a later layer but the one that closes a cycle)."""
    gated = set(gated_ids)
    preds: dict[str, set[str]] = {g: set() for g in gated}
    succs: dict[str, set[str]] = {g: set() for g in gated}
    for a, b in edges:
        if a in gated and b in gated and a != b:
            preds[b].add(a)
            succs[a].add(b)
    indegree = {g: len(preds[g]) for g in gated}
    pending = set(gated)
    layers: list[list[str]] = []
    while pending:
        ready = sorted(g for g in pending if indegree[g] == 0) or [min(pending)]
        layers.append(ready)
        for g in ready:
            pending.discard(g)
        for g in ready:
            for s in succs[g]:
                if s in pending:
                    indegree[s] -= 1
    return layers


def _layers(
    waves: Sequence[Sequence[str]],
    gated_ids: Iterable[str],
    edges: Iterable[Edge],
    collapsed: Collection[int],
    outside: Iterable[str],
    drawn: Mapping[int, Sequence[str]] | None = None,
) -> list[tuple[str, Sequence[Key]]]:
    """[(label, [ids])] left to right; a collapsed wave holds one ("summary", n, count) key.
    With `drawn` ({wave: ids}) only those waves get a column, each with those of its beads
    and one ("more", n, count) key for the rest."""
    layers: list[tuple[str, Sequence[Key]]] = []
    if outside:
        layers.append(("Gates & outside", sorted(outside)))
    for number, wave in enumerate(waves, start=1):
        if drawn is not None:
            if number not in drawn:
                continue
            shown: list[Key] = list(drawn[number])
            if len(wave) > len(shown):
                shown.append(("more", number, len(wave) - len(shown)))
            layers.append((f"Wave {number}", shown))
        elif number in collapsed:
            layers.append((f"Wave {number}", [("summary", number, len(wave))]))
        else:
            layers.append((f"Wave {number}", list(wave)))
    for index, ids in enumerate(_gated_layers(gated_ids, edges)):
        layers.append(("Gated" if index == 0 else "", ids))
    return layers


# --- crossing reduction ----------------------------------------------------------------------
def _pair_crossings(upper: list[int], down: list[list[int]], pos: list[int]) -> int:
    """Crossings between two adjacent layers: edges whose lower ends are out of the order of
    their upper ends (the upper layer is in position order; edges of one node never cross)."""
    seen: list[int] = []
    count = 0
    for e in upper:
        near = down[e]
        if not near:
            continue
        ends = [pos[near[0]]] if len(near) == 1 else sorted([pos[d] for d in near])
        for p in ends:
            count += len(seen) - bisect_right(seen, p)
        for p in ends:
            insort(seen, p)
    return count


def _all_crossings(order: list[list[int]], down: list[list[int]], pos: list[int]) -> int:
    return sum(_pair_crossings(order[i], down, pos) for i in range(len(order) - 1))


def _sweep(
    order: list[list[int]], neighbours: list[list[int]], pos: list[int], layer_range: Iterable[int]
) -> None:
    for i in layer_range:
        layer = order[i]
        keys: dict[int, float] = {}
        for e in layer:
            near = neighbours[e]
            if len(near) == 1:
                keys[e] = pos[near[0]]
            else:
                keys[e] = sum([pos[n] for n in near]) / len(near) if near else pos[e]
        layer.sort(key=keys.__getitem__)
        for p, e in enumerate(layer):
            pos[e] = p


def _order(
    order: list[list[int]], up: list[list[int]], down: list[list[int]], pos: list[int], sweeps: int
) -> tuple[list[list[int]], int]:
    best = [list(layer) for layer in order]
    best_count = _all_crossings(order, down, pos)
    stale = 0
    for _ in range(sweeps):
        if best_count == 0 or stale >= 2:
            break
        _sweep(order, up, pos, range(1, len(order)))
        _sweep(order, down, pos, range(len(order) - 2, -1, -1))
        count = _all_crossings(order, down, pos)
        if count < best_count:
            best, best_count, stale = [list(layer) for layer in order], count, 0
        else:
            stale += 1
    for layer in best:
        for p, e in enumerate(layer):
            pos[e] = p
    return best, best_count


# --- vertical placement ----------------------------------------------------------------------
def _isotonic(targets: list[float], weights: list[float]) -> list[float]:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    values: list[float] = []
    totals: list[float] = []
    counts: list[int] = []
    for v, w in zip(targets, weights, strict=True):
        c = 1
        while values and values[-1] > v:
            pv, pw = values.pop(), totals.pop()
            v = (pv * pw + v * w) / (pw + w)
            w += pw
            c += counts.pop()
        values.append(v)
        totals.append(w)
        counts.append(c)
    out: list[float] = []
    for v, c in zip(values, counts, strict=True):
        out.extend([v] * c)
    return out


def _place(
    order: list[list[int]],
    up: list[list[int]],
    down: list[list[int]],
    height: list[int],
    virtual: list[bool],
    rounds: int = 3,
) -> dict[int, float]:
    """Top y of every element: stacked with their gaps, then pulled towards the centres of
    their neighbours, down and up, keeping order and gaps."""
    mid = [0.0] * len(height)  # centres
    offsets: list[list[float]] = []
    for layer in order:
        offs: list[float] = []
        y = 0.0
        for k, e in enumerate(layer):
            if k:
                prev = layer[k - 1]
                gap = ROW_GAP if not (virtual[prev] or virtual[e]) else LANE
                y += (height[prev] + height[e]) / 2 + gap
            offs.append(y)
            mid[e] = y
        offsets.append(offs)
    # Every layer stays inside the band of the tallest one: pulls cannot drift the drawing.
    band = max(
        (
            offs[-1] + (height[layer[0]] + height[layer[-1]]) / 2
            for layer, offs in zip(order, offsets, strict=True)
            if layer
        ),
        default=0.0,
    )
    pull = [VIRTUAL_WEIGHT if v else 1 for v in virtual]

    def settle(i: int, neighbours: list[list[int]]) -> None:
        layer, offs = order[i], offsets[i]
        targets: list[float] = []
        weights: list[float] = []
        for e, off in zip(layer, offs, strict=True):
            near = neighbours[e]
            if near:
                total = 0.0
                for n in near:
                    total += mid[n]
                targets.append(total / len(near) - off)
                weights.append(pull[e])
            else:
                targets.append(mid[e] - off)
                weights.append(pull[e] * 0.2)
        if not layer:
            return
        fitted = _isotonic(targets, weights)
        low = height[layer[0]] / 2 - fitted[0]  # least shift that keeps the top in the band
        high = band - height[layer[-1]] / 2 - offs[-1] - fitted[-1]
        shift = min(max(0.0, low), high)
        for e, z, off in zip(layer, fitted, offs, strict=True):
            mid[e] = z + off + shift

    for _ in range(rounds):
        for i in range(1, len(order)):
            settle(i, up)
        for i in range(len(order) - 2, -1, -1):
            settle(i, down)
    return {e: mid[e] - height[e] / 2 for e in range(len(height))}


# --- the layout ------------------------------------------------------------------------------
def compute(
    waves: Sequence[Sequence[str]],
    gated_ids: Iterable[str],
    edges: Collection[Edge],
    collapsed: Collection[int] = frozenset(),
    outside: Collection[str] = (),
    sweeps: int = MAX_SWEEPS,
    drawn: Mapping[int, Sequence[str]] | None = None,
) -> Geometry:
    """-> {"nodes": {id: (x, y)}, "summaries": {wave: (x, y, count)}, "edges": [(from, to, d,
    reversed)], "columns": [(x, label)], "width", "height", "crossings"}.

    `outside`: ids drawn before wave 1 (gates, decisions, unknown and external targets).
    Collapsed waves draw as one summary box; edges to beads in them are left out. `drawn`
    ({wave: ids}, an overview): only those waves and beads are drawn, the rest of each such
    wave as one "N more" box; edges to beads not drawn are left out."""
    layers = _layers(waves, gated_ids, edges, collapsed, outside, drawn)
    layer_of: dict[str, int] = {}
    keys: list[Key] = []
    order: list[list[int]] = []
    for i, (_, ids) in enumerate(layers):
        row: list[int] = []
        for key in ids:
            e = len(keys)
            keys.append(key)
            if not isinstance(key, tuple):
                layer_of[key] = i
            row.append(e)
        order.append(row)
    element = {key: e for e, key in enumerate(keys) if not isinstance(key, tuple)}
    height = [NODE_H] * len(keys)
    virtual = [False] * len(keys)
    layer_index = [i for i, row in enumerate(order) for _ in row]
    up: list[list[int]] = [[] for _ in keys]
    down: list[list[int]] = [[] for _ in keys]

    def add(layer: int) -> int:
        e = len(height)
        height.append(0)
        virtual.append(True)
        layer_index.append(layer)
        up.append([])
        down.append([])
        order[layer].append(e)
        return e

    chains: list[tuple[str, str, list[int] | None, bool]] = []
    seen: set[Edge] = set()
    for a, b in edges:
        if (a, b) in seen or a not in layer_of or b not in layer_of:
            continue
        seen.add((a, b))
        la, lb = layer_of[a], layer_of[b]
        if la == lb:
            chains.append((a, b, None, False))
            continue
        reverse = la > lb
        src, dst = (b, a) if reverse else (a, b)
        lo, hi = min(la, lb), max(la, lb)
        chain = [element[src]] + [add(lv) for lv in range(lo + 1, hi)] + [element[dst]]
        for s, t in zip(chain, chain[1:], strict=False):
            down[s].append(t)
            up[t].append(s)
        chains.append((a, b, chain, reverse))

    pos = [0] * len(height)
    for row in order:
        for p, e in enumerate(row):
            pos[e] = p
    size = max(len(height), 1)
    sweeps = min(sweeps, max(1, SWEEP_BUDGET // size)) if sweeps else 0
    order, crossings = _order(order, up, down, pos, sweeps)
    top = _place(order, up, down, height, virtual, rounds=min(3, max(1, PLACE_BUDGET // size)))
    lowest = min(top.values(), default=0)
    shift = PAD + HEAD - lowest
    xs = [PAD + i * (NODE_W + COL_GAP) for i in range(len(order))]

    rounded = {e: round(t + shift) for e, t in top.items()}
    for row in order:  # rounding must not eat a gap (two halves can round apart by 1 px)
        for prev, e in zip(row, row[1:], strict=False):
            gap = ROW_GAP if not (virtual[prev] or virtual[e]) else LANE
            rounded[e] = max(rounded[e], rounded[prev] + height[prev] + gap)

    def y_of(e: int) -> int:
        return rounded[e]

    positions: dict[str, tuple[int, int]] = {}
    summaries: dict[int, tuple[int, int, int]] = {}
    more: dict[int, tuple[int, int, int]] = {}
    for e, key in enumerate(keys):
        x, y = xs[layer_index[e]], y_of(e)
        if isinstance(key, tuple):
            (summaries if key[0] == "summary" else more)[key[1]] = (x, y, key[2])
        else:
            positions[key] = (x, y)
    routed: list[tuple[str, str, str, bool]] = []
    for a, b, lanes, reverse in chains:
        if lanes is None:
            routed.append((a, b, _loop(positions[a], positions[b]), False))
            continue
        routed.append((a, b, _route(lanes, xs, layer_index, y_of), reverse))
    bottom = max((rounded[e] + height[e] for e in range(len(height))), default=PAD + HEAD)
    return {
        "nodes": positions,
        "summaries": summaries,
        "more": more,
        "edges": routed,
        "columns": [(xs[i], label) for i, (label, _) in enumerate(layers)],
        "outside": sorted(outside),
        "width": PAD * 2 + max(len(order), 1) * (NODE_W + COL_GAP) - COL_GAP,
        "height": math.ceil(bottom) + PAD,
        "crossings": crossings,
    }


def _route(
    chain: list[int], xs: list[int], layer_index: list[int], y_of: Callable[[int], int]
) -> str:
    """Relative commands, and a straight run (lanes at one height) as one h: a 5,000-bead
    drawing has tens of thousands of lanes."""
    x = xs[layer_index[chain[0]]] + NODE_W
    y = y_of(chain[0]) + NODE_H // 2
    out = [f"M{x},{y}"]
    run = 0  # a straight stretch not written yet
    for k, e in enumerate(chain[1:], start=1):
        nx = xs[layer_index[e]]
        last = k == len(chain) - 1
        ny = y_of(e) + (NODE_H // 2 if last else 0)
        dx, dy = nx - x, ny - y
        if dy == 0:
            run += dx
        else:
            if run:
                out.append(f"h{run}")
                run = 0
            half = dx // 2
            out.append(f"c{half},0 {half},{dy} {dx},{dy}")
        x, y = nx, ny
        if not last:  # across the column in its lane
            run += NODE_W
            x = nx + NODE_W
    if run:
        out.append(f"h{run}")
    return "".join(out)


def _loop(a: tuple[int, int], b: tuple[int, int]) -> str:
    """An edge between two boxes of one column: out of a's right side into the channel and
    back into b's right side."""
    x = a[0] + NODE_W
    y1, y2 = a[1] + NODE_H // 2, b[1] + NODE_H // 2
    return f"M{x},{y1}C{x + LOOP},{y1} {x + LOOP},{y2} {x},{y2}"
