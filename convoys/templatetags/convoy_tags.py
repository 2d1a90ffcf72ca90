from urllib.parse import urlencode

from django import template

register = template.Library()


@register.simple_tag(takes_context=True)
def qs(context, **changes):
    """The current query string with some keys changed (every view state lives in the URL)."""
    data = {k: v for k, v in context["request"].GET.items() if v}
    data.update(changes)
    return "?" + urlencode({k: v for k, v in data.items() if v not in ("", None)})


@register.filter
def symbol(status):
    from ..models import status_symbol

    return status_symbol(status)


@register.filter
def get(mapping, key):
    return mapping.get(key) if mapping else None
