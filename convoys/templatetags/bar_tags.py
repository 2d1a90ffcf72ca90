from collections.abc import Mapping
from typing import Any

from django import template

from ..selectors import SEGMENTS

register = template.Library()


@register.filter
def bar_segments(summary: Mapping[str, Any]) -> list[tuple[str, float, float]]:
    """(segment, x, width) in percent for a progress bar drawn as SVG rects: the Content
    Security Policy forbids style="width:…" attributes, SVG geometry attributes are fine."""
    x = 0.0
    result = []
    for name in SEGMENTS:
        width = summary["percent"][name]
        if width:
            result.append((name, round(x, 2), width))
        x += width
    return result
