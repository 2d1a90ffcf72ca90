"""Pages. Views read through the read models (`convoys.read`) and write through services; they stay thin.

Every page is made of named fragments (`convoys.web.fragments`): the same templates render the
full page and answer its live requests."""

import dataclasses
import functools
from collections.abc import Iterable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import SimpleLazyObject
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from convoys.core import formatting, layout
from convoys.core.formatting import several
from convoys.core.ids import text_problem
from convoys.core.parsing import whole_number
from convoys.log.events import last_seq
from convoys.log.kinds import FEEDING_KINDS
from convoys.models import Convoy, DeliveryPreference, Notification, Subscription
from convoys.read import bead_page, convoy_page, overview, pages, snapshots, timeline
from convoys.read.dashboard import (
    DASHBOARD_LIVE_SORTS,
    DashboardRow,
    dashboard_page,
    dashboard_rows,
    filter_text,
    status_filter_problem,
)
from convoys.rules import capacity
from convoys.rules.rows import Changes, changes_since
from convoys.services import beads as bead_service
from convoys.services import convoys as convoy_service
from convoys.services import escalation, feeding, launch, notify, staging, ticker
from convoys.services.errors import ServiceError
from convoys.web.access import VIEW, AuthenticatedHttpRequest, actor, back, refusal, viewer
from convoys.web.fragments import Fragment, respond, since, unread

DASHBOARD_SORTS = [
    ("age", "Newest"),
    ("-age", "Oldest"),
    ("activity", "Last activity"),
    ("progress", "Least done"),
    ("-progress", "Most done"),
    ("id", "ID"),
]
DASHBOARD_STATUSES = [
    ("active", "Open & staged"),
    ("open", "Open"),
    ("staged", "Staged"),
    ("closed", "Closed"),
    ("all", "All"),
]


