"""The bead actions from the pages: one form, on the bead page and the convoy page's tables.

POST `ids` (one or more), `action`, `reason`, `rig`/`worker` (reassign), `next`. Without
`confirm` it answers the preview (the service's dry run); with `confirm=1` it applies and
answers the summary. A page's script asks with `X-Live: 1` and places the answer's
`action-result` fragment; without a script the preview is a page with a Confirm button and
the result goes back to `next` as a message. The rules are the service's.
"""

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from convoys.log.events import last_seq
from convoys.services import actions
from convoys.services.errors import ServiceError
from convoys.web.access import actor, back, refusal, viewer
from convoys.web.context import page_context
from convoys.web.fragments import is_live

RESULT = "action-result"
NAMES = {
    "retry": "Retry",
    "skip": "Skip",
    "release": "Release",
    "reassign": "Reassign",
    "reopen": "Reopen",
}


@require_POST
@viewer
def bead_actions(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm("convoys.change_bead"):
        raise PermissionDenied("You may not change beads.")
    form = request.POST
    ids = actions.ids_of(form.getlist("ids"))
    confirm = form.get("confirm") == "1"
    action = form.get("action", "")
    reason, rig, worker = (form.get(name, "").strip() for name in ("reason", "rig", "worker"))
    context: dict[str, Any] = {
        "action": action,
        "action_name": NAMES.get(action, ""),
        "ids": ids,
        "reason": reason,
        "rig": rig,
        "worker": worker,
        "next": _local(request, form.get("next", "")),
    }
    reassign = action == "reassign"
    try:
        batch = actions.run(
            action,
            ids,
            actor=actor(request),
            reason=reason,
            dry_run=not confirm,
            rig=rig if reassign else "",
            worker=worker if reassign else "",
        )
    except ServiceError as exc:
        return _answer(request, context | {"error": refusal(exc)}, status=400)
    context |= {"batch": batch}
    if confirm and not is_live(request):
        (messages.success if not batch.refused else messages.warning)(request, batch.summary)
        return back(request, "/")
    return _answer(request, context)


def _local(request: HttpRequest, target: str) -> str:
    """`next` when it is a path of this site, else "" (it becomes a link on the page)."""
    if target.startswith("/") and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}
    ):
        return target
    return ""


def choices() -> list[tuple[str, str]]:
    """The action select's options, for the pages' action bars."""
    return list(NAMES.items())


def _answer(request: HttpRequest, context: dict[str, Any], status: int = 200) -> HttpResponse:
    if is_live(request):
        html = render_to_string("convoys/_action_result.html", context, request=request).strip()
        return JsonResponse({"seq": last_seq(), "fragments": {RESULT: html}}, status=status)
    return render(request, "convoys/actions.html", page_context(request) | context, status=status)
