"""A user's inbox and subscriptions."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect

from convoys.core.ids import text_problem
from convoys.core.parsing import whole_number
from convoys.models import Convoy, DeliveryPreference
from convoys.read import pages
from convoys.services import escalation, notify
from convoys.services.errors import ServiceError
from convoys.web.access import VIEW, AuthenticatedHttpRequest, refusal, viewer
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
    fragments = [
        Fragment("delivery", "convoys/_delivery.html"),
        Fragment("subs-all", "convoys/_subs_all.html"),
        Fragment("subs-list", "convoys/_subs_list.html"),
        unread(),
    ]
    return respond(request, "convoys/subscriptions.html", context, fragments)
