"""The dashboard (every convoy, its filters, the capacity panel and the feeding banner) and the
stranded page."""

from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from convoys.log.kinds import LOG
from convoys.read.dashboard import (
    DASHBOARD_LIVE_SORTS,
    DashboardRow,
    dashboard_page,
    dashboard_rows,
    filter_text,
    status_filter_problem,
)
from convoys.read.saved_views import STRANDED_KINDS, card, default_of, stranded_filtered
from convoys.rules import capacity
from convoys.rules.rows import changes_since
from convoys.services import feeding, ticker
from convoys.web.access import viewer
from convoys.web.context import page_context
from convoys.web.fragments import Fragment, is_live, respond, since, unread

DASHBOARD_SORTS = [
    ("age", "Newest"),
    ("-age", "Oldest"),
    ("activity", "Last activity"),
    ("progress", "Least done"),
    ("-progress", "Most done"),
    ("id", "ID"),
    ("due", "Due soonest"),
]
DASHBOARD_DEADLINES = [
    ("", "any"),
    ("at-risk", "At risk"),
    ("overdue", "Overdue"),
    ("on-track", "On track"),
    ("none", "No due time"),
]


DASHBOARD_STATUSES = [
    ("active", "Open & staged"),
    ("open", "Open"),
    ("staged", "Staged"),
    ("closed", "Closed"),
    ("all", "All"),
]


def _default_view(request: HttpRequest, page: str) -> HttpResponse | None:
    """A page opened with no query at all shows the user's default view (`?all=1`: none)."""
    if request.GET or is_live(request):
        return None
    default = default_of(request.user, page)
    if default is None or not default.query:
        return None
    return HttpResponseRedirect(f"{reverse(page)}?{default.query}")


@viewer
def dashboard(request: HttpRequest) -> HttpResponse:
    default = _default_view(request, "dashboard")
    if default is not None:
        return default
    context = page_context(request) | {"feeding": _feeding()}
    params = request.GET
    status = filter_text(params.get("status") or "") or "active"
    problem = status_filter_problem(status)
    if problem:
        return render(request, "convoys/bad_filter.html", {"problem": problem}, status=422)
    seq = since(request)
    changes = changes_since(seq, context["as_of"]) if seq is not None else None
    if changes is not None and changes.kinds == {LOG}:
        # Only workers' log lines: nothing the dashboard shows.
        return respond(request, "convoys/dashboard.html", context, [unread(), FEEDING])
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
        "deadlines": DASHBOARD_DEADLINES,
        "capacity": capacity.panel(),
        "saved": card(request.user, "dashboard", params.urlencode()),
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


@viewer
def stranded(request: HttpRequest) -> HttpResponse:
    default = _default_view(request, "stranded")
    if default is not None:
        return default
    params = request.GET
    context = page_context(request) | {
        "rows": stranded_filtered(feeding.stranded(), params),
        "params": params,
        "kinds": STRANDED_KINDS,
        "saved": card(request.user, "stranded", params.urlencode()),
    }
    fragments = [Fragment("stranded-table", "convoys/_stranded_table.html"), unread()]
    return respond(request, "convoys/stranded.html", context, fragments)
