"""Server-side DAG drawing: waves as columns, blocking edges as arrows. Pure Python.

The geometry depends only on the graph (beads and edges), never on statuses, so it is cached
by a fingerprint of the graph and re-used across status changes; statuses become CSS classes
at render time and live updates only swap those classes.
"""

import hashlib
from html import escape

NODE_W, NODE_H, COL_GAP, ROW_GAP, PAD = 190, 40, 70, 12, 20
OVERLAY_ID = "dag-overlay"


def fingerprint(node_ids, edges, collapsed=(), columns=()):
    """A drawing's key: its nodes, edges, collapsed waves and columns (the waves and the gated
    column, which an open gate's close changes without changing the graph)."""
    digest = hashlib.sha1()
    for part in (sorted(node_ids), sorted(edges), sorted(collapsed), list(columns)):
        digest.update(repr(part).encode())
    return digest.hexdigest()


def compute(waves, gated_ids, edges, collapsed=frozenset()):
    """-> {"nodes": {id: (x, y)}, "summaries": {wave: (x, y, count)}, "width", "height",
    "edges": [(from, to)]}. Collapsed waves draw as one summary box."""
    columns = [list(w) for w in waves]
    if gated_ids:
        columns.append(sorted(gated_ids))
    positions, summaries = {}, {}
    tallest = 0
    for col, ids in enumerate(columns):
        x = PAD + col * (NODE_W + COL_GAP)
        number = col + 1
        if number in collapsed:
            summaries[number] = (x, PAD, len(ids))
            tallest = max(tallest, 1)
            continue
        for row, node_id in enumerate(ids):
            positions[node_id] = (x, PAD + row * (NODE_H + ROW_GAP))
        tallest = max(tallest, len(ids))
    shown = [(a, b) for a, b in edges if a in positions and b in positions]
    return {
        "nodes": positions,
        "summaries": summaries,
        "edges": shown,
        "width": PAD * 2 + max(len(columns), 1) * (NODE_W + COL_GAP) - COL_GAP,
        "height": PAD * 2 + max(tallest, 1) * (NODE_H + ROW_GAP) - ROW_GAP + 20,
        "gated_column": len(columns) if gated_ids else None,
    }


def svg(geometry, nodes, status_class, marks=None, critical=(), href=None):
    """Render the geometry. `nodes`: {id: (title, status)}; `status_class(status)` -> (css
    class, icon); `marks`: {id: [badges]}; `critical`: ids on the critical path.

    Each node is its own element (`node_id(id)`), drawn by `node()`; what changes with state
    beyond a node's status (critical path, gated and stranded marks) is one overlay group drawn
    by `overlay()`: live updates replace those elements, never the geometry."""
    out = [
        f'<svg class="dag" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'aria-label="Dependency graph" viewBox="0 0 {geometry["width"]} {geometry["height"]}" '
        f'width="{geometry["width"]}" height="{geometry["height"]}">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z"/></marker></defs>',
        '<g class="edges">',
    ]
    pos = geometry["nodes"]
    for a, b in geometry["edges"]:
        out.append(_edge(pos, a, b, ""))
    out.append('</g><g class="nodes">')
    for number, (x, y, count) in geometry["summaries"].items():
        out.append(
            f'<g class="node summary" transform="translate({x},{y})"><rect width="{NODE_W}"'
            f' height="{NODE_H}" rx="6"/><text x="10" y="25">✓ Wave {number}: {count} '
            "done</text></g>"
        )
    for node_id in pos:
        title, status = nodes.get(node_id, ("", "unknown"))
        out.append(node(geometry, node_id, title, status, status_class, href))
    out.append("</g>")
    out.append(overlay(geometry, marks or {}, critical))
    out.append("</svg>")
    return "".join(out)


def node_id(bead_id):
    """The DOM id of a bead's node (a live fragment)."""
    return "n-" + bead_id


def node(geometry, bead_id, title, status, status_class, href=None):
    """One node: its link, box, icon, id and title, classed by status."""
    x, y = geometry["nodes"][bead_id]
    css, icon = status_class(status)
    link = href(bead_id) if href else "#"
    safe_id = escape(bead_id)
    # The <title> names the link for screen readers and shows on hover.
    return (
        f'<a href="{escape(link)}" class="node-link" id="{escape(node_id(bead_id))}">'
        f"<title>{safe_id} {escape(title)} ({escape(status)})</title>"
        f'<g class="node {css}" data-id="{safe_id}" '
        f'transform="translate({x},{y})"><rect width="{NODE_W}" height="{NODE_H}" rx="6"/>'
        f'<text class="icon" x="9" y="25">{icon}</text>'
        f'<text class="nid" x="28" y="16">{safe_id}</text>'
        f'<text class="ntitle" x="28" y="32">{escape(_short(title))}</text></g></a>'
    )


def overlay(geometry, marks, critical):
    """The state drawn over the graph: the critical path (edges and node outlines) and the
    gated (⊘) and stranded (⚠) marks. One element, id `dag-overlay`."""
    pos = geometry["nodes"]
    critical = [c for c in critical if c in pos]
    hot = set(critical)
    out = [f'<g class="overlay" id="{OVERLAY_ID}" aria-hidden="true">']
    for a, b in geometry["edges"]:
        if a in hot and b in hot:
            out.append(_edge(pos, a, b, " critical"))
    for bead_id in critical:
        x, y = pos[bead_id]
        out.append(
            f'<rect class="critical" data-id="{escape(bead_id)}" x="{x}" y="{y}" '
            f'width="{NODE_W}" height="{NODE_H}" rx="6"/>'
        )
    for bead_id, badges in sorted(marks.items()):
        if bead_id not in pos or not badges:
            continue
        x, y = pos[bead_id]
        glyphs = ("⊘" if "gated" in badges else "") + ("⚠" if "stranded" in badges else "")
        out.append(
            f'<text class="mark {escape(" ".join(badges))}" data-id="{escape(bead_id)}" '
            f'x="{x + NODE_W - 8}" y="{y + 16}" text-anchor="end">{glyphs}</text>'
        )
    out.append("</g>")
    return "".join(out)


def _edge(pos, a, b, hot):
    x1, y1 = pos[a][0] + NODE_W, pos[a][1] + NODE_H / 2
    x2, y2 = pos[b][0], pos[b][1] + NODE_H / 2
    mid = (x1 + x2) / 2
    return (
        f'<path class="edge{hot}" data-from="{escape(a)}" data-to="{escape(b)}" '
        f'd="M{x1:.0f},{y1:.0f} C{mid:.0f},{y1:.0f} {mid:.0f},{y2:.0f} '
        f'{x2:.0f},{y2:.0f}" marker-end="url(#arrow)"/>'
    )


def _short(text, width=24):
    return text if len(text) <= width else text[: width - 1] + "…"
