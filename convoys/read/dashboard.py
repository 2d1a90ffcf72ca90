"""The dashboard's read model: which convoys a filter and sort select, and a row per convoy."""

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import F, Q, QuerySet
from django.utils import timezone

from convoys.core.formatting import ACTOR_CHANNELS, person
from convoys.models import (
    CONVOY_OPEN,
    CONVOY_STATUSES,
    STAGED_STATUSES,
    Bead,
    Convoy,
    Rig,
)
from convoys.read.summaries import Params, Summary, convoy_summaries
from convoys.rules import forecasting

# --- page read models: one per page, used for the full page and for its live fragments -------
DASHBOARD_SORTS = {
    "age": ("-created_at", "id"),
    "-age": ("created_at", "id"),
    "id": ("id",),
    "title": ("title", "id"),
    "due": (F("due_at").asc(nulls_last=True), "id"),
}
# Sorts by what beads do: any change may reorder the table.
DASHBOARD_LIVE_SORTS = ("activity", "progress", "-progress")
DASHBOARD_LIMIT = 500


@dataclass
class DashboardRow:
    convoy: Convoy
    s: Summary


@dataclass
class DashboardPage:
    rows: list[DashboardRow]
    status: str
    sort: str
    owners: list[str]
    rigs: list[Rig]


SEARCH_MAX = 500  # longer search text is cut: SQLite refuses LIKE patterns over 50 kB


def filter_text(value: str) -> str:
    """A filter or search value from a query string, safe for every database: without NUL
    (PostgreSQL refuses it in a query) and at most SEARCH_MAX characters."""
    return value.replace("\x00", "").strip()[:SEARCH_MAX]


STATUS_FILTERS = ("active", "staged", "all", *CONVOY_STATUSES)


def status_filter_problem(status: str) -> str | None:
    """Why `status` is no convoy status filter (the dashboard's and the API's), or None."""
    if status in STATUS_FILTERS:
        return None
    shown = status if len(status) <= 40 else status[:40] + "…"
    return f"unknown status filter {shown!r}: use one of {', '.join(STATUS_FILTERS)}"


def convoys_with_status(status: str) -> QuerySet[Convoy]:
    """The convoys a status filter selects, on the dashboard and in the API: "active" (open
    or staged), "staged" (ready or with warnings), "all", or one status (STATUS_FILTERS;
    callers refuse any other word with `status_filter_problem`)."""
    queryset = Convoy.objects.all()
    if status == "active":
        return queryset.filter(status__in=(CONVOY_OPEN, *STAGED_STATUSES))
    if status == "staged":
        return queryset.filter(status__in=STAGED_STATUSES)
    if status == "all":
        return queryset
    return queryset.filter(status=status)


def dashboard_convoys(params: Params) -> QuerySet[Convoy]:
    """The convoys the dashboard lists for these query parameters (a queryset, unsorted)."""
    keys = ("status", "rig", "owner", "q", "deadline")
    params = {key: filter_text(params.get(key) or "") for key in keys}
    queryset = convoys_with_status(params["status"] or "active")
    if params["deadline"]:
        queryset = queryset.filter(forecasting.told_q(params["deadline"], timezone.now()))
    if params.get("rig"):
        rig_beads = Bead.objects.filter(rig_id=params["rig"]).values("id")
        queryset = queryset.filter(tracked__bead_id__in=rig_beads).distinct()
    if params.get("owner"):
        owner = params["owner"]
        queryset = queryset.filter(owner__in=[owner] + [c + owner for c in ACTOR_CHANNELS])
    if params.get("q"):
        q = params["q"]
        queryset = queryset.filter(Q(id__icontains=q) | Q(title__icontains=q))
    return queryset


def dashboard_rows(params: Params, only: Iterable[str] | None = None) -> list[DashboardRow]:
    """The dashboard's rows, sorted; `only`: just these convoys (those a live update touched)."""
    sort = params.get("sort", "age")
    queryset = dashboard_convoys(params)
    if only is not None:
        queryset = queryset.filter(pk__in=only)
    convoys = list(
        queryset.order_by(*DASHBOARD_SORTS.get(sort, DASHBOARD_SORTS["age"]))[:DASHBOARD_LIMIT]
    )
    summaries = convoy_summaries(convoys)
    if sort in DASHBOARD_LIVE_SORTS:

        def done_share(c: Convoy) -> float:
            return float(summaries[c.pk]["done"] / (summaries[c.pk]["total"] or 1))

        key = {
            "progress": done_share,
            "-progress": lambda c: -done_share(c),
            "activity": lambda c: -summaries[c.pk]["last_activity"].timestamp(),
        }[sort]
        convoys.sort(key=key)
    return [DashboardRow(c, summaries[c.pk]) for c in convoys]


def dashboard_page(params: Params) -> DashboardPage:
    owners = Convoy.objects.exclude(owner="").values_list("owner", flat=True).distinct()[:200]
    return DashboardPage(
        rows=dashboard_rows(params),
        status=params.get("status", "active"),
        sort=params.get("sort", "age"),
        owners=sorted({person(o) for o in owners}),
        rigs=list(Rig.objects.all()),
    )
