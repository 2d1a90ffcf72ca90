"""Checks of a drawing, for the tests and bench/layout.py: the points along an edge's path,
edges that pass through a box, and edge crossings. Nothing in the product calls them.
"""

import math
import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence

from convoys.core.layout.geometry import NODE_W, Box, Point

# --- checks (tests and bench/layout.py) ------------------------------------------------------
_TOKEN = re.compile(r"([MCHLmchl])([^MCHLmchl]*)")


def edge_points(d: str, per_curve: int = 16, step: int = 10) -> list[Point]:
    """A path `d` of M, C, H and L commands (absolute or relative) as a polyline."""
    points: list[Point] = []
    x = y = 0.0
    for command, args in _TOKEN.findall(d):
        values = [float(v) for v in re.split(r"[ ,]+", args.strip()) if v]
        relative = command.islower()
        command = command.upper()
        if relative:
            values = [v + (y if k % 2 else x) for k, v in enumerate(values)]
        if command == "M":
            x, y = values
            points.append((x, y))
        elif command == "H":
            (nx,) = values
            n = max(1, math.ceil(abs(nx - x) / step))
            points += [(x + (nx - x) * k / n, y) for k in range(1, n + 1)]
            x = nx
        elif command == "L":
            x, y = values
            points.append((x, y))
        else:
            x1, y1, x2, y2, x3, y3 = values
            for k in range(1, per_curve + 1):
                t = k / per_curve
                s = 1 - t
                points.append(
                    (
                        s**3 * x + 3 * s * s * t * x1 + 3 * s * t * t * x2 + t**3 * x3,
                        s**3 * y + 3 * s * s * t * y1 + 3 * s * t * t * y2 + t**3 * y3,
                    )
                )
            x, y = x3, y3
    return points


def _segment_hits(p: Point, q: Point, box: Box, margin: float) -> bool:
    """Does segment p-q enter the box's interior (shrunk by `margin`)? (Liang-Barsky)"""
    x0, y0, w, h = box
    left, right, low, high = x0 + margin, x0 + w - margin, y0 + margin, y0 + h - margin
    dx, dy = q[0] - p[0], q[1] - p[1]
    t0, t1 = 0.0, 1.0
    for edge_p, edge_q in (
        (-dx, p[0] - left),
        (dx, right - p[0]),
        (-dy, p[1] - low),
        (dy, high - p[1]),
    ):
        if edge_p == 0:
            if edge_q < 0:
                return False
            continue
        t = edge_q / edge_p
        if edge_p < 0:
            t0 = max(t0, t)
        else:
            t1 = min(t1, t)
        if t0 > t1:
            return False
    return t1 - t0 > 1e-9


def through_boxes(
    boxes: Mapping[str, Box], paths: Iterable[tuple[str, str, str]], margin: float = 1.0
) -> list[tuple[str, str, str]]:
    """[(from, to, box id)] for every edge whose path enters a box other than its endpoints.
    `boxes`: {id: (x, y, w, h)}; `paths`: [(from, to, d)]."""
    columns: dict[float, list[tuple[float, str, Box]]] = {}
    for key, box in boxes.items():
        columns.setdefault(box[0], []).append((box[1], key, box))
    index: list[tuple[float, list[float], list[tuple[float, str, Box]]]] = []
    for x, items in sorted(columns.items()):
        items.sort()
        index.append((x, [i[0] for i in items], items))
    xs = [c[0] for c in index]
    hits: list[tuple[str, str, str]] = []
    for a, b, d in paths:
        points = edge_points(d)
        found: set[str] = set()
        for p, q in zip(points, points[1:], strict=False):
            lo_x, hi_x = min(p[0], q[0]), max(p[0], q[0])
            lo_y, hi_y = min(p[1], q[1]), max(p[1], q[1])
            start = max(0, bisect_right(xs, lo_x) - 1)
            for x, tops, items in index[start:]:
                if x > hi_x:
                    break
                if x + NODE_W < lo_x:
                    continue
                end = bisect_right(tops, hi_y)
                for k in range(max(0, bisect_right(tops, lo_y - 200) - 1), end):
                    _, key, box = items[k]
                    if key in (a, b) or key in found:
                        continue
                    if _segment_hits(p, q, box, margin):
                        found.add(key)
                        hits.append((a, b, key))
    return hits


def crossings(
    paths: Iterable[tuple[str, str, str]], boundaries: Iterable[tuple[float, float]]
) -> int:
    """Edge crossings counted in each channel between two columns: pairs of edges whose
    order at the channel's left side differs from their order at its right side.
    `boundaries`: [(left x, right x)] of the channels; `paths`: [(from, to, d)]."""
    lines = [edge_points(d) for _, _, d in paths]
    total = 0
    for left, right in boundaries:
        pairs: list[Point] = []
        for points in lines:
            y1, y2 = _y_at(points, left), _y_at(points, right)
            if y1 is not None and y2 is not None:
                pairs.append((y1, y2))
        total += _inversions(pairs)
    return total


def _y_at(points: Sequence[Point], x: float) -> float | None:
    xs = [p[0] for p in points]
    if not xs or x < min(xs) or x > max(xs):
        return None
    for p, q in zip(points, points[1:], strict=False):
        if min(p[0], q[0]) <= x <= max(p[0], q[0]):
            if q[0] == p[0]:
                return p[1]
            return p[1] + (q[1] - p[1]) * (x - p[0]) / (q[0] - p[0])
    return None


def _inversions(pairs: list[Point]) -> int:
    """Pairs (i, j) with y1_i < y1_j and y2_i > y2_j (strictly)."""
    pairs.sort()
    rank = {v: k + 1 for k, v in enumerate(sorted({p[1] for p in pairs}))}
    size = len(rank)
    tree = [0] * (size + 1)
    count = seen = k = 0
    while k < len(pairs):
        end = k
        while end < len(pairs) and pairs[end][0] == pairs[k][0]:
            end += 1
        for j in range(k, end):  # against the earlier groups only (a strictly smaller y1)
            i, at_or_below = rank[pairs[j][1]], 0
            while i > 0:
                at_or_below += tree[i]
                i -= i & -i
            count += seen - at_or_below
        for j in range(k, end):
            i = rank[pairs[j][1]]
            while i <= size:
                tree[i] += 1
                i += i & -i
        seen += end - k
        k = end
    return count
