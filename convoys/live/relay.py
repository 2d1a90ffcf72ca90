"""The relay: tails the event log inside each web process and pushes new events to the groups
that show them. It starts on the first websocket connection (daphne has no ASGI
lifespan).

Embedded default (in-memory layer): every web process relays to its own sockets.
With Redis: one relay at a time holds a lease and publishes through the Redis layer to every
web process; its position is persisted, so a successor continues where it stopped.

Each message carries `prev`, the previous seq sent to that group, so a consumer that misses
one (every layer drops silently under load) notices and replays from the log.
"""

import asyncio
import json
import logging
import os
import socket
from datetime import datetime
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from convoys.core.ids import group_name
from convoys.log.events import last_seq
from convoys.models import Cursor, Event, Lease
from convoys.services import leases

log = logging.getLogger("convoys.live.relay")

DASHBOARD = "dashboard"
TICK_SECONDS = 2.0
TICK_WINDOW = 60.0
# Errors that mean the layer is away, not that one message is bad.
UNREACHABLE = (OSError, TimeoutError, RedisConnectionError, RedisTimeoutError)
_task = None
_relay: "Relay | None" = None  # this process's relay (the one `_task` runs)


def groups_for(event: dict[str, Any]) -> list[str]:
    """The groups an event belongs to."""
    if event["kind"] == "notification":
        user = event["data"].get("user_id")
        return [group_name("user", user)] if user else []
    groups = [DASHBOARD]
    convoys = set(event["data"].get("convoys") or [])
    if event["convoy_id"]:
        convoys.add(event["convoy_id"])
    groups += [group_name("convoy", c) for c in sorted(convoys)]
    if event["bead_id"]:
        groups.append(group_name("bead", event["bead_id"]))
    return groups


def serialize(event: Event) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "kind": event.kind,
        "bead_id": event.bead_id,
        "convoy_id": event.convoy_id,
        "actor": event.actor,
        "data": event.data,
        "created_at": event.created_at.isoformat(),
    }


def _fetch(after: int, limit: int = 500) -> list[dict[str, Any]]:
    close_old_connections()
    rows = list(Event.objects.filter(seq__gt=after).order_by("seq")[:limit])
    return [serialize(e) for e in rows]


def _last_seq() -> int:
    close_old_connections()
    return last_seq()


def _lead(holder: str) -> bool:
    close_old_connections()
    return leases.acquire("relay", holder, ttl=5)


def _load_position() -> int:
    cursor = Cursor.objects.filter(name="relay").first()
    if cursor is None:
        return last_seq()
    return cursor.position


def _save_position(position: int) -> None:
    Cursor.objects.update_or_create(name="relay", defaults={"position": position})


