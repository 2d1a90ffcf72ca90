"""Pages. Views read through selectors and write through services; they stay thin."""

import statistics
from datetime import timedelta
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.db.models import Min, Q
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from . import dag as dagmod
from . import formatting, layout, selectors, stranding
from .events import last_seq
from .models import (
    ACTIVE_WORK_STATUSES,
    CONVOY_CLOSED,
    CONVOY_OPEN,
    DONE_STATUSES,
    STAGED_STATUSES,
    Bead,
    Convoy,
    Dependency,
    Dispatch,
    Event,
    Notification,
    Rig,
    Subscription,
    TrackedBead,
    Worker,
    status_symbol,
)
from .readiness import blocked_by, ready_beads
from .services import beads as bead_service
from .services import convoys as convoy_service
from .services import feeding, launch, notify, staging
from .services.errors import ServiceError
from .services.notify import format_duration

VIEW = "convoys.view_convoy"
SORTS = {
    "age": ("-created_at", "id"),
    "-age": ("created_at", "id"),
    "id": ("id",),
    "title": ("title", "id"),
}
COLLAPSE_AT = 150
MAX_ROWS = 300
MAX_CHIPS = 600  # wave-table links on a big convoy's page; the DAG and ?all=1 show the rest
CHIPS_PER_WAVE = 60


def unread_count(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"unread_count": Notification.objects.filter(user=user, read_at__isnull=True).count()}


def viewer(view):
    return login_required(permission_required(VIEW, raise_exception=True)(view))


def _actor(request):
    return f"web:{request.user.username}"


def _back(request, fallback):
    target = request.POST.get("next") or fallback
    return redirect(target if target.startswith("/") else fallback)


# --- dashboard --------------------------------------------------------------------------------
@viewer
def dashboard(request):
    params = request.GET
    status = params.get("status", "active")
    queryset = Convoy.objects.all()
    if status == "active":
        queryset = queryset.filter(status__in=(CONVOY_OPEN, *STAGED_STATUSES))
    elif status == "staged":
        queryset = queryset.filter(status__in=STAGED_STATUSES)
    elif status in (CONVOY_OPEN, CONVOY_CLOSED):
        queryset = queryset.filter(status=status)
    if params.get("rig"):
        rig_beads = Bead.objects.filter(rig_id=params["rig"]).values("id")
        queryset = queryset.filter(tracked__bead_id__in=rig_beads).distinct()
    if params.get("owner"):
        queryset = queryset.filter(owner=params["owner"])
    if params.get("q"):
        q = params["q"].strip()
        queryset = queryset.filter(Q(id__icontains=q) | Q(title__icontains=q))
    sort = params.get("sort", "age")
    rows = list(queryset.order_by(*SORTS.get(sort, SORTS["age"]))[:500])
    summaries = selectors.convoy_summaries(rows)
    if sort in ("progress", "-progress", "activity"):
        key = {
            "progress": lambda c: summaries[c.pk]["done"] / (summaries[c.pk]["total"] or 1),
            "-progress": lambda c: -summaries[c.pk]["done"] / (summaries[c.pk]["total"] or 1),
            "activity": lambda c: -summaries[c.pk]["last_activity"].timestamp(),
        }[sort]
        rows.sort(key=key)
    now = timezone.now()
    items = [
        {
            "convoy": c,
            "s": summaries[c.pk],
            "age": format_duration(now - c.created_at),
            "activity": format_duration(now - summaries[c.pk]["last_activity"]),
        }
        for c in rows
    ]
    owners = sorted(set(Convoy.objects.exclude(owner="").values_list("owner", flat=True)[:200]))
    context = {
        "items": items,
        "status": status,
        "sort": sort,
        "params": params,
        "rigs": Rig.objects.all(),
        "owners": owners,
        "as_of": last_seq(),
        "sorts": [
            ("age", "Newest"),
            ("-age", "Oldest"),
            ("activity", "Last activity"),
            ("progress", "Least done"),
            ("-progress", "Most done"),
            ("id", "ID"),
        ],
        "statuses": [
            ("active", "Open & staged"),
            ("open", "Open"),
            ("staged", "Staged"),
            ("closed", "Closed"),
            ("all", "All"),
        ],
    }
    return render(request, "convoys/dashboard.html", context)


