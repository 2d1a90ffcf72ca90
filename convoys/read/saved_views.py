"""What a page shows of saved views: the user's own, which one the current filters are, the
default; and a shared view opened by its id."""

from dataclasses import dataclass
from typing import Any

from convoys.models import SavedView
from convoys.rules import stranding
from convoys.services.errors import ServiceError
from convoys.services.savedviews import clean_query

# Where each page lives (its URL name).
PAGE_URLS = {"dashboard": "dashboard", "stranded": "stranded"}


@dataclass
class SavedViews:
    page: str
    query: str  # the current filters, as a saved view would keep them
    views: list[SavedView]
    current: SavedView | None  # the user's view with exactly these filters


def card(user: Any, page: str, query: str) -> SavedViews:
    views = list(SavedView.objects.filter(user=user, page=page).order_by("name"))
    try:
        cleaned = clean_query(page, query)
    except ServiceError:
        cleaned = ""  # filters no view could keep (the page says what is wrong with them)
    current = next((v for v in views if v.query == cleaned), None)
    return SavedViews(page, cleaned, views, current)


def default_of(user: Any, page: str) -> SavedView | None:
    return SavedView.objects.filter(user=user, page=page, default=True).first()


def shared(view_id: int) -> SavedView | None:
    if not 0 < view_id < 2**63:
        return None
    return SavedView.objects.filter(pk=view_id).first()


# --- the stranded page's filters -----------------------------------------------------------
STRANDED_KINDS = [
    ("", "any"),
    (stranding.FEEDABLE, "Feedable"),
    (stranding.MOVING, "Moving"),
    (stranding.STUCK, "Stuck"),
    (stranding.EMPTY, "Empty"),
]


def stranded_filtered(rows: list[dict[str, Any]], params: Any) -> list[dict[str, Any]]:
    """The stranded page's rows of the kind asked (`kind`) whose id or title holds `q`."""
    kind = (params.get("kind") or "").strip()
    q = (params.get("q") or "").strip().casefold()
    return [
        r
        for r in rows
        if (not kind or r["kind"] == kind)
        and (not q or q in r["id"].casefold() or q in (r["title"] or "").casefold())
    ]
