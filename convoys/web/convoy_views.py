"""The convoy page, the fragments a live update of it redraws, and the convoy's buttons."""

from collections.abc import Iterable

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.functional import SimpleLazyObject
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from convoys.core import layout
from convoys.core.formatting import several
from convoys.log.kinds import FEEDING_KINDS
from convoys.models import Convoy
from convoys.read import convoy_page, overview, snapshots, timeline
from convoys.read.merge_queue import merge_queue
from convoys.rules.rows import Changes, changes_since
from convoys.services import convoys as convoy_service
from convoys.services import feeding, launch, notify
from convoys.services.errors import ServiceError
from convoys.web import action_views
from convoys.web.access import VIEW, AuthenticatedHttpRequest, actor, back, refusal, viewer
from convoys.web.context import page_context
from convoys.web.fragments import Fragment, respond, since, unread


@viewer
def convoy_detail(request: AuthenticatedHttpRequest, convoy_id: str) -> HttpResponse:
    context = page_context(request)
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
        "action_choices": action_views.choices(),
    }
    if page.dag is not None:
        context["dag_svg"] = lambda: mark_safe(page.dag.svg())
    # The timeline of one wave (convoys/read/timeline.py), drawn only when a template reads it.
    context["gantt"] = SimpleLazyObject(
        lambda: timeline.gantt(
            convoy, page, snapshot, request.GET, context["now"], context["as_of"]
        )
    )
    context["merge_queue"] = SimpleLazyObject(lambda: merge_queue(convoy, context["now"]))
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
        Fragment("merge-queue", "convoys/_merge_queue.html"),
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
        or "bead.skipped" in changes.kinds  # the wave table may gain its Skipped column
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
    if any(w["counts"]["done"] + w["counts"].get("skipped", 0) == w["total"] for w in rows):
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