def unread_count(request: HttpRequest) -> dict[str, Any]:
    """Context processor: the inbox badge and what the live script may toast about, each read
    when a template shows it (a live update draws the badge, not the page's body tag)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}

    @functools.cache
    def subscribed_ids() -> str:
        subscribed = Subscription.objects.filter(user=user).values_list("convoy_id", flat=True)
        return ",".join("*" if c is None else c for c in subscribed)

    unread = Notification.objects.filter(user=user, read_at__isnull=True)
    return {"unread_count": functools.cache(unread.count), "subscribed_ids": subscribed_ids}


def _base(request: HttpRequest) -> dict[str, Any]:
    """What every page's context starts with: the event sequence number it is drawn at (read
    before anything else, so that the events it does not show come after it) and `now`."""
    return {"as_of": last_seq(), "now": timezone.now()}


# --- dashboard --------------------------------------------------------------------------------
@viewer
def dashboard(request: HttpRequest) -> HttpResponse:
    context = _base(request) | {"feeding": _feeding()}
    params = request.GET
    status = filter_text(params.get("status") or "") or "active"
    problem = status_filter_problem(status)
    if problem:
        return render(request, "convoys/bad_filter.html", {"problem": problem}, status=422)
    seq = since(request)
    changes = changes_since(seq, context["as_of"]) if seq is not None else None
    if (
        changes is not None
        and not changes.touches_listing()
        and params.get("sort") not in DASHBOARD_LIVE_SORTS
    ):
        # Only rows of convoys whose beads changed; the list and its order stay as they are.
        rows = dashboard_rows(params, only=changes.convoys) if changes.convoys else []
        fragments = [_row_fragment(row) for row in rows] + [unread(), FEEDING]
        if not capacity.panel_stands(changes):
            context["capacity"] = capacity.panel()
            fragments.append(CAPACITY)
        return respond(request, "convoys/dashboard.html", context, fragments)
    page = dashboard_page(params)
    context |= {
        "page": page,
        "params": params,
        "sorts": DASHBOARD_SORTS,
        "statuses": DASHBOARD_STATUSES,
        "capacity": capacity.panel(),
    }
    fragments = [
        Fragment("dashboard-filters", "convoys/_dashboard_filters.html"),
        Fragment("convoy-table", "convoys/_convoy_table.html"),
        CAPACITY,
        FEEDING,
        unread(),
    ]
    return respond(request, "convoys/dashboard.html", context, fragments)


CAPACITY = Fragment("capacity-panel", "convoys/_capacity_panel.html")
FEEDING = Fragment("feeding-stopped", "convoys/_feeding.html")


def _feeding() -> dict[str, Any]:
    """The dashboard's banner when feeding is stopped (`ticker.stalled_since`'s rule)."""
    stalled, last_tick = ticker.stalled_since()
    restart = ticker.last_restart()
    return {
        "stalled": stalled,
        "last_tick": last_tick,
        "after": ticker.stall_after(),
        "restart": restart,
        "restarted": PROCESS_WORDS.get(restart.data.get("process"), "a process") if restart else "",
    }


PROCESS_WORDS = {"web": "the web server", "tasks": "the task cluster", "swarm": "the demo swarm"}


def _row_fragment(row: DashboardRow) -> Fragment:
    return Fragment("convoy-" + row.convoy.pk, "convoys/_convoy_row.html", {"row": row})


# --- convoy page ------------------------------------------------------------------------------
@viewer
def convoy_detail(request: AuthenticatedHttpRequest, convoy_id: str) -> HttpResponse:
    context = _base(request)
    convoy = Convoy.objects.filter(pk=convoy_id).first()
    if convoy is None:
        raise Http404(f"convoy '{convoy_id}' not found")
    user = request.user
    # A live request redraws the fragments the events after its seq may have changed.
    seq = since(request)
    changes = changes_since(seq, context["as_of"], dependents=False) if seq else None
    kept = overview.applies(convoy, request.GET)
    if kept is not None:  # a big convoy: its kept facts and a window of its beads
        page, snapshot = overview.page(convoy, kept, request.GET, user, context["now"])
    else:
        snapshot = snapshots.load(convoy, context["now"])
        page = convoy_page.convoy_page(convoy, request.GET, user, context["now"], snapshot)
    context |= {
        "page": page,
        "convoy": convoy,
        "can_change": user.has_perm("convoys.change_convoy"),
    }
    if page.dag is not None:
        context["dag_svg"] = lambda: mark_safe(page.dag.svg())
    # The timeline of one wave (convoys/read/timeline.py), drawn only when a template reads it.
    context["gantt"] = SimpleLazyObject(
        lambda: timeline.gantt(
            convoy, page, snapshot, request.GET, context["now"], context["as_of"]
        )
    )
    return respond(
        request, "convoys/convoy.html", context, lambda: _convoy_fragments(request, page, changes)
    )


# The convoy's own panels: its controls, pause, escalation and staging (`Changes.rows_only`).
PANELS = [
    Fragment("convoy-actions", "convoys/_convoy_actions.html"),
    Fragment("convoy-pause", "convoys/_pause.html"),
    Fragment("convoy-escalation", "convoys/_escalation.html"),
    Fragment("convoy-staging", "convoys/_convoy_staging.html"),
]


def _convoy_fragments(
    request: HttpRequest, page: convoy_page.ConvoyPage, changes: Changes | None
) -> list[Fragment]:
    fragments = [
        Fragment("convoy-head", "convoys/_convoy_head.html"),
        Fragment("critical", "convoys/_convoy_critical.html"),
        Fragment("timeline", "convoys/_timeline.html", {"events": page.timeline}),
        Fragment("gantt-card", "convoys/_convoy_gantt.html"),
        unread(),
    ]
    if changes is None or not changes.rows_only():
        fragments += PANELS  # what the convoy shows about itself may have changed
    dag = page.dag
    drawn_as = request.headers.get("X-Live-Layout", "")
    # The whole drawing, waves and table; else only the parts the changes touch.
    if (
        changes is None
        or dag is None
        or page.overview  # a window read afresh: its cards are drawn whole
        or changes.dependencies
        or "rig.state" in changes.kinds
        or "bead.reopened" in changes.kinds
        or bool(changes.kinds & FEEDING_KINDS)
        or (page.waiting and bool(changes.beads))
        or bool(changes.beads & set(page.watch_beads))
        or (page.convoy.pk in changes.convoys and changes.touches_graph())
        or drawn_as != dag.fingerprint
    ):
        return fragments + [
            Fragment("dag-card", "convoys/_convoy_dag.html"),
            Fragment("wave-card", "convoys/_convoy_waves.html"),
            Fragment("bead-table", "convoys/_bead_table.html"),
        ]
    # The page shows the same drawing: only the nodes, rows and waves whose state may have
    # changed (the beads named by the events and the beads they block), and the overlay.
    affected = page.affected(changes.beads)
    fragments += [
        Fragment(layout.node_id(i), html=dag.node(i)) for i in sorted(dag.drawn(affected))
    ]
    fragments.append(Fragment(layout.OVERLAY_ID, html=dag.overlay()))
    fragments += _wave_fragments(page, affected)
    fragments += _bead_row_fragments(page, affected, changes)
    return fragments


def _wave_fragments(page: convoy_page.ConvoyPage, affected: Iterable[str]) -> list[Fragment]:
    numbers = {page.wave_of[i] for i in affected if i in page.wave_of}
    rows = [w for w in page.waves if w["number"] in numbers]
    if any(w["counts"]["done"] == w["total"] for w in rows):
        # A wave completed: the frontier moves and (on big convoys) links move between waves.
        return [Fragment("wave-card", "convoys/_convoy_waves.html")]
    return [Fragment(f"wave-{w['number']}", "convoys/_wave_row.html", {"w": w}) for w in rows]


def _bead_row_fragments(
    page: convoy_page.ConvoyPage, affected: Iterable[str], changes: Changes
) -> list[Fragment]:
    if page.capped and changes.done_changed & set(page.graph.nodes):
        # A bead closing leaves the capped list of unfinished beads and lets another in.
        return [Fragment("bead-table", "convoys/_bead_table.html")]
    rows = {row["id"]: row for row in page.rows_of(affected)}
    fragments = []
    for bead_id in sorted(affected):
        if bead_id in rows:
            fragments.append(
                Fragment("bead-row-" + bead_id, "convoys/_bead_row.html", {"r": rows[bead_id]})
            )
        elif page.big:
            fragments.append(Fragment("bead-row-" + bead_id, html=""))  # done: off the list
    if page.big:
        fragments.append(Fragment("bead-table-more", "convoys/_bead_table_more.html"))
    return fragments


@require_POST
@viewer
def convoy_action(request: AuthenticatedHttpRequest, convoy_id: str, action: str) -> HttpResponse:
    needed = {"subscribe": VIEW, "unsubscribe": VIEW}.get(action, "convoys.change_convoy")
    if not request.user.has_perm(needed):
        raise PermissionDenied("You may not change convoys.")
    who = actor(request)
    try:
        if action == "launch":
            result = launch.launch([convoy_id], force=request.POST.get("force") == "1", actor=who)
            ok = sum(1 for r in result.dispatched if r["ok"])
            messages.success(
                request, f"Launched {convoy_id}: {ok} dispatched, {len(result.skipped)} skipped."
            )
        elif action == "check":  # staged: re-stage in place; open: land, or say why not
            ok, line = feeding.check_report(convoy_id, actor=who)
            (messages.success if ok else messages.warning)(request, line)
        elif action == "close":
            convoy_service.close(
                convoy_id,
                reason=request.POST.get("reason", ""),
                force=request.POST.get("force") == "1",
                actor=who,
            )
            messages.success(request, f"Closed {convoy_id}.")
        elif action == "land":
            convoy_service.land(convoy_id, force=request.POST.get("force") == "1", actor=who)
            messages.success(request, f"Landed {convoy_id}.")
        elif action == "add":
            ids = request.POST.get("ids", "").replace(",", " ").split()
            _, added, reopened = convoy_service.add(convoy_id, ids, actor=who)
            messages.success(
                request,
                f"Added {several(len(added), 'bead')}"
                + (" and reopened the convoy." if reopened else "."),
            )
        elif action == "subscribe":
            notify.subscribe(
                request.user,
                get_object_or_404(Convoy, pk=convoy_id),
                email=request.POST.get("email") == "1",
            )
            messages.success(request, f"Subscribed to {convoy_id}.")
        elif action == "unsubscribe":
            notify.unsubscribe(request.user, get_object_or_404(Convoy, pk=convoy_id))
            messages.info(request, "Unsubscribed.")
        else:
            raise Http404("unknown action")
    except ServiceError as exc:
        messages.error(request, refusal(exc))
    return back(request, reverse("convoy", args=[convoy_id]))


# --- stage ------------------------------------------------------------------------------------
@viewer
def stage(request: HttpRequest) -> HttpResponse:
    context = _base(request)
    ids_text = request.POST.get("ids") or request.GET.get("ids", "")
    epic = request.POST.get("epic") or request.GET.get("epic", "")
    ids = [epic] if epic else ids_text.replace(",", " ").split()
    title = request.POST.get("title") or None
    plan, error, text = None, "", ""
    if request.method == "POST":
        if not request.user.has_perm("convoys.add_convoy"):
            raise PermissionDenied("You may not stage convoys.")
        try:
            if request.POST.get("do") == "stage":
                plan = staging.stage(ids, title, actor=actor(request))
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
                    ids, force=request.POST.get("force") == "1", title=title, actor=actor(request)
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


# --- stranded, beads, inbox, subscriptions ------------------------------------------------------
@viewer
def stranded(request: HttpRequest) -> HttpResponse:
    context = _base(request) | {"rows": feeding.stranded()}
    fragments = [Fragment("stranded-table", "convoys/_stranded_table.html"), unread()]
    return respond(request, "convoys/stranded.html", context, fragments)


def _deps_page(request: HttpRequest) -> int:
    return whole_number(request.GET.get("deps"), most=999_999) or 1


@viewer
def bead_detail(request: HttpRequest, bead_id: str) -> HttpResponse:
    context = _base(request)
    page = bead_page.bead_page(bead_id, _deps_page(request), context["now"])
    if page is None:
        raise Http404(f"bead '{bead_id}' not found")
    context |= _fields(page) | {"can_change": request.user.has_perm("convoys.change_bead")}
    fragments = [
        Fragment("bead-head", "convoys/_bead_head.html"),
        Fragment("bead-actions", "convoys/_bead_actions.html"),
        Fragment("bead-relations", "convoys/_bead_relations.html"),
        Fragment("bead-history", "convoys/_bead_history.html"),
        unread(),
    ]
    return respond(request, "convoys/bead.html", context, fragments)


def _fields(page: Any) -> dict[str, Any]:
    """A read model's fields as template variables (the templates name them directly)."""
    return {f.name: getattr(page, f.name) for f in dataclasses.fields(page)}


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


@login_required
def inbox(request: AuthenticatedHttpRequest) -> HttpResponse:
    if request.method == "POST":
        ids = request.POST.getlist("id")  # none: all; ids that are not row numbers are ignored
        wanted = [n for n in map(whole_number, ids) if n is not None]
        notify.mark_read(request.user, wanted if ids else None)
        return redirect("inbox")
    context = _base(request)
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
    context = _base(request)
    context |= _fields(pages.subscriptions_page(request.user))
    context["delivery_choices"] = DeliveryPreference
    fragments = [
        Fragment("delivery", "convoys/_delivery.html"),
        Fragment("subs-all", "convoys/_subs_all.html"),
        Fragment("subs-list", "convoys/_subs_list.html"),
        unread(),
    ]
    return respond(request, "convoys/subscriptions.html", context, fragments)


def forbidden(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return render(request, "403.html", {"reason": str(exception or "")}, status=403)
