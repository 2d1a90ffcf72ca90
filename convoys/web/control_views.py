"""The operator controls on the pages: pause and resume a convoy, retry a bead the dispatch
breaker parked, acknowledge a stuck convoy's escalation. POST only, with the change
permission (acknowledging: the view permission, as whoever was told may say they are on
it); every rule is the service's."""

from collections.abc import Callable

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from convoys.services import batch, controls, escalation
from convoys.services.errors import NotFound, ServiceError
from convoys.web.access import VIEW, actor, back, needs, refusal
from convoys.web.context import page_context


def _run(request: HttpRequest, call: Callable[[], str], target: tuple[str, str]) -> HttpResponse:
    """Run a control; a missing row is a 404, a refusal goes back to the page with a message
    naming what is wrong (nothing changed), as the page's other buttons do."""
    try:
        line = call()
    except NotFound as exc:
        raise Http404(str(exc))
    except ServiceError as exc:
        messages.error(request, refusal(exc))
    else:
        messages.success(request, line)
    return redirect(*target)


@require_POST
@needs("convoys.change_convoy")
def pause(request: HttpRequest, convoy_id: str) -> HttpResponse:
    def call() -> str:
        convoy, changed = controls.pause(
            convoy_id, actor=actor(request), reason=request.POST.get("reason", "")
        )
        return (
            f"Paused {convoy.pk}: nothing is dispatched until resumed."
            if changed
            else (f"{convoy.pk} was already paused.")
        )

    return _run(request, call, ("convoy", convoy_id))


@require_POST
@needs("convoys.change_convoy")
def resume(request: HttpRequest, convoy_id: str) -> HttpResponse:
    def call() -> str:
        convoy, changed, fed = controls.resume(convoy_id, actor=actor(request))
        if not changed:
            return f"{convoy.pk} was not paused."
        names = ", ".join(r["id"] for r in fed) or "nothing ready"
        return f"Resumed {convoy.pk}; dispatched {names}."

    return _run(request, call, ("convoy", convoy_id))


@require_POST
@needs("convoys.change_bead")
def retry(request: HttpRequest, bead_id: str) -> HttpResponse:
    def call() -> str:
        bead, changed = controls.retry(bead_id, actor=actor(request))
        if not changed:
            return f"{bead.pk} has no failed dispatches in a row."
        return f"{bead.pk}: breaker cleared; it will be dispatched again."

    return _run(request, call, ("bead", bead_id))


@require_POST
@needs("convoys.view_convoy")
def acknowledge(request: HttpRequest, convoy_id: str) -> HttpResponse:
    """Stop a stuck convoy's escalation; back to the page it came from (the inbox or the
    convoy page)."""
    try:
        found, changed = escalation.acknowledge(convoy_id, actor=actor(request))
    except NotFound as exc:
        raise Http404(str(exc))
    except ServiceError as exc:
        messages.error(request, refusal(exc))
        return back(request, reverse("convoy", args=[convoy_id]))
    row = found.row
    messages.success(
        request,
        f"Acknowledged {convoy_id}: no more reminders until it moves and stalls again."
        if changed
        else f"{convoy_id} was already acknowledged by {row.acknowledged_by}.",
    )
    return back(request, reverse("convoy", args=[convoy_id]))


@require_POST
@needs(VIEW)
def convoy_actions(request: HttpRequest) -> HttpResponse:
    """The dashboard's selection: pause, resume or acknowledge several convoys. The first POST
    shows what will be done (one confirmation); the confirmed one does it, one transaction per
    convoy, and goes back with one summary: how many done, which refused and why."""
    action = request.POST.get("action", "")
    ids = request.POST.getlist("ids")
    reason = request.POST.get("reason", "")
    dashboard = reverse("dashboard")
    try:
        wanted = batch.check(action, ids, reason)
    except ServiceError as exc:
        messages.error(request, refusal(exc))
        return back(request, dashboard)
    if not request.user.has_perm(f"convoys.{batch.PERMISSIONS[action]}"):
        raise PermissionDenied(f"You need the {batch.PERMISSIONS[action]} permission.")
    if request.POST.get("confirmed") != "1":
        context = page_context(request) | {
            "action": action,
            "ids": wanted,
            "reason": " ".join(reason.split()),
            "next": request.POST.get("next", ""),
        }
        return render(request, "convoys/convoy_actions_confirm.html", context)
    done = batch.run(action, wanted, actor=actor(request), reason=reason)
    report = messages.warning if done.ids("refused") else messages.success
    report(request, done.summary)
    return back(request, dashboard)
