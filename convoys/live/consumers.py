"""The live websocket: subscribe to topics, replay from a sequence number, then live events.

Query string: `topics=dashboard,convoy:<id>,bead:<id>,inbox` and `since=<seq>` (the sequence
number the page was drawn at, or the last one it applied). convoyweb.asgi lets in only
same-origin, authenticated users (convoys.live.wsgate); convoy, bead and dashboard topics need the
`view_convoy` permission, the inbox carries only the user's own notices.

Revocation: each socket joins its user's account group (convoys.live.revocation) before it reads
its rights, and checks its session and rights afresh on every message sent there, before each
replay and every CONVOY_WS_RECHECK seconds: a session that no longer signs its user in closes
the socket with 4401; a topic the user may no longer see is dropped (the client is told the
topics left). Topics are never added after the handshake.

Limits (settings, each told to the client in an `error` frame, then the close code): at most
CONVOY_WS_SOCKETS_PER_USER open sockets per user in this process (4409), CONVOY_WS_TOPICS
topics per socket (4413), CONVOY_WS_FRAMES_PER_S frames a second per socket in bursts of
FRAME_BURST_SECONDS' worth (4429). A ping reads no database: its sequence number is this
process's, at most HEAD_SECONDS old.

A client sends `{"type": "ack"}`, `{"type": "ping"}` or `{"type": "replay", "since": N}`;
anything else closes the socket with 4400 and one info line in the log.

Replays read the log, so they are bounded: one at a time per user in this process, client
requests at most one per REPLAY_INTERVAL per socket (earlier ones wait, merged) and
REPLAY_REQUESTS per socket, and a budget of log rows per user that refills at USER_ROWS_PER_S.
Past a bound the client is told to resync (reload the page) and the socket closes with 4429;
one user replaying from 0 on many sockets waits for itself, not the others.
Consumers never write.
"""

import asyncio
import collections
import json
import logging
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Never, TypeVar, cast
from urllib.parse import parse_qs

from autobahn.exception import Disconnected
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth.models import AbstractUser

from convoys.core.ids import group_name
from convoys.core.parsing import NotJson, json_document, whole_number
from convoys.live import relay, revocation
from convoys.live.wsgate import quick_read, session_user
from convoys.log.events import last_seq
from convoys.models import Event
from convoys.web import metrics

log = logging.getLogger("convoys.live")

T = TypeVar("T")

MAX_UNACKED = 1000
MAX_FRAME = 1024  # characters; the frames a client sends are a few dozen

REPLAY_LIMIT = 5000  # events one replay sends at most
REPLAY_SCAN = 20000  # log rows one replay reads at most
REPLAY_CHUNK = 1000
REPLAY_INTERVAL = 1.0  # seconds between a socket's replay requests
REPLAY_REQUESTS = 100  # replay requests per socket
USER_ROWS = 50000  # log rows a user's replays may read at once (their connect replays too)
USER_ROWS_PER_S = 2000  # ... refilled at this rate

# Group joins and leaves in flight at once per process: with Redis each may open a connection,
# and a reconnect storm's 1,000 at once timed out connecting to Redis.
LAYER_CALLS = 32

FRAME_BURST_SECONDS = 10.0  # a socket's unused frame allowance saves up this many seconds' worth
HEAD_SECONDS = 1.0  # a pong's sequence number is at most this old

BAD_FRAME = 4400
SIGNED_OUT = 4401
TOO_MANY_SOCKETS = 4409
TOO_MANY_TOPICS = 4413
STALLED = 4008
TOO_MANY_REPLAYS = TOO_MANY_FRAMES = 4429


