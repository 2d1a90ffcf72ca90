from collections.abc import Mapping
from typing import Any

from django import template
from django.utils.safestring import SafeString, mark_safe

from convoys.read.summaries import SEGMENTS

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


@register.simple_tag
def bar(s: Mapping[str, Any]) -> SafeString:
    """A summary's progress bar (SVG, numbers only: nothing to escape), drawn here rather than
    by a template: the dashboard draws two hundred."""
    label = (
        f"{s['done']} done, "
        + (f"{s['skipped']} skipped, " if s.get("skipped") else "")
        + (f"{s['submitted']} submitted, waiting to merge, " if s.get("submitted") else "")
        + f"{s['active']} in progress, {s['failed']} failed, {s['ready']} ready, "
        f"{s['blocked']} blocked, {s['unknown']} unknown of {s['total']} "
        f"({s['percent_complete']}% done)"
    )
    rects = "".join(
        f'<rect class="seg {name}" x="{x:g}" width="{width:g}" height="10"/>'
        for name, x, width in bar_segments(s)
    )
    return mark_safe(  # noqa: S308 - numbers and segment names only
        '<svg class="bar" viewBox="0 0 100 10" preserveAspectRatio="none" role="img" '
        f'aria-label="{label}">{rects}</svg>'
    )