# --- convoy page ------------------------------------------------------------------------------
def status_class(status):
    if status in DONE_STATUSES:
        return "st-done", "✓"
    if status in ACTIVE_WORK_STATUSES:
        return "st-active", "▶"
    if status == "unknown":
        return "st-unknown", "?"
    if status == "ready":
        return "st-ready", "●"
    return "st-blocked", "○"


def convoy_graph(convoy):
    """A convoy's tracked ids, {id: TrackedRow}, DAG, waves and gated beads."""
    tracked, beads, edges = selectors.tracked_beads(convoy)
    nodes = [
        dagmod.Node(
            id=b.pk, title=b.title, type=b.issue_type or "", status=b.status, rig=b.rig_id or ""
        )
        for b in beads.values()
    ]
    graph = dagmod.build_dag(nodes, edges)
    try:
        waves, gated = dagmod.compute_waves(graph)
    except dagmod.NoSlingableTasks:
        waves, gated = [], []
    return tracked, beads, graph, waves, gated


def _geometry(convoy, graph, waves, gated, collapsed):
    exec_edges = [(a, b) for a, b in graph.graph.edges]
    key = "dag:" + convoy.pk + ":" + layout.fingerprint(list(graph.nodes), exec_edges, collapsed)
    geometry = cache.get(key)
    if geometry is None:
        geometry = layout.compute(waves, [g.id for g in gated], exec_edges, collapsed)
        cache.set(key, geometry, 3600)
    return geometry


def _eta(convoy, tracked_beads, remaining):
    """Median time a bead of this convoy (else of its rigs) took from dispatch to close."""
    closed = [b for b in tracked_beads if b.status == "closed" and b.closed_at]
    started = dict(
        Dispatch.objects.filter(bead_id__in=[b.pk for b in closed], ok=True)
        .values("bead_id")
        .annotate(first=Min("created_at"))
        .values_list("bead_id", "first")
    )
    samples = [
        (b.closed_at - started[b.pk]).total_seconds()
        for b in closed
        if b.pk in started and b.closed_at > started[b.pk]
    ]
    basis = "this convoy"
    if len(samples) < 3:
        rigs = {b.rig_id for b in tracked_beads if b.rig_id}
        recent = (
            Dispatch.objects.filter(rig__in=rigs, ok=True)
            .values("bead_id")
            .annotate(first=Min("created_at"))
            .values_list("bead_id", "first")[:500]
        )
        firsts = dict(recent)
        closes = dict(
            Bead.objects.filter(pk__in=firsts, status="closed").values_list("id", "closed_at")
        )
        samples = [
            (closes[i] - firsts[i]).total_seconds()
            for i in closes
            if closes[i] and closes[i] > firsts[i]
        ]
        basis = "its rigs"
    if not samples or not remaining:
        return None
    median = statistics.median(samples)
    return {
        "median": format_duration(timedelta(seconds=median)),
        "samples": len(samples),
        "basis": basis,
        "eta": timezone.now() + timedelta(seconds=median * remaining),
        "in": format_duration(timedelta(seconds=median * remaining)),
    }


