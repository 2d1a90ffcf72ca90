"""The controls partials: a convoy's pause panel and a bead's breaker panel. Each reads
what it shows from the services (the pause proof counts dispatch rows)."""

from typing import Any

from django import template
from django.template import Context

from convoys.models import Bead, Convoy
from convoys.rules import breaker
from convoys.services import controls

register = template.Library()


@register.inclusion_tag("convoys/_pause_panel.html", takes_context=True)
def pause_panel(context: Context, convoy: Convoy) -> dict[str, Any]:
    user = context["request"].user
    return {
        "convoy": convoy,
        "paused": controls.pause_summary(convoy),
        "can_change": user.has_perm("convoys.change_convoy") and convoy.status != "closed",
        "csrf_token": context.get("csrf_token"),
    }


@register.inclusion_tag("convoys/_breaker_panel.html", takes_context=True)
def breaker_panel(context: Context, bead: Bead) -> dict[str, Any]:
    user = context["request"].user
    return {
        "bead": bead,
        "parked": breaker.is_parked(bead),
        "limit": breaker.max_failures(),
        "last_error": breaker.last_error(bead) if breaker.is_parked(bead) else "",
        "can_retry": user.has_perm("convoys.change_bead"),
        "csrf_token": context.get("csrf_token"),
    }
