"""The create/fix partials other pages include: a convoy's staging check and the rigs it waits
on, and a bead's add-a-dependency form. Each reads what it shows (two small queries)."""

from typing import Any

from django import template
from django.db.models import Count
from django.template import Context
from django.utils.dateparse import parse_datetime

from convoys.models import DONE_STATUSES, Bead, Convoy, Rig, TrackedBead
from convoys.web.edit_views import DependencyForm

register = template.Library()


@register.inclusion_tag("convoys/_staging_panel.html", takes_context=True)
def staging_panel(context: Context, convoy: Convoy) -> dict[str, Any]:
    """Stored staging warnings of a staged convoy (re-check to refresh them), and the parked
    or docked rigs its unfinished beads wait on (un-park them from here)."""
    user = context["request"].user
    plan = (convoy.extra or {}).get("plan", {})
    waiting = []
    # A town has few rigs and fewer idle ones: only a convoy with work on them is counted.
    idle = {r.name: r for r in Rig.objects.exclude(state=Rig.ACTIVE)}
    if convoy.status != "closed" and idle:
        unfinished = Bead.objects.filter(
            pk__in=TrackedBead.objects.filter(convoy=convoy).values("bead_id")
        ).exclude(status__in=DONE_STATUSES)
        counts = dict(
            unfinished.filter(rig_id__in=idle)
            .values("rig_id")
            .annotate(n=Count("pk"))
            .values_list("rig_id", "n")
        )
        waiting = [(idle[name], n) for name, n in sorted(counts.items())]
    return {
        "convoy": convoy,
        "staged": convoy.is_staged,
        "warnings": plan.get("warnings"),
        "checked_at": parse_datetime(plan.get("checked_at") or ""),
        "waiting_rigs": waiting,
        "can_recheck": user.has_perm("convoys.change_convoy"),
        "can_restore": user.has_perm("convoys.change_rig"),
        "csrf_token": context.get("csrf_token"),
        "now": context.get("now"),
    }


@register.inclusion_tag("convoys/_dependency_add.html", takes_context=True)
def dependency_form(context: Context, bead: Bead) -> dict[str, Any]:
    """The add-a-dependency form, for users who may change beads."""
    user = context["request"].user
    return {
        "bead": bead,
        "form": DependencyForm() if user.has_perm("convoys.change_bead") else None,
        "csrf_token": context.get("csrf_token"),
    }
