"""The SVG of a laid-out graph: boxes, edges, column labels and the overlay. Statuses become
CSS classes here, at render time, so live updates only swap those classes.
"""

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from html import escape

from convoys.core.layout.geometry import NODE_H, NODE_W, OVERLAY_ID, PAD, Geometry, StatusClass

# --- rendering -------------------------------------------------------------------------------
MARK_GLYPHS = (("gated", "⊘"), ("parked", "∥"), ("stranded", "⚠"))


def svg(
    geometry: Geometry,
    nodes: Mapping[str, tuple[str, str]],
    status_class: StatusClass,
    marks: Mapping[str, Collection[str]] | None = None,
    critical: Sequence[str] = (),
    href: Callable[[str], str] | None = None,
    outside: Mapping[str, tuple[str, str, str]] | None = None,
    focus: str = "",
    merge_edges: Collection[tuple[str, str]] = frozenset(),
) -> str:
    """Render the geometry. `nodes`: {id: (title, status)}; `status_class(status)` -> (css
    class, icon); `marks`: {id: [badges]}; `critical`: ids on the critical path; `outside`:
    {id: (kind, title, status)} for the beads drawn before wave 1 (kind "gate", "unknown" or
    "external"); `merge_edges`: the (blocker, blocked) edges that wait for a merge
    (`merge-blocks`), drawn dotted.

    Each node is its own element (`node_id(id)`), drawn by `node()`; what changes with state
    beyond a node's status (critical path, gated, parked and stranded marks) is one overlay
    group drawn by `overlay()`: live updates replace those elements, never the geometry."""
    outside = outside or {}
    out = [
        # A group of links, one per bead, for assistive technology: the drawing (columns,
        # arrows, marks) is hidden from it, each node's link names its bead and state.
        '<svg class="dag" xmlns="http://www.w3.org/2000/svg" role="group" '
        'aria-roledescription="dependency graph" aria-label="Dependency graph" '
        f'viewBox="0 0 {geometry["width"]} {geometry["height"]}" '
        f'width="{geometry["width"]}" height="{geometry["height"]}">',
        '<defs aria-hidden="true"><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z"/></marker></defs>',
        '<g class="columns" aria-hidden="true">',
    ]
    for x, label in geometry["columns"]:
        if label:
            out.append(f'<text class="column" x="{x}" y="{PAD + 4}">{escape(label)}</text>')
    out.append('</g><g class="edges" aria-hidden="true">')
    ghosts = {i for i, v in outside.items() if v[0] != "gate"}
    for a, b, d, reverse in geometry["edges"]:
        extra = " ghost" if a in ghosts else ""
        if (a, b) in merge_edges:
            extra += " merge"
        out.append(_edge(a, b, d, reverse, extra))
    out.append('</g><g class="nodes">')
    for number, (x, y, count) in geometry["summaries"].items():
        out.append(
            f'<g class="node summary" transform="translate({x},{y})"><rect width="{NODE_W}"'
            f' height="{NODE_H}" rx="6"/><text x="10" y="25">✓ Wave {number}: {count} '
            "done</text></g>"
        )
    for number, (x, y, count) in geometry.get("more", {}).items():
        out.append(
            f'<a href="?open={number}#dag-card" class="node-link" data-open-wave="{number}">'
            f'<g class="node summary more" transform="translate({x},{y})"><rect width="{NODE_W}"'
            f' height="{NODE_H}" rx="6"/><text x="10" y="25">Wave {number}: {count} more'
            "</text></g></a>"
        )
    for bead_id in geometry["nodes"]:
        if bead_id in outside:
            kind, title, status = outside[bead_id]
            out.append(node(geometry, bead_id, title, status, status_class, href, kind))
        else:
            title, status = nodes.get(bead_id, ("", "unknown"))
            out.append(node(geometry, bead_id, title, status, status_class, href))
    out.append("</g>")
    out.append(overlay(geometry, marks or {}, critical, merge_edges))
    out.append("</svg>")
    return "".join(out)


def node_id(bead_id: str) -> str:
    """The DOM id of a bead's node (a live fragment)."""
    return "n-" + bead_id


GATE_SHAPE = f"12,0 {NODE_W - 12},0 {NODE_W},{NODE_H // 2} {NODE_W - 12},{NODE_H} 12,{NODE_H} 0,{NODE_H // 2}"


