"""Server-side DAG drawing, pure Python: `geometry` lays the graph out (cached by its
fingerprint, since it depends only on beads and edges), `drawing` renders the SVG with the
statuses as CSS classes, and `checks` measures a drawing for the tests and bench/layout.py.
"""

from convoys.core.layout.drawing import node, node_id, overlay, svg
from convoys.core.layout.geometry import (
    COL_GAP,
    NODE_H,
    NODE_W,
    OVERLAY_ID,
    PAD,
    ROW_GAP,
    Geometry,
    compute,
    fingerprint,
)

__all__ = [
    "COL_GAP",
    "NODE_H",
    "NODE_W",
    "OVERLAY_ID",
    "PAD",
    "ROW_GAP",
    "Geometry",
    "compute",
    "fingerprint",
    "node",
    "node_id",
    "overlay",
    "svg",
]
