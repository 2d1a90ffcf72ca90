"""The stage page: an epic or a list of beads analysed, staged or launched, its preview bounded."""

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from convoys.core import formatting
from convoys.read import pages
from convoys.services import launch, staging
from convoys.services.errors import ServiceError
from convoys.web.access import actor, refusal, viewer
from convoys.web.context import page_context
from convoys.web.fragments import Fragment, respond, unread


@viewer
def stage(request: HttpRequest) -> HttpResponse:
    context = page_context(request)
    ids_text = request.POST.get("ids") or request.GET.get("ids", "")
    epic = request.POST.get("epic") or request.GET.get("epic", "")
    ids = [epic] if epic else ids_text.replace(",", " ").split()
    title = request.POST.get("title") or None
    merge = request.POST.get("merge", "")
    plan, error, text = None, "", ""
    if request.method == "POST":
        if not request.user.has_perm("convoys.add_convoy"):
            raise PermissionDenied("You may not stage convoys.")
        try:
            if request.POST.get("do") == "stage":
                plan = staging.stage(ids, title, actor=actor(request), merge=merge)
                if not plan.errors:
                    verb = "Re-staged" if plan.restaged else "Staged"
                    words = formatting.status_words(plan.status)
                    messages.success(request, f"{verb} {plan.convoy_id} ({words}).")
                    url = reverse("convoy", args=[plan.convoy_id])
                    if plan.moved:
                        url += "?moved=1"
                    return redirect(url)
            elif request.POST.get("do") == "launch":
                if not request.user.has_perm("convoys.change_convoy"):
                    raise PermissionDenied("You may not launch convoys.")
                result = launch.launch(
                    ids,
                    force=request.POST.get("force") == "1",
                    title=title,
                    actor=actor(request),
                    merge=merge,
                )
                messages.success(
                    request,
                    f"Launched {result.convoy_id}: "
                    f"{sum(1 for r in result.dispatched if r['ok'])} "
                    "dispatched.",
                )
                return redirect("convoy", result.convoy_id)
        except ServiceError as exc:
            error = refusal(exc)
    if ids and plan is None and not error:
        try:
            plan = staging.analyze(ids, title)
        except ServiceError as exc:
            error = refusal(exc)
    more = 0
    if plan is not None and plan.dag is not None:
        text, more = _first_lines(formatting.render_tree(plan.dag, plan.input_kind, plan.root))
    epics = pages.epics_to_stage()
    context |= {
        "plan": plan,
        "error": error,
        "ids_text": ids_text,
        "epic": epic,
        "tree": text,
        "tree_more": more,
        "moved": list(plan.moved.items())[:PREVIEW_CHIPS] if plan else [],
        "epics": epics,
        "title": title or "",
        "merge": merge,
        "merge_default": settings.CONVOY_MERGE_STRATEGY,
        "waves": _wave_chips(plan) if plan and plan.waves else [],
        "waves_more": max(0, len(plan.waves) - PREVIEW_WAVES) if plan else 0,
    }
    fragments = [
        Fragment("epics", "convoys/_stage_epics.html"),
        Fragment("stage-result", "convoys/_stage_result.html"),
        unread(),
    ]
    return respond(request, "convoys/stage.html", context, fragments)


# What a stage preview shows of a big plan: its size stays bounded however big the epic; the
# command line (`convoy stage --json`) gives the whole plan.
PREVIEW_LINES = 500  # lines of the tree


PREVIEW_CHIPS = 100  # beads named per wave


PREVIEW_WAVES = 50  # waves listed


def _first_lines(text: str) -> tuple[str, int]:
    """(the first PREVIEW_LINES lines of `text`, how many more there are)."""
    lines = text.splitlines(keepends=True)
    return "".join(lines[:PREVIEW_LINES]), max(0, len(lines) - PREVIEW_LINES)


def _wave_chips(plan: staging.Plan) -> list[dict[str, Any]]:
    """The first PREVIEW_WAVES waves: each one's number, first PREVIEW_CHIPS beads and how many
    more it has."""
    assert plan.dag is not None
    waves = plan.waves[:PREVIEW_WAVES]
    rows = formatting.waves_json(plan.dag, [wave[:PREVIEW_CHIPS] for wave in waves])
    for row, wave in zip(rows, waves, strict=True):
        row["more"] = len(wave) - len(row["tasks"])
    return rows