@viewer
def convoy_detail(request, convoy_id):
    convoy = Convoy.objects.filter(pk=convoy_id).first()
    if convoy is None:
        raise Http404(f"convoy '{convoy_id}' not found")
    tracked, beads, graph, waves, gated = convoy_graph(convoy)
    tracked_q = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    now = timezone.now()
    summary, ready_ids = selectors.convoy_summary(convoy, tracked, beads, now)
    href = bead_url_maker()
    workers = dict(
        Worker.objects.filter(
            name__in={b.assignee for b in beads.values() if b.assignee}
        ).values_list("name", "last_seen")
    )
    wave_number = dagmod.wave_of(waves)
    gated_ids = {g.id for g in gated}

    def state(bead_id):
        bead = beads.get(bead_id)
        if bead is None:
            return "unknown"
        if bead.pk in ready_ids:
            return "ready"
        return bead.status

    rows = []
    for bead_id in tracked:
        bead = beads.get(bead_id)
        seen = workers.get(bead.assignee) if bead and bead.assignee else None
        rows.append(
            {
                "id": bead_id,
                "bead": bead,
                "state": state(bead_id),
                "symbol": status_symbol(bead.status if bead else "unknown"),
                "wave": wave_number.get(bead_id),
                "worker_age": format_duration(now - seen) if seen else "",
                "gated": bead_id in gated_ids,
            }
        )
    big = len(tracked) > COLLAPSE_AT and request.GET.get("all") != "1"
    hidden_rows = 0
    if big:
        # Large convoys list unfinished beads first and keep the page light; ?all=1 shows all.
        unfinished = [r for r in rows if r["state"] not in DONE_STATUSES]
        hidden_rows = len(rows) - min(len(unfinished), MAX_ROWS)
        rows = unfinished[:MAX_ROWS]
    blockers = blocked_by([r["id"] for r in rows] if big else tracked_q)
    for row in rows:
        row["blocked_by"] = blockers.get(row["id"], [])
        row["href"] = href(row["id"])
    chips_left = MAX_CHIPS if big else len(tracked)
    wave_rows = []
    frontier = None
    for number, wave in enumerate(waves, start=1):
        counts = {"done": 0, "active": 0, "ready": 0, "blocked": 0}
        for bead_id in wave:
            counts[
                selectors.segment_of(beads.get(bead_id), ready_ids)
                if beads.get(bead_id)
                else "blocked"
            ] += 1
        if frontier is None and counts["done"] < len(wave):
            frontier = number
        shown = [] if big and counts["done"] == len(wave) else wave[:CHIPS_PER_WAVE]
        shown = shown[: max(chips_left, 0)]
        chips_left -= len(shown)
        wave_rows.append(
            {
                "number": number,
                "counts": counts,
                "total": len(wave),
                "hidden": len(wave) - len(shown),
                "beads": [
                    {
                        "id": i,
                        "href": href(i),
                        "title": graph.nodes[i].title,
                        "state": state(i),
                        "blocked_by": graph.nodes[i].blocked_by,
                    }
                    for i in shown
                ],
            }
        )
    done = {i for i in tracked if beads.get(i) and beads[i].status in DONE_STATUSES}
    critical = dagmod.critical_path(graph, done)
    collapsed = set()
    focus = request.GET.get("focus", "")
    if len(graph.nodes) > COLLAPSE_AT and request.GET.get("expand") != "1":
        collapsed = {r["number"] for r in wave_rows if r["counts"]["done"] == r["total"]}
    svg = ""
    if waves or gated:
        if focus and focus in graph.nodes:
            keep = _neighbourhood(graph, focus)
            sub = dagmod.build_dag(
                [
                    dagmod.Node(n.id, n.title, n.type, n.status, n.rig)
                    for n in graph.nodes.values()
                    if n.id in keep
                ],
                [(b, a, "blocks") for a, b in graph.graph.edges if a in keep and b in keep],
            )
            sub_waves, sub_gated = dagmod.compute_waves(sub) if sub.slingable_ids() else ([], [])
            geometry = _geometry(convoy, sub, sub_waves, sub_gated, frozenset())
        else:
            geometry = _geometry(convoy, graph, waves, gated, frozenset(collapsed))
        stranded = set(summary["state"].ready)
        marks = {
            i: (["gated"] if i in gated_ids else []) + (["stranded"] if i in stranded else [])
            for i in tracked
        }
        svg = layout.svg(
            geometry,
            {i: (graph.nodes[i].title if i in graph.nodes else "", state(i)) for i in tracked},
            status_class,
            marks,
            critical,
            href=href,
        )
    size, at = dagmod.max_parallelism(waves)
    timeline = list(
        Event.objects.filter(Q(convoy_id=convoy.pk) | Q(bead_id__in=tracked_q)).order_by("-seq")[
            :100
        ]
    )
    user = request.user
    no_estimate = stranding.estimate_blocker(convoy, summary["state"])
    subscribed = Subscription.objects.filter(user=user, convoy=convoy).first()
    context = {
        "convoy": convoy,
        "rows": rows,
        "summary": summary,
        "waves": wave_rows,
        "frontier": frontier,
        "gated": gated,
        "svg": mark_safe(svg),
        "critical": [(i, href(i)) for i in critical],
        "eta": _eta(convoy, list(beads.values()), len(critical))
        if critical and no_estimate == ""
        else None,
        "no_estimate": no_estimate,
        "timeline": timeline,
        "as_of": last_seq(),
        "collapsed": sorted(collapsed),
        "focus": focus,
        "subscribed": subscribed,
        "summary_line": f"{sum(len(w) for w in waves)} tasks across {len(waves)} waves "
        f"(max parallelism: {size} in wave {at})",
        "can_change": user.has_perm("convoys.change_convoy"),
        "hidden_rows": hidden_rows,
        "plan_moved": (convoy.extra or {}).get("plan", {}),
    }
    return render(request, "convoys/convoy.html", context)


