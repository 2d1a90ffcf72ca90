"""The small read models: epics to stage, a user's subscriptions, finding beads by id or title,
and the town's minute that `serve` prints."""

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from django.contrib.auth.models import User
from django.db.models import Q

from convoys.core import webhooks
from convoys.log.events import last_seq
from convoys.models import (
    CONVOY_OPEN,
    DONE_STATUSES,
    Bead,
    Convoy,
    Dispatch,
    Event,
    Subscription,
    WebhookDelivery,
    WebhookTarget,
)
from convoys.rules import capacity
from convoys.rules.readiness import ready_beads
from convoys.services import hooks, notify


def epics_to_stage(limit: int = 500) -> list[tuple[str, str]]:
    """(id, title) of the epics not yet done, for the stage page's picker."""
    epics = Bead.objects.filter(issue_type="epic").exclude(status__in=DONE_STATUSES)
    return list(epics.order_by("id").values_list("id", "title")[:limit])


@dataclass
class SubscriptionsPage:
    subs: list[Subscription]  # to one convoy each
    all_sub: Subscription | None  # to every convoy
    delivery: notify.Preference
    hooks: list["HookRow"] = field(default_factory=list)  # webhooks and chat the user manages


class HookRow(NamedTuple):
    target: WebhookTarget
    kinds: tuple[str, ...]
    chat: bool
    deliveries: list[tuple[WebhookDelivery, str]]  # the recent ones, each with its body shown


def subscriptions_page(user: User) -> SubscriptionsPage:
    subs = list(Subscription.objects.filter(user=user).select_related("convoy"))
    return SubscriptionsPage(
        subs=[s for s in subs if s.convoy_id],
        all_sub=next((s for s in subs if s.convoy_id is None), None),
        delivery=notify.preference(user),
        hooks=hook_rows(user),
    )


def hook_rows(user: User) -> list[HookRow]:
    """The user's own targets and, with change_convoy, every convoy's and the town's, each
    with its latest deliveries."""
    rows = []
    for target in hooks.targets(user, others=user.has_perm("convoys.change_convoy")):
        recent = hooks.deliveries(target, hooks.RECENT)
        rows.append(
            HookRow(
                target,
                webhooks.kinds_of(target.kinds),
                webhooks.is_chat(target.url),
                [(d, json.dumps(d.body, indent=2, ensure_ascii=False)) for d in recent],
            )
        )
    return rows


def find_beads(
    *,
    status: str | None = None,
    rig: str | None = None,
    assignee: str | None = None,
    q: str | None = None,
    ready: bool = False,
    limit: int = 200,
) -> list[Bead]:
    """The beads the filters select (the API's list, `beads ready`): ready ones in the feed's
    order (priority, id), the others by id; `assignee` matches a prefix, `q` the id or title."""
    queryset = Bead.objects.all()
    if status:
        queryset = queryset.filter(status=status)
    if rig:
        queryset = queryset.filter(rig_id=rig)
    if assignee:
        queryset = queryset.filter(assignee__startswith=assignee)
    if q:
        queryset = queryset.filter(Q(id__icontains=q) | Q(title__icontains=q))
    queryset = ready_beads(queryset) if ready else queryset.order_by("id")
    return list(queryset[:limit])


# --- serve's line a minute --------------------------------------------------------------------
class TownMinute(NamedTuple):
    """What the town did between two reads: `serve`'s status line."""

    seq: int  # the log's last event when read (the next read starts after it)
    moving: int  # open convoys with an event since the last read
    landed: int  # convoys that landed since the last read
    in_flight: int  # beads in flight now
    failed: int  # dispatches that failed since `since`


def town_minute(after: int, since: datetime) -> TownMinute:
    """The town since event `after` and the moment `since`: a few indexed queries (the log's
    sequence, the dispatch times), whatever the town's size."""
    top = last_seq()
    recent = Event.objects.filter(seq__gt=after, seq__lte=top)
    moving = Convoy.objects.filter(status=CONVOY_OPEN).filter(
        Q(pk__in=recent.exclude(convoy_id="").values("convoy_id"))
        | Q(tracked__bead_id__in=recent.exclude(bead_id="").values("bead_id"))
    )
    return TownMinute(
        seq=top,
        moving=moving.distinct().count(),
        landed=recent.filter(kind="convoy.landed").count(),
        in_flight=capacity.in_flight(),
        failed=Dispatch.objects.filter(created_at__gte=since, ok=False).count(),
    )
