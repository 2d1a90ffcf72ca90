"""The events that make a source's hold on its records visible: a record missing from its
source or back in it, a record taken from another source, a source forgotten.
"""

from collections.abc import Callable
from datetime import datetime
from typing import Any

from convoys.log.events import EventItem, record_many
from convoys.models import (
    Bead,
    Convoy,
    SourcedRecord,
)
from convoys.services import jsonl

# A record marked missing from its source, or back in it: its event (model, kind, id field).
PRESENCE_EVENTS = ((Bead, "bead.updated", "bead_id"), (Convoy, "convoy.updated", "convoy_id"))


def source_events(
    ids: list[str],
    actor: str,
    data: Callable[[str], dict[str, Any]],
    before: Callable[[list[str]], Any] | None = None,
) -> int:
    """An event for each bead and convoy among `ids` (bead.updated, convoy.updated): its
    status and title, and `data(id)`; `before` runs on each batch of ids first. None of them
    is a close. Returns the number of events."""
    events: list[EventItem] = []
    for start in range(0, len(ids), jsonl.BATCH):
        part = ids[start : start + jsonl.BATCH]
        if before is not None:
            before(part)
        for model, kind, key in PRESENCE_EVENTS:
            for row in model.objects.filter(pk__in=part).only("id", "status", "title"):
                fields = {"status": row.status, "title": row.title, **data(row.id)}
                item: EventItem = {"kind": kind, "actor": actor, "data": fields}
                item[key] = row.id  # type: ignore[literal-required]  # bead_id or convoy_id
                events.append(item)
    return len(record_many(events, instances=False))


def mark_missing(name: str, ids: list[str], since: datetime | None, actor: str) -> int:
    """Mark records as missing from their source since `since` (never deleted), or clear the
    mark (`since` None); each bead and convoy among them gets an event saying so. Returns
    the number of events."""
    data = {
        "source": name,
        "missing_from_source": since is not None,
        "changes": ["missing_from_source"],
    }

    def mark(part: list[str]) -> None:
        SourcedRecord.objects.filter(pk__in=part).update(missing_since=since)

    return source_events(ids, actor, lambda _: data, mark)


def mark_moved(name: str, taken: list[tuple[str, str]], actor: str) -> int:
    """An event for each bead and convoy a pass of source `name` took from the source that
    owned it, as (id, that source); the move is not refused (the newest source wins), only
    made visible. Returns the number of events."""
    owners = dict(taken)

    def data(item_id: str) -> dict[str, Any]:
        return {"source": name, "previous_source": owners[item_id], "changes": ["source"]}

    return source_events(list(owners), actor, data)
