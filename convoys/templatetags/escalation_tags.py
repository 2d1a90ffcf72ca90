"""The convoy page's escalation panel: stuck since when, how many reminders, the causes
named, and the Acknowledge button (services/escalation.py decides all of it)."""

from typing import Any

from django import template
from django.template import Context

from convoys.models import Convoy
from convoys.services import escalation

register = template.Library()


@register.inclusion_tag("convoys/_escalation_panel.html", takes_context=True)
def escalation_panel(context: Context, convoy: Convoy) -> dict[str, Any]:
    found = escalation.state(convoy)
    return {
        "convoy": convoy,
        "e": found if found is not None and found.current else None,
        "limit": escalation.MAX_NOTIFICATIONS,
        "can_ack": context["request"].user.has_perm("convoys.view_convoy"),
        "csrf_token": context.get("csrf_token"),
    }