def bead_url_maker():
    """reverse() once, then string substitution: a 5,000-node graph needs 5,000 links."""
    template = reverse("bead", args=["__ID__"])
    return lambda bead_id: template.replace("__ID__", bead_id)


def _neighbourhood(graph, focus, hops=2):
    keep, frontier = {focus}, {focus}
    undirected = graph.graph.to_undirected(as_view=True)
    for _ in range(hops):
        frontier = {n for f in frontier for n in undirected.neighbors(f)} - keep
        keep |= frontier
    return keep


@require_POST
@viewer
def convoy_action(request, convoy_id, action):
    needed = {"subscribe": VIEW, "unsubscribe": VIEW}.get(action, "convoys.change_convoy")
    if not request.user.has_perm(needed):
        raise PermissionDenied("You may not change convoys.")
    actor = _actor(request)
    try:
        if action == "launch":
            result = launch.launch([convoy_id], force=request.POST.get("force") == "1", actor=actor)
            ok = sum(1 for r in result.dispatched if r["ok"])
            messages.success(
                request, f"Launched {convoy_id}: {ok} dispatched, {len(result.skipped)} skipped."
            )
        elif action == "check":
            _, closed, info = convoy_service.check(convoy_id, actor=actor)[0]
            messages.info(
                request,
                "Landed." if closed else f"{info['done']}/{info['total']} done — not complete yet.",
            )
        elif action == "close":
            convoy_service.close(
                convoy_id,
                reason=request.POST.get("reason", ""),
                force=request.POST.get("force") == "1",
                actor=actor,
            )
            messages.success(request, f"Closed {convoy_id}.")
        elif action == "land":
            convoy_service.land(convoy_id, force=request.POST.get("force") == "1", actor=actor)
            messages.success(request, f"Landed {convoy_id}.")
        elif action == "add":
            ids = request.POST.get("ids", "").replace(",", " ").split()
            _, added, reopened = convoy_service.add(convoy_id, ids, actor=actor)
            messages.success(
                request,
                f"Added {len(added)} bead(s)" + (" and reopened the convoy." if reopened else "."),
            )
        elif action == "subscribe":
            notify.subscribe(
                request.user,
                get_object_or_404(Convoy, pk=convoy_id),
                email=request.POST.get("email") == "1",
            )
            messages.success(request, "Subscribed: you will be told when it lands.")
        elif action == "unsubscribe":
            notify.unsubscribe(request.user, get_object_or_404(Convoy, pk=convoy_id))
            messages.info(request, "Unsubscribed.")
        else:
            raise Http404("unknown action")
    except ServiceError as exc:
        messages.error(request, str(exc))
    return _back(request, reverse("convoy", args=[convoy_id]))


# --- stage ------------------------------------------------------------------------------------
@viewer
def stage(request):
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
                plan = staging.stage(ids, title, actor=_actor(request))
                if not plan.errors:
                    verb = "Re-staged" if plan.restaged else "Staged"
                    messages.success(request, f"{verb} {plan.convoy_id} ({plan.status}).")
                    url = reverse("convoy", args=[plan.convoy_id])
                    if plan.moved:
                        url += "?moved=1"
                    return redirect(url)
            elif request.POST.get("do") == "launch":
                if not request.user.has_perm("convoys.change_convoy"):
                    raise PermissionDenied("You may not launch convoys.")
                result = launch.launch(
                    ids, force=request.POST.get("force") == "1", title=title, actor=_actor(request)
                )
                messages.success(
                    request,
                    f"Launched {result.convoy_id}: "
                    f"{sum(1 for r in result.dispatched if r['ok'])} "
                    "dispatched.",
                )
                return redirect("convoy", result.convoy_id)
        except ServiceError as exc:
            error = str(exc)
    if ids and plan is None and not error:
        try:
            plan = staging.analyze(ids, title)
        except ServiceError as exc:
            error = str(exc)
    if plan is not None and plan.dag is not None:
        text = formatting.render_tree(plan.dag, plan.input_kind, plan.root)
    epics = list(
        Bead.objects.filter(issue_type="epic")
        .exclude(status__in=DONE_STATUSES)
        .order_by("id")
        .values_list("id", "title")[:500]
    )
    context = {
        "plan": plan,
        "error": error,
        "ids_text": ids_text,
        "epic": epic,
        "tree": text,
        "epics": epics,
        "title": title or "",
        "waves": formatting.waves_json(plan.dag, plan.waves) if plan and plan.waves else [],
    }
    return render(request, "convoys/stage.html", context)


