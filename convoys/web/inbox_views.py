"""A user's inbox and subscriptions."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from convoys.core import webhooks
from convoys.core.ids import text_problem
from convoys.core.parsing import whole_number
from convoys.models import Convoy, DeliveryPreference, WebhookDelivery, WebhookTarget
from convoys.read import pages
from convoys.services import escalation, hooks, notify
from convoys.services.errors import NotFound, ServiceError
from convoys.web.access import VIEW, AuthenticatedHttpRequest, actor, refusal, viewer
from convoys.web.context import fields_of, page_context
from convoys.web.fragments import Fragment, respond, unread


@login_required
def inbox(request: AuthenticatedHttpRequest) -> HttpResponse:
    if request.method == "POST":
        ids = request.POST.getlist("id")  # none: all; ids that are not row numbers are ignored
        wanted = [n for n in map(whole_number, ids) if n is not None]
        notify.mark_read(request.user, wanted if ids else None)
        return redirect("inbox")
    context = page_context(request)
    context["action_notes"], context["receipt_notes"] = escalation.inbox(request.user)
    context["can_view"] = request.user.has_perm(VIEW)
    fragments = [Fragment("inbox-list", "convoys/_inbox_list.html"), unread()]
    return respond(request, "convoys/inbox.html", context, fragments)


@viewer
def subscriptions(request: AuthenticatedHttpRequest) -> HttpResponse:
    if request.method == "POST":
        convoy = None
        if request.POST.get("convoy"):
            wanted = request.POST["convoy"]
            convoy = None if text_problem(wanted) else Convoy.objects.filter(pk=wanted).first()
            if convoy is None:
                messages.error(request, f"convoy '{request.POST['convoy']}' not found")
                return redirect("subscriptions")
        if request.POST.get("do") == "preferences":
            try:
                notify.set_preferences(
                    request.user,
                    action_needed=request.POST.get("action_needed"),
                    receipts=request.POST.get("receipts"),
                )
                messages.success(request, "Saved how you hear about each kind.")
            except ServiceError as exc:
                messages.error(request, refusal(exc))
        elif request.POST.get("do") == "remove":
            notify.unsubscribe(request.user, convoy)
        else:
            notify.subscribe(request.user, convoy, email=request.POST.get("email") == "1")
        return redirect("subscriptions")
    context = page_context(request)
    context |= fields_of(pages.subscriptions_page(request.user))
    context["delivery_choices"] = DeliveryPreference
    context["hook_kinds"] = webhooks.KINDS
    context["default_hook_kinds"] = webhooks.DEFAULT_KINDS
    fragments = [
        Fragment("delivery", "convoys/_delivery.html"),
        Fragment("subs-all", "convoys/_subs_all.html"),
        Fragment("subs-list", "convoys/_subs_list.html"),
        Fragment("hooks", "convoys/_hooks.html"),
        unread(),
    ]
    return respond(request, "convoys/subscriptions.html", context, fragments)


# --- webhooks and chat (the "Webhooks and chat" card) ------------------------------------------
def _managed(request: AuthenticatedHttpRequest, target: WebhookTarget | None) -> WebhookTarget:
    """The target, if the user may manage it: their own, or with change_convoy a convoy's or
    the town's (403 otherwise; 404 when there is none)."""
    if target is None:
        raise Http404("no such webhook target")
    if not hooks.may_manage(request.user, target):
        raise PermissionDenied("You may manage only your own webhooks.")
    return target


def _said(row: WebhookDelivery) -> str:
    status = row.status_code if row.status_code is not None else "no answer"
    latency = f", {row.latency_ms:.0f} ms" if row.latency_ms is not None else ""
    if row.delivered_at:
        return f"Delivered to target {row.target_id}: status {status}{latency}."
    return f"Target {row.target_id} did not take it: {row.error or status}{latency}."


@require_POST
@viewer
def hook_add(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Add a target of one's own (convoy and town targets: `manage.py hooks add`)."""
    try:
        added = hooks.add_target(
            request.POST.get("url", ""),
            user=request.user,
            kinds=request.POST.getlist("kinds") or None,
            actor=actor(request),
        )
    except ServiceError as exc:
        messages.error(request, refusal(exc))
        return redirect("subscriptions")
    said = f"Added target {added.target.pk}."
    if added.secret:
        said += f" Its secret, shown once, to verify signatures: {added.secret}"
    messages.success(request, said)
    return redirect("subscriptions")


@require_POST
@viewer
def hook_action(request: AuthenticatedHttpRequest, target_id: int, action: str) -> HttpResponse:
    target = _managed(request, WebhookTarget.objects.filter(pk=target_id).first())
    if action == "test":
        messages.info(request, _said(hooks.send_test(target, actor(request))))
    elif action == "remove":
        hooks.remove_target(target.pk)
        messages.success(request, f"Removed target {target_id}.")
    else:
        raise Http404("no such action")
    return redirect("subscriptions")


@require_POST
@viewer
def redeliver(request: AuthenticatedHttpRequest, delivery_id: int) -> HttpResponse:
    row = WebhookDelivery.objects.select_related("target").filter(pk=delivery_id).first()
    _managed(request, row.target if row else None)
    try:
        messages.info(request, _said(hooks.redeliver(delivery_id)))
    except NotFound:
        raise Http404("no such delivery")
    return redirect("subscriptions")
