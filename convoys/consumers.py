"""The live websocket: subscribe to topics, replay from a sequence number, then live events.

Query string: `topics=dashboard,convoy:<id>,bead:<id>,inbox` and `since=<seq>`.
Only authenticated users connect (Origin is checked by AllowedHostsOriginValidator); convoy
topics need the `view_convoy` permission, the inbox carries only the user's own notices.
Consumers never write.
"""

import collections
import json
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from . import relay
from .models import Event

MAX_UNACKED = 1000


def read_db(func):
    """Run a read-only query off the event loop, in the thread pool rather than the one
    database thread, so a reconnect storm's reads run side by side (each thread has its own
    connection; on PostgreSQL from the pool)."""
    return database_sync_to_async(func, thread_sensitive=False)


REPLAY_LIMIT = 5000


MAX_TOPICS = 100


def _topic_groups(user, topics):
    """{topic: channel group} for the topics this user may follow (names from
    relay.group_name): the inbox is the user's own; every other topic needs the `view_convoy`
    permission."""
    groups = {}
    may_view = user.has_perm("convoys.view_convoy")
    for topic in topics[:MAX_TOPICS]:
        name, _, arg = topic.partition(":")
        if name == "inbox":
            groups[topic] = relay.group_name("user", user.pk)
        elif not may_view:
            continue
        elif name == "dashboard":
            groups[topic] = relay.DASHBOARD
        elif name in ("convoy", "bead") and arg:
            groups[topic] = relay.group_name(name, arg)
    return groups


def _replay(since, groups):
    """Events after `since` for these groups; None when the log no longer reaches back."""
    oldest = Event.objects.order_by("seq").values_list("seq", flat=True).first()
    if oldest is not None and since + 1 < oldest:
        return None
    wanted = set(groups)
    out = []
    for event in Event.objects.filter(seq__gt=since).order_by("seq")[: REPLAY_LIMIT * 4]:
        data = relay.serialize(event)
        if wanted.intersection(relay.groups_for(data)):
            out.append(data)
            if len(out) >= REPLAY_LIMIT:
                return None
    return out


def _groups_and_head(user, topics):
    return _topic_groups(user, topics), _last()


def _last():
    from .events import last_seq

    return last_seq()


class LiveConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()  # before accept: the handshake is refused with 403
            return
        relay.ensure_running()
        # Accept before any database work: daphne drops a handshake not accepted within 5 s,
        # and after a web process restarts, 1,000 reconnecting pages arrive at once. Nothing
        # is sent until the topics the user may see are known.
        await self.accept()
        query = parse_qs(self.scope.get("query_string", b"").decode())
        topics = ",".join(query.get("topics", [""])).split(",")
        followed, head = await read_db(_groups_and_head)(user, topics)
        self.groups_joined = sorted(set(followed.values()))
        self.sent = collections.deque(maxlen=20000)
        self.sent_set = set()
        self.last_in_group = {}
        self.unacked = 0
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        try:
            since = int(query.get("since", ["-1"])[0])
        except ValueError:
            since = -1
        await self.send_json({"type": "hello", "seq": head, "topics": sorted(followed)})
        if since >= 0:
            await self.replay(since)

    async def disconnect(self, code):
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        try:
            message = json.loads(text_data or "{}")
        except ValueError:
            return
        kind = message.get("type")
        if kind == "ack":
            self.unacked = 0
        elif kind == "replay":
            await self.replay(int(message.get("since", 0)))
        elif kind == "ping":
            for group in self.groups_joined:  # refresh memberships (Redis group expiry)
                await self.channel_layer.group_add(group, self.channel_name)
            await self.send_json({"type": "pong", "seq": await read_db(_last)()})

    async def replay(self, since):
        events = await read_db(_replay)(since, self.groups_joined)
        if events is None:
            await self.send_json({"type": "resync"})
            return
        for event in events:
            await self.deliver(event)
        await self.send_json(
            {"type": "replayed", "since": since, "seq": events[-1]["seq"] if events else since}
        )

    async def dispatch(self, message):
        # channels runs close_old_connections in a worker thread before every handler: a
        # thread hop per message per socket, most of daphne's time at 1,000 sockets. Live
        # events touch the database only to replay, and database_sync_to_async (which replay
        # uses) closes old connections itself.
        if message["type"] == "convoy.event":
            await self.convoy_event(message)
        elif message["type"] == "convoy.tick":
            await self.convoy_tick(message)
        else:
            await super().dispatch(message)

    async def convoy_event(self, message):
        event, group, prev = message["event"], message["group"], message.get("prev")
        seen = self.last_in_group.get(group)
        if prev is not None and seen is not None and prev > seen:
            await self.replay(seen)  # the layer dropped something: fill the gap from the log
        self.last_in_group[group] = max(seen or 0, event["seq"])
        await self.deliver(event, message.get("text"))

    async def convoy_tick(self, message):
        seen = self.last_in_group.get(message["group"])
        if seen is not None and message["seq"] > seen:
            await self.replay(seen)

    async def deliver(self, event, text=None):
        seq = event["seq"]
        if seq in self.sent_set:
            return
        if len(self.sent) == self.sent.maxlen:
            self.sent_set.discard(self.sent[0])
        self.sent.append(seq)
        self.sent_set.add(seq)
        for group in relay.groups_for(event):
            if group in self.last_in_group:
                self.last_in_group[group] = max(self.last_in_group[group], seq)
        self.unacked += 1
        if self.unacked > MAX_UNACKED:
            # A reader this far behind is stalled: drop it; it reconnects and replays.
            await self.close(code=4008)
            return
        if text is None:
            text = json.dumps({"type": "event", **event}, ensure_ascii=False)
        await self.send(text_data=text)

    async def send_json(self, data):
        await self.send(text_data=json.dumps(data, ensure_ascii=False))