def node(
    geometry: Geometry,
    bead_id: str,
    title: str,
    status: str,
    status_class: StatusClass,
    href: Callable[[str], str] | None = None,
    kind: str | None = None,
) -> str:
    """One node: its link, box, icon, id and title, classed by status. `kind`: None for a
    tracked bead, "gate" (a decision or other non-task blocker: a hexagon), "outside" (a
    bead of this database the convoy does not track: a dashed ghost), "unknown" or
    "external" (a target that is no bead here: a dashed ghost, not linked)."""
    x, y = geometry["nodes"][bead_id]
    safe_id = escape(bead_id)
    dom_id = escape(node_id(bead_id))
    if kind in ("unknown", "external"):
        what = "external target" if kind == "external" else "not a bead in this database"
        return (
            f'<g class="node ghost {kind}" id="{dom_id}" data-id="{safe_id}" tabindex="0" role="img" '
            f'transform="translate({x},{y})"><title>{safe_id}: {what}</title>'
            f'<rect width="{NODE_W}" height="{NODE_H}" rx="6"/>'
            f'<text class="icon" x="9" y="25">{"↗" if kind == "external" else "?"}</text>'
            f'<text class="nid" x="28" y="16">{escape(_short(bead_id, 26))}</text>'
            f'<text class="ntitle" x="28" y="32">{escape(title or what)}</text></g>'
        )
    css, icon = status_class(status)
    link = href(bead_id) if href else "#"
    if kind == "gate":
        css += " gate"
        shape = f'<polygon points="{GATE_SHAPE}"/>'
        icon, label = "◆", f"gate {safe_id}"
    elif kind == "outside":  # a bead here, but not tracked by this convoy
        css = f"ghost outside {css}"
        shape = f'<rect width="{NODE_W}" height="{NODE_H}" rx="6"/>'
        label = f"{safe_id} (not in this convoy)"
    else:
        shape = f'<rect width="{NODE_W}" height="{NODE_H}" rx="6"/>'
        label = safe_id
    # The <title> names the link for screen readers and shows on hover.
    return (
        f'<a href="{escape(link)}" class="node-link" id="{dom_id}">'
        f"<title>{label} {escape(title)} ({escape(status)})</title>"
        f'<g class="node {css}" data-id="{safe_id}" '
        f'transform="translate({x},{y})">{shape}'
        f'<text class="icon" x="9" y="25">{icon}</text>'
        f'<text class="nid" x="28" y="16">{escape(_short(bead_id, 26))}</text>'
        f'<text class="ntitle" x="28" y="32">{escape(_short(title))}</text></g></a>'
    )


def overlay(
    geometry: Geometry,
    marks: Mapping[str, Collection[str]],
    critical: Iterable[str],
    merge_edges: Collection[tuple[str, str]] = frozenset(),
) -> str:
    """The state drawn over the graph: the critical path (edges and node outlines) and the
    gated (⊘), parked-rig (∥) and stranded (⚠) marks. One element, id `dag-overlay`."""
    pos = geometry["nodes"]
    path = [c for c in critical if c in pos]
    steps = set(zip(path, path[1:], strict=False))
    out = [f'<g class="overlay" id="{OVERLAY_ID}" aria-hidden="true">']
    for a, b, d, reverse in geometry["edges"]:
        if (a, b) in steps:
            extra = " critical merge" if (a, b) in merge_edges else " critical"
            out.append(_edge(a, b, d, reverse, extra))
    for bead_id in path:
        x, y = pos[bead_id]
        out.append(
            f'<rect class="critical" data-id="{escape(bead_id)}" x="{x - 3}" y="{y - 3}" '
            f'width="{NODE_W + 6}" height="{NODE_H + 6}" rx="8"/>'
        )
    for bead_id, badges in sorted(marks.items()):
        if bead_id not in pos or not badges:
            continue
        x, y = pos[bead_id]
        glyphs = "".join(g for name, g in MARK_GLYPHS if name in badges)
        out.append(
            f'<text class="mark {escape(" ".join(badges))}" data-id="{escape(bead_id)}" '
            f'x="{x + NODE_W - 6}" y="{y + 16}" text-anchor="end">{glyphs}</text>'
        )
    out.append("</g>")
    return "".join(out)


def _edge(a: str, b: str, d: str, reverse: bool, extra: str) -> str:
    # A reversed edge (it closes a cycle, or goes into a gate) is drawn from b to a: its arrow
    # is at the path's start, pointing into b.
    marker = "marker-start" if reverse else "marker-end"
    return (
        f'<path class="edge{extra}" data-from="{escape(a)}" data-to="{escape(b)}" '
        f'd="{d}" {marker}="url(#arrow)"/>'
    )


def _short(text: str, width: int = 24) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