def read_db(func: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """Run a long read-only query (a replay) off the event loop, in the default thread pool
    rather than the one database thread (each thread has its own connection, closed after)."""
    wrapped: Callable[..., Awaitable[T]] = database_sync_to_async(func, thread_sensitive=False)
    return wrapped


def _topic_groups(user: AbstractUser, topics: Sequence[str]) -> dict[str, str]:
    """{topic: channel group} for the topics this user may follow (names from
    ids.group_name): the inbox is the user's own; every other topic needs the `view_convoy`
    permission."""
    groups = {}
    may_view = user.has_perm("convoys.view_convoy")
    for topic in topics:
        name, _, arg = topic.partition(":")
        if name == "inbox":
            groups[topic] = group_name("user", user.pk)
        elif not may_view:
            continue
        elif name == "dashboard":
            groups[topic] = relay.DASHBOARD
        elif name in ("convoy", "bead") and arg:
            groups[topic] = group_name(name, arg)
    return groups


def _replay(since: int, groups: Sequence[str]) -> tuple[list[dict[str, Any]] | None, int]:
    """(events after `since` for these groups, log rows read). The events are None when the
    client should reload instead: the log no longer reaches back, or the gap is longer than
    REPLAY_SCAN rows, or holds more than REPLAY_LIMIT events it shows."""
    oldest = Event.objects.order_by("seq").values_list("seq", flat=True).first()
    if oldest is not None and since + 1 < oldest:
        return None, 1
    wanted = set(groups)
    out = []
    read = 0
    position = since
    while read < REPLAY_SCAN:
        chunk = list(Event.objects.filter(seq__gt=position).order_by("seq")[:REPLAY_CHUNK])
        read += len(chunk)
        for event in chunk:
            data = relay.serialize(event)
            if wanted.intersection(relay.groups_for(data)):
                out.append(data)
        if len(out) > REPLAY_LIMIT:
            return None, read
        if len(chunk) < REPLAY_CHUNK:
            return out, read
        position = chunk[-1].seq
    return None, read


def _access(
    session_key: str | None, user_pk: object, topics: Sequence[str]
) -> dict[str, str] | None:
    """The socket's {topic: group} as of now, or None when its session no longer signs this
    user in (logged out, password changed, deactivated, deleted)."""
    user = session_user(session_key)
    if user is None or user.pk != user_pk:
        return None
    return _topic_groups(cast("AbstractUser", user), topics)


def _access_and_head(
    session_key: str | None, user_pk: object, topics: Sequence[str]
) -> tuple[dict[str, str] | None, int]:
    return _access(session_key, user_pk, topics), last_seq()


class UserReplays:
    """One user's replays in this process: one at a time, within a budget of log rows."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.rows: float = USER_ROWS
        self.refilled = time.monotonic()

    def may_read(self) -> bool:
        now = time.monotonic()
        self.rows = min(USER_ROWS, self.rows + (now - self.refilled) * USER_ROWS_PER_S)
        self.refilled = now
        return self.rows > 0


# event loop -> this process's shared limits
_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = (
    weakref.WeakKeyDictionary()
)


def _limits() -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    if loop not in _per_loop:
        _per_loop[loop] = {
            "layer": asyncio.Semaphore(LAYER_CALLS),
            "users": {},
            "sockets": collections.Counter(),  # user pk -> open sockets
            "head": (float("-inf"), None),  # (when read, the read)
        }
    return _per_loop[loop]


async def recent_head() -> int:
    """The log's last sequence number, read at most once per HEAD_SECONDS in this process
    whatever the number of pings."""
    limits = _limits()
    read_at, head = limits["head"]
    now = time.monotonic()
    if head is None or now - read_at >= HEAD_SECONDS:
        head = asyncio.ensure_future(quick_read(last_seq))
        limits["head"] = (now, head)
    result: int = await asyncio.shield(head)
    return result


def user_replays(pk: int) -> UserReplays:
    users: dict[int, UserReplays] = _limits()["users"]
    if pk not in users:
        users[pk] = UserReplays()
    return users[pk]


class BadFrame(ValueError):
    pass


def parse_frame(text: str | None) -> dict[str, Any]:
    """The message in a client frame, or BadFrame saying what is wrong with it."""
    if text is None:
        raise BadFrame("binary frame")
    if len(text) > MAX_FRAME:
        raise BadFrame(f"frame of {len(text)} characters (at most {MAX_FRAME})")
    try:
        message = json_document(text)
    except NotJson as exc:
        raise BadFrame(str(exc)) from None
    if not isinstance(message, dict):
        raise BadFrame("not a JSON object")
    kind = message.get("type")
    if kind not in ("ack", "ping", "replay"):
        raise BadFrame(f"unknown type {str(kind)[:40]!r}")
    since = message.get("since")
    if kind == "replay" and (type(since) is not int or not 0 <= since < 2**63):
        raise BadFrame(f"replay since {str(since)[:40]!r} is not a sequence number")
    return message


class LiveConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]  # channels ships no types
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()  # before accept: the handshake is refused with 403
            return
        self.user = user
        self.closing = False
        self.counted = False
        self.session_key = self.scope["cookies"].get(settings.SESSION_COOKIE_NAME)
        self.account = revocation.account_group(user.pk)
        self.groups_joined: list[str] = []
        self.recheck_timer: asyncio.Task[None] | None = None
        rate = settings.CONVOY_WS_FRAMES_PER_S
        self.frame_allowance = self.frame_burst = max(1.0, rate * FRAME_BURST_SECONDS)
        self.frame_at = time.monotonic()
        self.replay_requests = 0
        self.last_request = float("-inf")
        self.pending_since: int | None = None
        self.replay_timer: asyncio.Task[None] | None = None
        self.sent: collections.deque[int] = collections.deque(maxlen=20000)
        self.sent_set: set[int] = set()
        self.unacked = 0
        relay.ensure_running()
        # Accept before this consumer's own reads (the session was read by wsgate): daphne
        # drops a handshake not accepted within 5 s, and after a web process restarts, 1,000
        # reconnecting pages arrive at once. Nothing is sent until the topics the user may
        # see are known.
        await self.accept()
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        requested = ",".join(query.get("topics", [""])).split(",")
        self.topics = list(dict.fromkeys(topic for topic in requested if topic))
        if len(self.topics) > settings.CONVOY_WS_TOPICS:
            limit = settings.CONVOY_WS_TOPICS
            await self.shut(TOO_MANY_TOPICS, f"{len(self.topics)} topics (at most {limit})")
            return
        sockets = _limits()["sockets"]
        if sockets[user.pk] >= settings.CONVOY_WS_SOCKETS_PER_USER:
            limit = settings.CONVOY_WS_SOCKETS_PER_USER
            await self.shut(TOO_MANY_SOCKETS, f"more than {limit} open sockets for this user")
            return
        sockets[user.pk] += 1
        self.counted = True
        metrics.WEBSOCKETS.inc()
        # Joined before the rights are read: a revocation sent after this read reaches the
        # socket, and one sent before it is in what the read sees.
        await self.join_groups()
        followed, head = await quick_read(_access_and_head, self.session_key, user.pk, self.topics)
        if followed is None:
            await self.shut(SIGNED_OUT, "the session no longer signs this user in")
            return
        self.groups_joined = sorted(set(followed.values()))
        self.followed = followed
        # Everything up to `head` is covered by the replay below (or not wanted): an event the
        # relay sent before the joins shows up as a gap at the group's next message or tick.
        self.last_in_group = dict.fromkeys(self.groups_joined, head)
        await self.join_groups()
        self.recheck_timer = asyncio.get_running_loop().create_task(self.recheck_every())
        await self.send_json({"type": "hello", "seq": head, "topics": sorted(followed)})
        since = query.get("since", [""])[0]
        number = whole_number(since)
        if number is not None:
            await self.replay_from(number, head, checked=True)

    async def replay_from(self, since: int, head: int, checked: bool = False) -> None:
        if since > head:  # drawn from another log (the database was replaced): reload
            await self.send_json({"type": "resync"})
        elif since == head:
            await self.send_json({"type": "replayed", "since": since, "seq": since})
        else:
            await self.replay(since, requested=True, checked=checked)

    async def recheck_every(self) -> None:
        """The backstop for revocations no signal saw (a session expired or deleted by hand, a
        change on another process's in-memory layer): a fresh check every CONVOY_WS_RECHECK
        seconds, spread so a process's sockets do not check all at once."""
        while True:
            await asyncio.sleep(settings.CONVOY_WS_RECHECK * random.uniform(0.8, 1.2))
            # Through this socket's own channel, so it runs in order with the live events.
            await self.channel_layer.send(self.channel_name, {"type": "convoy.recheck"})

    async def convoy_recheck(self, message: dict[str, Any]) -> None:
        if not self.closing:
            await self.recheck()

    async def convoy_revoke(self, message: dict[str, Any]) -> None:
        """Something was taken away from this user (convoys.live.revocation): check afresh; a
        logout names the session it ended, whose sockets close without a read."""
        if self.closing:
            return
        if message.get("session") == revocation.session_tag(self.session_key):
            await self.shut(SIGNED_OUT, "logged out")
        else:
            await self.recheck()

    async def recheck(self) -> bool:
        """Read the session and rights afresh: close when the session no longer signs the
        user in, leave the groups of topics the user may no longer see. False when closed."""
        followed = await quick_read(_access, self.session_key, self.user.pk, self.topics)
        if self.closing:
            return False
        if followed is None:
            await self.shut(SIGNED_OUT, "the session no longer signs this user in")
            return False
        allowed = set(followed.values())
        dropped = [group for group in self.groups_joined if group not in allowed]
        if dropped:
            self.groups_joined = [group for group in self.groups_joined if group in allowed]
            for group in dropped:
                self.last_in_group.pop(group, None)
            async with _limits()["layer"]:
                for group in dropped:
                    await self.channel_layer.group_discard(group, self.channel_name)
            joined = set(self.groups_joined)
            self.followed = {t: g for t, g in self.followed.items() if g in joined}
            await self.send_json({"type": "topics", "topics": sorted(self.followed)})
        return True

    async def websocket_disconnect(self, message: dict[str, Any]) -> Never:
        # channels' version also closes database connections on the shared database thread,
        # which this consumer never uses (its reads close their own).
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def join_groups(self) -> None:
        async with _limits()["layer"]:
            for group in [self.account, *self.groups_joined]:
                await self.channel_layer.group_add(group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        if not hasattr(self, "user"):  # refused before accept
            return
        for timer in (self.replay_timer, self.recheck_timer):
            if timer:
                timer.cancel()
        if self.counted:
            metrics.WEBSOCKETS.dec()
            sockets = _limits()["sockets"]
            sockets[self.user.pk] -= 1
            if sockets[self.user.pk] <= 0:
                del sockets[self.user.pk]
        async with _limits()["layer"]:
            for group in [self.account, *self.groups_joined]:
                await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.closing:
            return
        if not self.frame_allowed():
            rate = settings.CONVOY_WS_FRAMES_PER_S
            await self.shut(TOO_MANY_FRAMES, f"more than {rate:g} frames a second")
            return
        try:
            message = parse_frame(text_data)
        except BadFrame as exc:
            await self.shut(BAD_FRAME, str(exc))
            return
        kind = message["type"]
        if kind == "ack":
            self.unacked = 0
        elif kind == "ping":
            await self.join_groups()  # refresh memberships (Redis group expiry)
            await self.send_json({"type": "pong", "seq": await recent_head()})
        else:
            await self.request_replay(message["since"])

    def frame_allowed(self) -> bool:
        """A token bucket: CONVOY_WS_FRAMES_PER_S, saved up to FRAME_BURST_SECONDS' worth."""
        now = time.monotonic()
        rate = settings.CONVOY_WS_FRAMES_PER_S
        self.frame_allowance = min(
            self.frame_burst, self.frame_allowance + (now - self.frame_at) * rate
        )
        self.frame_at = now
        if self.frame_allowance < 1:
            return False
        self.frame_allowance -= 1
        return True

    async def request_replay(self, since: int) -> None:
        """A client's replay request: at most one per REPLAY_INTERVAL (an earlier one waits,
        merged with any other waiting) and REPLAY_REQUESTS per socket."""
        self.replay_requests += 1
        if self.replay_requests > REPLAY_REQUESTS:
            await self.resync_and_close(f"more than {REPLAY_REQUESTS} replay requests")
            return
        wait = self.last_request + REPLAY_INTERVAL - time.monotonic()
        if wait > 0:
            if self.pending_since is None:
                self.pending_since = since
                self.replay_timer = asyncio.get_running_loop().create_task(self.replay_due(wait))
            self.pending_since = min(since, self.pending_since)
            return
        await self.requested_replay(since)

    async def requested_replay(self, since: int) -> None:
        try:
            await self.replay(since, requested=True)
        finally:
            self.last_request = time.monotonic()  # the interval runs from the end of a replay

    async def replay_due(self, wait: float) -> None:
        await asyncio.sleep(wait)
        # Through this socket's own channel, so it runs in order with the live events.
        await self.channel_layer.send(self.channel_name, {"type": "convoy.replay_due"})

    async def convoy_replay_due(self, message: dict[str, Any]) -> None:
        since, self.pending_since = self.pending_since, None
        if since is not None and not self.closing:
            await self.requested_replay(since)

    async def replay(self, since: int, requested: bool = False, checked: bool = False) -> None:
        """Send the events after `since` that this socket's topics show, then `replayed`; or
        `resync`. The session and rights are checked afresh first (unless the caller just did,
        `checked`): a replay never holds more than the user may see now. A replay the client
        chose (`requested`) spends the user's row budget; one filling a gap the layer left is
        bounded by what was sent."""
        if not checked and not await self.recheck():
            return
        budget = user_replays(self.user.pk)
        async with budget.lock:
            if self.closing:
                return
            if requested and not budget.may_read():
                await self.resync_and_close("replay budget spent")
                return
            events, rows = await read_db(_replay)(since, self.groups_joined)
            if requested:
                budget.rows -= rows
        if events is None:
            await self.send_json({"type": "resync"})
            return
        for event in events:
            await self.deliver(event, replayed=True)
        await self.send_json(
            {"type": "replayed", "since": since, "seq": events[-1]["seq"] if events else since}
        )

    async def resync_and_close(self, reason: str) -> None:
        await self.send_json({"type": "resync"})
        await self.shut(TOO_MANY_REPLAYS, reason)

    async def shut(self, code: int, reason: str) -> None:
        """Close with `code`, telling the client why in an `error` frame first (daphne sends no
        close reason)."""
        log.info("live socket of %s closed %s: %s", self.user.get_username(), code, reason)
        await self.send_json({"type": "error", "code": code, "error": reason})
        await self.close(code=code, reason=reason)

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        self.closing = True
        await super().close(code, reason)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # channels closes stale database connections on the one shared database thread before
        # every handler: a thread hop per message per socket (most of daphne's time at 1,000
        # sockets), and a queue a reconnect storm's handshakes would wait in. This consumer
        # reads only in threads of its own (read_db, quick_read).
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def convoy_event(self, message: dict[str, Any]) -> None:
        event, group, prev = message["event"], message["group"], message.get("prev")
        seen = self.last_in_group.get(group)
        if prev is not None and seen is not None and prev > seen:
            await self.replay(seen)  # the layer dropped something: fill the gap from the log
        self.last_in_group[group] = max(seen or 0, event["seq"])
        await self.deliver(event, message.get("text"))

    async def convoy_tick(self, message: dict[str, Any]) -> None:
        seen = self.last_in_group.get(message["group"])
        if seen is not None and message["seq"] > seen:
            await self.replay(seen)

    async def deliver(
        self, event: dict[str, Any], text: str | None = None, replayed: bool = False
    ) -> None:
        """Send one event unless already sent. Live events count towards the stall limit; a
        replay is a bounded burst the client is waiting for."""
        seq = event["seq"]
        if self.closing or seq in self.sent_set:
            return
        if len(self.sent) == self.sent.maxlen:
            self.sent_set.discard(self.sent[0])
        self.sent.append(seq)
        self.sent_set.add(seq)
        for group in relay.groups_for(event):
            if group in self.last_in_group:
                self.last_in_group[group] = max(self.last_in_group[group], seq)
        self.unacked += not replayed
        if self.unacked > MAX_UNACKED:
            # A reader this far behind is stalled: drop it; it reconnects and replays.
            await self.close(code=STALLED)
            return
        if text is None:
            text = json.dumps({"type": "event", **event}, ensure_ascii=False)
        await self.send(text_data=text)

    async def send(
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None:
        try:
            await super().send(text_data, bytes_data, close)
        except Disconnected:
            # The client left while its handshake or a replay was still being served (daphne
            # has not told this consumer yet): stop sending. Left to daphne, each one was an
            # error with a formatted traceback, a tenth of a reconnect storm's CPU time.
            self.closing = True

    async def send_json(self, data: dict[str, Any]) -> None:
        if not self.closing:
            await self.send(text_data=json.dumps(data, ensure_ascii=False))
