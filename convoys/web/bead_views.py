"""The bead page and its buttons."""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_POST

from convoys.core.parsing import whole_number
from convoys.read import bead_page
from convoys.services import beads as bead_service
from convoys.services.errors import ServiceError
from convoys.web import action_views
from convoys.web.access import actor, back, refusal, viewer
from convoys.web.context import fields_of, page_context
from convoys.web.fragments import Fragment, respond, since, unread

LOG = Fragment("bead-log", "convoys/_bead_log.html")


def _deps_page(request: HttpRequest) -> int:
    return whole_number(request.GET.get("deps"), most=999_999) or 1


@viewer
def bead_detail(request: HttpRequest, bead_id: str) -> HttpResponse:
    context = page_context(request) | {"bead_id": bead_id}
    seq = since(request)
    if seq is not None and bead_page.only_log_since(seq, context["as_of"]):
        # Only lines were logged since: the log alone, without reading the rest of the page.
        if not bead_page.exists(bead_id):
            raise Http404(f"bead '{bead_id}' not found")
        context["log"] = bead_page.bead_log(bead_id)
        return respond(request, "convoys/bead.html", context, [LOG, unread()])
    page = bead_page.bead_page(bead_id, _deps_page(request), context["now"])
    if page is None:
        raise Http404(f"bead '{bead_id}' not found")
    context |= fields_of(page) | {
        "can_change": request.user.has_perm("convoys.change_bead"),
        "action_choices": action_views.choices(),
    }
    fragments = [
        Fragment("bead-head", "convoys/_bead_head.html"),
        Fragment("bead-actions", "convoys/_bead_actions.html"),
        Fragment("bead-relations", "convoys/_bead_relations.html"),
        Fragment("bead-attempts", "convoys/_bead_attempts.html"),
        LOG,
        Fragment("bead-history", "convoys/_bead_history.html"),
        unread(),
    ]
    return respond(request, "convoys/bead.html", context, fragments)


@require_POST
@viewer
def bead_action(request: HttpRequest, bead_id: str, action: str) -> HttpResponse:
    if not request.user.has_perm("convoys.change_bead"):
        raise PermissionDenied("You may not change beads.")
    try:
        if action == "close":
            bead_service.close_bead(
                bead_id,
                reason=request.POST.get("reason", ""),
                actor=actor(request),
                force=request.POST.get("force") == "1",
            )
            messages.success(request, f"Closed {bead_id}.")
        elif action == "reopen":
            bead_service.reopen_bead(bead_id, actor=actor(request))
            messages.success(request, f"Reopened {bead_id}.")
        else:
            raise Http404("unknown action")
    except ServiceError as exc:
        messages.error(request, refusal(exc))
    return back(request, reverse("bead", args=[bead_id]))
