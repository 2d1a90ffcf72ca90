"""The dashboard's view of `beads sync` sources (convoys/services/bdsync/)."""

from django import template

from convoys.models import SyncSource

register = template.Library()


@register.simple_tag
def sync_sources() -> list[SyncSource]:
    """Every source a sync pass has run over, by name."""
    return list(SyncSource.objects.order_by("name"))