class Relay:
    def __init__(self, shared: bool) -> None:
        self.shared = shared  # True with a shared (Redis) layer: lead by lease
        self.layer = get_channel_layer()
        self.holder = f"{socket.gethostname()}:{os.getpid()}:relay"
        self.prev: dict[str, int] = {}  # group -> last seq sent to it
        self.sent_at: dict[str, float] = {}  # group -> loop time of that send
        self.position: int | None = None

    async def run(self) -> None:
        interval = settings.CONVOY_RELAY_INTERVAL
        last_tick = 0.0
        failing = False
        me = asyncio.current_task()
        # Until cancelled, even when a cancel arrived during a sync_to_async call that did not
        # pass it on: the loop's shutdown would otherwise wait on this task for ever.
        while me is None or not me.cancelling():
            try:
                await self.step()
                now = asyncio.get_running_loop().time()
                if now - last_tick >= TICK_SECONDS:
                    last_tick = now
                    await self.tick(now)
            except Exception:
                # The layer or the database is away (e.g. Redis restarting): retried every
                # second, logged once per outage.
                if not failing:
                    log.exception("relay step failed; retrying every second")
                failing = True
                await asyncio.sleep(1)
            else:
                if failing:
                    log.info("relay running again")
                failing = False
            await asyncio.sleep(interval)

    async def tick(self, now: float) -> None:
        """Tell each group that had events in the last TICK_WINDOW seconds the last seq sent
        to it, so a consumer whose final messages were dropped notices and replays them (a gap
        is otherwise seen only on the next event). Older groups are forgotten: after that many
        ticks nothing can still be missing, and the tick stays as small as the recent traffic
        (an import touches 100,000 bead groups once)."""
        for group in [g for g, at in self.sent_at.items() if now - at > TICK_WINDOW]:
            del self.sent_at[group], self.prev[group]
        for group, seq in list(self.prev.items()):
            await self.send(group, {"type": "convoy.tick", "group": group, "seq": seq})

    async def step(self) -> None:
        if self.shared:
            if not await sync_to_async(_lead)(self.holder):
                self.position = None
                return
            if self.position is None:
                self.position = await sync_to_async(_load_position)()
        elif self.position is None:
            self.position = await sync_to_async(_last_seq)()
        events = await sync_to_async(_fetch)(self.position)
        for event in events:
            await self.publish(event)
            self.position = event["seq"]
        if events and self.shared:
            await sync_to_async(_save_position)(self.position)

    async def publish(self, event: dict[str, Any]) -> None:
        # Encoded once here, not once per subscriber.
        text = json.dumps({"type": "event", **event}, ensure_ascii=False)
        # The layer copies each message per subscriber: carry only what routing needs.
        data = event["data"]
        routing = {
            "seq": event["seq"],
            "kind": event["kind"],
            "bead_id": event["bead_id"],
            "convoy_id": event["convoy_id"],
            "data": {"convoys": data.get("convoys"), "user_id": data.get("user_id")},
        }
        now = asyncio.get_running_loop().time()
        for group in groups_for(event):
            message = {
                "type": "convoy.event",
                "event": routing,
                "group": group,
                "prev": self.prev.get(group),
                "text": text,
            }
            self.prev[group] = event["seq"]
            self.sent_at[group] = now
            await self.send(group, message)

    async def send(self, group: str, message: dict[str, Any]) -> None:
        """One group_send. A message the layer refuses is logged and skipped: its subscribers
        see the gap through `prev` (or the next tick) and replay it from the log. A layer that
        cannot be reached raises, and the step is retried."""
        try:
            await self.layer.group_send(group, message)
        except UNREACHABLE:
            raise
        except Exception:
            seq = message.get("event", message)["seq"]
            log.exception("relay: %s for seq %s refused by the layer; skipped", group, seq)


def ensure_running() -> asyncio.Task[None]:
    """Start this process's relay once per event loop (called on websocket connect)."""
    global _task, _relay
    loop = asyncio.get_running_loop()
    if _task is None or _task.done() or _task.get_loop() is not loop:
        shared = "Redis" in type(get_channel_layer()).__name__
        _relay = Relay(shared)
        _task = loop.create_task(_relay.run())
    return _task


class Lag(NamedTuple):
    """How far a relay is behind the event log: events not relayed yet, and the age of the
    oldest of them in seconds (0 when it is caught up)."""

    events: int
    seconds: float
    relay: str  # "process" (this process's, the in-memory layer) or "shared" (the leader's)


def lag(now: datetime | None = None) -> Lag | None:
    """The relay's lag behind the event log, or None when no relay runs: with a shared
    (Redis) layer, the leader's (its persisted position, while it holds the lease); else this
    process's (it starts with the first websocket). At most three queries."""
    now = now or timezone.now()
    relay = _relay
    if relay is not None and not relay.shared and _task is not None and not _task.done():
        position, where = relay.position, "process"
    else:
        if not Lease.objects.filter(name="relay", expires_at__gt=now).exists():
            return None
        position = Cursor.objects.filter(name="relay").values_list("position", flat=True).first()
        where = "shared"
    if position is None:  # started, and not at its first step yet
        return None
    head = last_seq()
    if head <= position:
        return Lag(0, 0.0, where)
    oldest = Event.objects.filter(seq__gt=position).order_by("seq").values_list("created_at")
    first = oldest.first()
    seconds = max((now - first[0]).total_seconds(), 0.0) if first else 0.0
    return Lag(head - position, seconds, where)
