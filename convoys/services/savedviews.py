"""Saved views: a page's filters (its query string) kept under a name by one user, opened by
anyone who may see the page, one per user and page the default. A preference of one user's,
like a subscription: it changes nothing the event log, the read model or other pages show,
so it records no event."""

from typing import NamedTuple
from urllib.parse import parse_qsl, urlencode

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from convoys.core.ids import text_problem
from convoys.models import SavedView
from convoys.services.errors import NotFound, ServiceError

# The filters each page reads from its query string, in the order a saved query lists them.
KEYS = {
    "dashboard": ("status", "rig", "owner", "deadline", "q", "sort"),
    "stranded": ("kind", "q"),
}
NAME_MAX = 80
QUERY_MAX = 2000


class Saved(NamedTuple):
    view: SavedView
    created: bool  # False: a view of that name had its filters replaced


def clean_query(page: str, query: str) -> str:
    """The page's filters in `query` (a query string), the empty ones and any other key left
    out, in the page's order: what a saved view keeps."""
    keys = _keys(page)
    if not isinstance(query, str) or len(query) > QUERY_MAX:
        raise ServiceError(f"query: at most {QUERY_MAX} characters of a query string")
    given = dict(parse_qsl(query.lstrip("?"), keep_blank_values=False))
    for key, value in given.items():
        problem = text_problem(value)
        if problem and key in keys:
            raise ServiceError(f"query: {key} {problem}")
    return urlencode([(k, given[k].strip()) for k in keys if given.get(k, "").strip()])


def check_name(name: object) -> str:
    """A view's name: one line of 1 to NAME_MAX characters, no control character."""
    if not isinstance(name, str):
        raise ServiceError("name: must be text")
    name = name.strip()
    if not name:
        raise ServiceError("name: give the view a name")
    if len(name) > NAME_MAX:
        raise ServiceError(f"name: at most {NAME_MAX} characters ({len(name)} given)")
    problem = text_problem(name)
    if problem:
        raise ServiceError(f"name: {problem}")
    if any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in name):
        raise ServiceError("name: one line, without control characters")
    return name


def _keys(page: str) -> tuple[str, ...]:
    if page not in KEYS:
        raise ServiceError(f"page: one of {', '.join(KEYS)} ({page[:40]!r} given)")
    return KEYS[page]


def save(user: User, page: str, name: object, query: str) -> Saved:
    """Save the page's filters under `name` (a view of that name gets these filters)."""
    cleaned, named = clean_query(page, query), check_name(name)
    with transaction.atomic():
        view, created = SavedView.objects.select_for_update().get_or_create(
            user=user,
            page=page,
            name=named,
            defaults={"query": cleaned, "created_at": timezone.now()},
        )
        if not created and view.query != cleaned:
            view.query = cleaned
            view.save(update_fields=["query"])
    return Saved(view, created)


def _own(user: User, view_id: int) -> SavedView:
    found = SavedView.objects.select_for_update().filter(pk=view_id, user=user)
    view = found.first() if 0 < view_id < 2**63 else None
    if view is None:
        raise NotFound(f"saved view {view_id} not found among yours")
    return view


def rename(user: User, view_id: int, name: object) -> SavedView:
    named = check_name(name)
    with transaction.atomic():
        view = _own(user, view_id)
        if view.name == named:
            return view
        if SavedView.objects.filter(user=user, page=view.page, name=named).exists():
            raise ServiceError(f"name: you already have a view named {named!r}")
        view.name = named
        try:
            with transaction.atomic():
                view.save(update_fields=["name"])
        except IntegrityError:
            raise ServiceError(f"name: you already have a view named {named!r}") from None
    return view


def delete(user: User, view_id: int) -> str:
    """Delete one of the user's views; returns its name."""
    with transaction.atomic():
        view = _own(user, view_id)
        view.delete()
    return view.name


def set_default(user: User, view_id: int, on: bool) -> SavedView:
    """Make the view the user's default for its page (`on`), or no longer the default."""
    with transaction.atomic():
        view = _own(user, view_id)
        if on:
            SavedView.objects.filter(user=user, page=view.page, default=True).exclude(
                pk=view.pk
            ).update(default=False)
        view.default = on
        view.save(update_fields=["default"])
    return view