# --- stranded, beads, inbox, subscriptions ------------------------------------------------------
@viewer
def stranded(request):
    rows = feeding.stranded()
    return render(request, "convoys/stranded.html", {"rows": rows, "as_of": last_seq()})


@viewer
def bead_detail(request, bead_id):
    bead = Bead.objects.filter(pk=bead_id).select_related("rig").first()
    if bead is None:
        raise Http404(f"bead '{bead_id}' not found")
    outgoing = list(bead.dependencies.all())
    incoming = list(Dependency.objects.filter(depends_on_id=bead.pk).order_by("issue_id"))
    others = Bead.objects.in_bulk(
        [d.depends_on_id for d in outgoing] + [d.issue_id for d in incoming]
    )
    convoys = Convoy.objects.filter(tracked__bead_id=bead.pk).distinct()
    context = {
        "bead": bead,
        "ready": ready_beads(Bead.objects.filter(pk=bead.pk)).exists(),
        "blocked_by": blocked_by([bead.pk]).get(bead.pk, []),
        "outgoing": [(d, others.get(d.depends_on_id)) for d in outgoing],
        "incoming": [(d, others.get(d.issue_id)) for d in incoming],
        "convoys": convoys,
        "as_of": last_seq(),
        "events": Event.objects.filter(bead_id=bead.pk).order_by("-seq")[:100],
        "dispatches": Dispatch.objects.filter(bead_id=bead.pk)[:20],
        "can_change": request.user.has_perm("convoys.change_bead"),
    }
    return render(request, "convoys/bead.html", context)


@require_POST
@viewer
def bead_action(request, bead_id, action):
    if not request.user.has_perm("convoys.change_bead"):
        raise PermissionDenied("You may not change beads.")
    try:
        if action == "close":
            bead_service.close_bead(
                bead_id, reason=request.POST.get("reason", ""), actor=_actor(request)
            )
            messages.success(request, f"Closed {bead_id}.")
        elif action == "reopen":
            bead_service.reopen_bead(bead_id, actor=_actor(request))
            messages.success(request, f"Reopened {bead_id}.")
        else:
            raise Http404("unknown action")
    except ServiceError as exc:
        messages.error(request, str(exc))
    return _back(request, reverse("bead", args=[bead_id]))


@login_required
def inbox(request):
    notes = list(Notification.objects.filter(user=request.user).select_related("convoy")[:200])
    if request.method == "POST":
        ids = request.POST.getlist("id")  # none: all; ids that are not row numbers are ignored
        wanted = [int(i) for i in ids if i.isascii() and i.isdigit() and len(i) < 19]
        notify.mark_read(request.user, wanted if ids else None)
        return redirect("inbox")
    return render(request, "convoys/inbox.html", {"notes": notes, "as_of": last_seq()})


@viewer
def subscriptions(request):
    if request.method == "POST":
        convoy = None
        if request.POST.get("convoy"):
            convoy = Convoy.objects.filter(pk=request.POST["convoy"]).first()
            if convoy is None:
                messages.error(request, f"convoy '{request.POST['convoy']}' not found")
                return redirect("subscriptions")
        if request.POST.get("do") == "remove":
            notify.unsubscribe(request.user, convoy)
        else:
            notify.subscribe(request.user, convoy, email=request.POST.get("email") == "1")
        return redirect("subscriptions")
    subs = Subscription.objects.filter(user=request.user).select_related("convoy")
    return render(
        request,
        "convoys/subscriptions.html",
        {"subs": subs, "all_sub": subs.filter(convoy__isnull=True).first()},
    )


def forbidden(request, exception=None):
    return render(request, "403.html", {"reason": str(exception or "")}, status=403)


def query_with(params, **changes):
    data = {k: v for k, v in params.items() if v}
    data.update({k: v for k, v in changes.items()})
    return urlencode({k: v for k, v in data.items() if v})
