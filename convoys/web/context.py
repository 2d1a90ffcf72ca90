"""What every page's context holds: the sequence number it is drawn at, `now`, the inbox badge
and the rules the pages' scripts follow (context processors), and a read model's fields as
template variables."""

import dataclasses
import functools
from typing import Any

from django.http import HttpRequest
from django.utils import timezone

from convoys.core import formatting
from convoys.log.events import last_seq
from convoys.log.kinds import LOG
from convoys.models import Notification, Subscription
from convoys.read import summaries


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


def browser_rules(request: HttpRequest) -> dict[str, Any]:
    """Context processor: the rules the pages' scripts follow, stated here once (base.html puts
    them in a JSON block, `browser-rules`): how relative times are worded and each drawn
    state's icon; the kinds a page follows only where it shows their bead or convoy (a
    worker's log lines: the dashboard does not ask for its fragments again)."""
    return {
        "browser_rules": {
            "relative": formatting.RELATIVE_WORDS,
            "icons": summaries.state_icons(),
            "quiet": [LOG],
        }
    }


def page_context(request: HttpRequest) -> dict[str, Any]:
    """What every page's context starts with: the event sequence number it is drawn at (read
    before anything else, so that the events it does not show come after it) and `now`."""
    return {"as_of": last_seq(), "now": timezone.now()}


def fields_of(page: Any) -> dict[str, Any]:
    """A read model's fields as template variables (the templates name them directly)."""
    return {f.name: getattr(page, f.name) for f in dataclasses.fields(page)}
