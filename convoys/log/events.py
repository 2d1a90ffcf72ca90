"""The event log: append with a gap-free sequence number, read after a sequence number.

Sequence numbers come from one counter row updated in the writer's own transaction, so they
are gap-free in commit order on SQLite and PostgreSQL alike (a reader that has seen seq N
has seen everything before it): a second writer waits
on the row lock until the first commits.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NotRequired, Protocol, TypedDict, overload

from django.db import connection
from django.utils import timezone

from convoys.infra import bulk
from convoys.log import kinds
from convoys.models import Event, EventCounter, TrackedBead

CLOSED = kinds.CLOSED
COUNTER = "events"


class Keeper(Protocol):
    """What is kept with the log (convoys/read/projection.py, registered by the app's ready(): it
    sits above this module, so it is handed in rather than imported). `keep` is called with
    every append's rows in the writer's transaction; a bulk append (import, sync) may defer
    its work to `settle`, which the bulk writer calls before its transaction ends."""

    def keep(self, rows: Sequence[Mapping[str, Any]], first: int, bulk: bool) -> None: ...
    def settle(self) -> None: ...


KEEPERS: list[Keeper] = []


def settle() -> None:
    """A bulk writer's last step inside its transaction: what its bulk appends deferred."""
    for keeper in KEEPERS:
        keeper.settle()


class EventItem(TypedDict):
    """One event to append (record_many): its kind, and what it is about."""

    kind: str
    bead_id: NotRequired[str]
    convoy_id: NotRequired[str]
    actor: NotRequired[str]
    data: NotRequired[dict[str, Any] | None]


def reserve(count: int) -> int:
    """Reserve `count` sequence numbers; return the first. Must run inside a transaction."""
    if not connection.in_atomic_block:
        raise RuntimeError("events must be recorded inside transaction.atomic()")
    table = EventCounter._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET value = value + %s WHERE name = %s RETURNING value",
            [count, COUNTER],
        )
        row = cursor.fetchone()
    if row is None:
        EventCounter.objects.create(name=COUNTER, value=0)
        return reserve(count)
    last: int = row[0]
    return last - count + 1


def tracking_convoys(bead_ids: Iterable[str]) -> dict[str, list[str]]:
    """{bead_id: [convoy ids, sorted]} for the given beads."""
    result: dict[str, list[str]] = {}
    for bead_id, convoy_id in bulk.select_in(TrackedBead, "bead_id", bead_ids, also="convoy_id"):
        result.setdefault(bead_id, []).append(convoy_id)
    for convoys in result.values():
        convoys.sort()
    return result


def record(
    kind: str,
    *,
    bead_id: str = "",
    convoy_id: str = "",
    actor: str = "",
    data: dict[str, Any] | None = None,
) -> Event:
    """Append one event in the caller's transaction and return it."""
    return record_many(
        [dict(kind=kind, bead_id=bead_id, convoy_id=convoy_id, actor=actor, data=data or {})]
    )[0]


@overload
def record_many(items: Sequence[EventItem], *, instances: Literal[True] = ...) -> list[Event]: ...
@overload
def record_many(items: Sequence[EventItem], *, instances: Literal[False]) -> range: ...


def record_many(items: Sequence[EventItem], *, instances: bool = True) -> list[Event] | range:
    """Append several events at once (one counter update, one insert).

    Returns the Event objects, or only their sequence numbers (in the order of `items`) with
    `instances=False`: bulk loads (import, sync), whose rows go in through bulk.py's multi-row
    INSERT; every other write goes through the ORM.

    Recording runs nothing else: a writer whose event the cluster must act on (a
    `bead.closed`) says so itself through convoys/log/queue.py."""
    if not items:
        return [] if instances else range(0)
    unknown = kinds.unregistered([item["kind"] for item in items])
    if unknown:
        raise ValueError(f"event kind not registered in convoys/log/kinds.py: {', '.join(unknown)}")
    first = reserve(len(items))
    now = timezone.now()
    bead_ids = {item["bead_id"] for item in items if item.get("bead_id")}
    tracked = tracking_convoys(bead_ids) if bead_ids else {}
    rows: list[dict[str, Any]] = []
    for offset, item in enumerate(items):
        data = dict(item.get("data") or {})
        if item.get("bead_id") and "convoys" not in data:
            data["convoys"] = tracked.get(item["bead_id"], [])
        rows.append(
            {
                "seq": first + offset,
                "kind": item["kind"],
                "bead_id": item.get("bead_id", ""),
                "convoy_id": item.get("convoy_id", ""),
                "actor": item.get("actor", ""),
                "data": data,
                "created_at": now,
            }
        )
    if instances:
        created = Event.objects.bulk_create([Event(**row) for row in rows])
    else:
        bulk.insert(Event, rows)
    for keeper in KEEPERS:
        keeper.keep(rows, first, bulk=not instances)
    return created if instances else range(first, first + len(rows))


def last_seq() -> int:
    value = EventCounter.objects.filter(name=COUNTER).values_list("value", flat=True).first()
    return value or 0
