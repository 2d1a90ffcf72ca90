"""Time as events: what the passing of time changes is recorded when its time comes.

The read model (convoys/read/projection.py) keeps, per bead, when its worker counts as dead and
when a failed dispatch's cooldown ends. The ticker runs `pass_time` every feed interval: each
bead whose time came records `worker.timed_out` or `cooldown.ended`, once, and that event
refreshes its facts in the same transaction like any other."""

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from convoys.log.events import EventItem, record_many, settle
from convoys.models import BeadFacts
from convoys.rules.readiness import dead_among

LIMIT = 1000  # events per pass; the next pass takes the rest


def due(now: datetime, limit: int = LIMIT) -> list[EventItem]:
    """The time events owed at `now`: a worker silent past the timeout (by the readiness
    rule's own test), a cooldown that ran out."""
    silent = list(
        BeadFacts.objects.filter(dead_at__lt=now, worker_dead=False)
        .order_by("dead_at")
        .values_list("bead_id", flat=True)[:limit]
    )
    items: list[EventItem] = [
        {"kind": "worker.timed_out", "bead_id": i} for i in sorted(dead_among(silent, now))
    ]
    ended = BeadFacts.objects.filter(cooldown_until__lt=now).order_by("cooldown_until")
    items += [
        {"kind": "cooldown.ended", "bead_id": i}
        for i in ended.values_list("bead_id", flat=True)[:limit]
    ]
    return items


def pass_time(now: datetime | None = None) -> dict[str, Any]:
    """Record the time events owed now; {"recorded": n}."""
    now = now or timezone.now()
    settle()  # a bulk load committed without settling its read model (a writer's mistake)
    with transaction.atomic():
        items = due(now)
        record_many(items)
    return {"recorded": len(items)}
