"""Hostile ids, frames and clients on the live websocket: nothing one of them sends or names
stops the others' live updates or sees past its rights."""

import asyncio
import collections
import itertools
import json
import logging
import threading
import time
from urllib.parse import quote

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, Permission
from django.db import transaction

from convoys.core.ids import group_name
from convoys.live import consumers, relay
from convoys.log import events
from convoys.services import convoys

from .support.factories import bead
from .support.live import communicator, events_of, has, receive_until, sentinel
from .support.users import session_cookie, user_with, viewer

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE_IDS = ["cm2-$(id)", "gt-" + "ü名 :<>$" * 25]  # the second is 203 characters


def record(kind, bead_id):
    with transaction.atomic():
        return events.record(kind, bead_id=bead_id, actor="test").seq


def test_group_names_are_layer_safe_for_any_id():
    for key in [*HOSTILE_IDS, "x" * 5000, "\ud800", 7, ""]:
        name = group_name("bead", key)
        assert name.isascii() and len(name) < 100, name
        assert name.replace(".", "").isalnum()
    assert group_name("bead", "a") != group_name("convoy", "a")
    assert group_name("user", 7) == group_name("user", "7")


def test_hostile_bead_ids_do_not_stop_live_updates(routes, caplog):
    bead("gt-a")
    cookie = session_cookie(viewer("alice"))

    async def go():
        other = communicator("/ws/live/?topics=bead:gt-a", cookie)
        named = communicator(f"/ws/live/?topics={quote('bead:' + HOSTILE_IDS[1])}", cookie)
        assert (await other.connect())[0] and (await named.connect())[0]
        assert (await other.receive_json_from())["topics"] == ["bead:gt-a"]
        assert (await named.receive_json_from())["topics"] == ["bead:" + HOSTILE_IDS[1]]
        hostile = [await sync_to_async(record)("bead.updated", i) for i in HOSTILE_IDS]
        after = await sync_to_async(record)("bead.updated", "gt-a")
        last = await sync_to_async(record)("bead.updated", HOSTILE_IDS[1])  # after `after`
        got = events_of(await receive_until(other, has("event", after)))
        assert [e["seq"] for e in got] == [after]
        got = events_of(await receive_until(named, has("event", last)))
        assert [e["seq"] for e in got] == [hostile[1], last]
        await other.disconnect()
        await named.disconnect()

    with caplog.at_level(logging.INFO, logger="convoys.live.relay"):
        async_to_sync(go)()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_message_the_layer_refuses_is_logged_once_and_skipped(routes, caplog, monkeypatch):
    bead("gt-a")
    bead("gt-b")
    cookie = session_cookie(viewer("alice"))
    layer = get_channel_layer()
    group_send = layer.group_send
    refused = group_name("bead", "gt-b")

    async def picky_group_send(group, message):
        if group == refused and message["type"] == "convoy.event":
            raise ValueError("message too large")
        await group_send(group, message)

    monkeypatch.setattr(layer, "group_send", picky_group_send)

    async def go():
        comm = communicator("/ws/live/?topics=bead:gt-a", cookie)
        assert (await comm.connect())[0]
        await receive_until(comm, has("hello"))
        await sync_to_async(record)("bead.updated", "gt-b")
        first = await sync_to_async(record)("bead.updated", "gt-a")
        second = await sync_to_async(record)("bead.updated", "gt-a")
        got = events_of(await receive_until(comm, has("event", second)))
        assert [e["seq"] for e in got] == [first, second]
        await comm.disconnect()

    with caplog.at_level(logging.INFO, logger="convoys.live.relay"):
        async_to_sync(go)()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and refused in errors[0], errors


def handshake(host, origin, cookie, **headers):
    """Whether the live socket accepts a handshake to `host` from a page at `origin`."""
    from convoyweb.asgi import application

    sent = [(b"host", host.encode())]
    if origin is not None:
        sent.append((b"origin", origin.encode()))
    sent += [(name.encode(), value.encode()) for name, value in headers.items()]
    sent.append((b"cookie", cookie))

    async def go():
        comm = WebsocketCommunicator(application, "/ws/live/?topics=dashboard", headers=sent)
        connected, _ = await comm.connect()
        await comm.disconnect()
        return connected

    return async_to_sync(go)()


def test_origin_must_match_scheme_host_and_port(routes, settings):
    cookie = session_cookie(viewer("alice"))
    settings.ALLOWED_HOSTS = ["localhost", "convoy.example.com"]
    settings.CSRF_TRUSTED_ORIGINS = ["http://localhost:9000", "https://*.example.org"]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    proxied = {"x-forwarded-proto": "https"}
    cases = [
        ("localhost", "http://localhost", {}, True),
        ("localhost:8000", "http://localhost:8000", {}, True),
        ("localhost:8000", "http://localhost:8823", {}, False),  # another port, same host
        ("localhost:8000", "http://localhost", {}, False),
        ("localhost:8000", "https://localhost:8000", {}, False),  # another scheme
        ("localhost:8000", "http://evil.example", {}, False),
        ("localhost:8000", "http://localhost.evil.example:8000", {}, False),
        ("localhost:8000", "null", {}, False),
        ("localhost:8000", None, {}, False),
        ("evil.example", "http://evil.example", {}, False),  # a Host ALLOWED_HOSTS refuses
        ("convoy.example.com", "https://convoy.example.com", proxied, True),
        ("convoy.example.com", "http://convoy.example.com", proxied, False),
        ("convoy.example.com", "https://convoy.example.com", {}, False),
        ("localhost:8000", "http://localhost:9000", {}, True),  # CSRF_TRUSTED_ORIGINS
        ("localhost:8000", "http://localhost:9001", {}, False),
        ("localhost:8000", "https://app.example.org", {}, True),
        ("localhost:8000", "http://app.example.org", {}, False),
        ("localhost:8000", "https://app.example.org:8443", {}, False),
    ]
    got = [
        (host, origin, handshake(host, origin, cookie, **extra)) for host, origin, extra, _ in cases
    ]
    assert got == [(host, origin, ok) for host, origin, _, ok in cases]


BAD_FRAMES = [
    "not json",
    "[1, 2]",
    '"ack"',
    "{}",
    '{"type": "subscribe", "topics": "convoy:x"}',
    '{"type": "replay"}',
    '{"type": "replay", "since": "0"}',
    '{"type": "replay", "since": -1}',
    '{"type": "replay", "since": true}',
    '{"type": "replay", "since": 1.5}',
    '{"type": "replay", "since": ' + "9" * 30 + "}",
    '{"type": "ping", "pad": "' + "x" * 2000 + '"}',
]


@pytest.mark.slow
def test_malformed_and_unknown_frames_close_with_4400_and_one_info_line(routes, caplog):
    user = viewer("alice")
    cookie = session_cookie(user)

    async def close_code(frame):
        comm = communicator("/ws/live/?topics=dashboard", cookie)
        assert (await comm.connect())[0]
        await comm.receive_json_from()  # hello
        if isinstance(frame, bytes):
            await comm.send_to(bytes_data=frame)
        else:
            await comm.send_to(text_data=frame)
        while True:
            output = await comm.receive_output(timeout=5)
            if output["type"] == "websocket.close":
                await comm.wait()
                return output.get("code")

    async def go():
        return [await close_code(frame) for frame in [*BAD_FRAMES, b"\x00\x01"]]

    with caplog.at_level(logging.DEBUG):
        codes = async_to_sync(go)()
    assert codes == [4400] * (len(BAD_FRAMES) + 1)
    lines = [r for r in caplog.records if r.name == "convoys.live"]
    assert len(lines) == len(BAD_FRAMES) + 1
    assert {r.levelno for r in lines} == {logging.INFO}
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in lines)
    assert all(r.getMessage().startswith("live socket of alice closed 4400: ") for r in lines)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def many_events(count, bead_id):
    with transaction.atomic():
        items = [dict(kind="bead.updated", bead_id=bead_id, actor="test")] * count
        events.record_many(items, instances=False)
    return events.last_seq()


async def drain(comm, until=None, timeout=60):
    """The types of the messages a socket gets until the server closes it (and the close
    code), or until one of type `until` arrives (and None)."""
    kinds = []
    while not kinds or kinds[-1] != until:
        output = await comm.receive_output(timeout=timeout)
        if output["type"] == "websocket.close":
            return kinds, output.get("code")
        kinds.append(json.loads(output["text"])["type"])
    return kinds, None


@pytest.mark.slow
def test_replay_flood_is_throttled_while_others_stay_live(routes, monkeypatch, settings):
    """Ten sockets of one user each ask for the whole log 150 times: that user's replays run
    one at a time, each socket's at least REPLAY_INTERVAL apart, and every socket is told to
    resync and closed; meanwhile another user's page gets its live event. (The frame rate
    limit, which would close them first, is raised: this is about the replays.)"""
    settings.CONVOY_WS_FRAMES_PER_S = 1000
    bead("gt-a")
    many_events(1500, "gt-b")
    mallory, alice = session_cookie(viewer("mallory")), session_cookie(viewer("alice"))
    starts = collections.defaultdict(list)  # a socket's groups -> when its replays started
    running, peak, guard = [0], [0], threading.Lock()

    def tracked(since, groups):
        hostile = relay.DASHBOARD in groups
        with guard:
            starts[tuple(groups)].append(time.monotonic())
            running[0] += hostile
            peak[0] = max(peak[0], running[0])
        try:
            return replay(since, groups)
        finally:
            with guard:
                running[0] -= hostile

    replay = consumers._replay
    monkeypatch.setattr(consumers, "_replay", tracked)

    async def go():
        honest = communicator("/ws/live/?topics=bead:gt-a", alice)
        assert (await honest.connect())[0]
        await honest.receive_json_from()
        hostile = [
            communicator(f"/ws/live/?topics=dashboard,bead:h{i}", mallory) for i in range(10)
        ]
        for comm in hostile:
            assert (await comm.connect())[0]
            await comm.receive_json_from()
        for comm in hostile:
            for _ in range(150):
                await comm.send_to(text_data='{"type": "replay", "since": 0}')
        seq = await sync_to_async(record)("bead.updated", "gt-a")
        got = []
        while seq not in got:
            got.append((await honest.receive_json_from(timeout=30)).get("seq"))
        outcomes = [await drain(comm) for comm in hostile]
        await honest.disconnect()
        return outcomes

    outcomes = async_to_sync(go)()
    for kinds, code in outcomes:
        assert code == 4429 and kinds[-2:] == ["resync", "error"]
    assert peak[0] == 1
    assert len(starts) == 10
    for times in starts.values():
        assert all(b - a >= consumers.REPLAY_INTERVAL for a, b in itertools.pairwise(times))


def test_a_users_replay_budget_runs_out_then_they_resync(routes, monkeypatch):
    """Reconnecting with since=0 over and over spends the user's budget of log rows; then
    the socket is told to resync and closed. Another user's replay is still served."""
    monkeypatch.setattr(consumers, "USER_ROWS", 10000)
    monkeypatch.setattr(consumers, "USER_ROWS_PER_S", 0)
    many_events(3000, "gt-b")
    mallory, alice = session_cookie(viewer("mallory")), session_cookie(viewer("alice"))

    async def connect_since_0(cookie):
        comm = communicator("/ws/live/?topics=bead:gt-elsewhere&since=0", cookie)
        assert (await comm.connect())[0]
        kinds, code = await drain(comm, until="replayed")
        await comm.disconnect()
        return kinds, code

    async def go():
        served = [await connect_since_0(mallory) for _ in range(5)]
        return served, await connect_since_0(alice)

    served, other = async_to_sync(go)()
    assert served[:4] == [(["hello", "replayed"], None)] * 4  # 4 x 3,000 rows: 10,000 spent
    assert served[4] == (["hello", "resync", "error"], 4429)
    assert other == (["hello", "replayed"], None)


def test_a_long_log_is_no_reason_to_resync(routes):
    """With more than REPLAY_LIMIT events in the log, and after a page's as_of, a page
    replays exactly what it shows after its as_of; only a position the log never had
    asks for a reload."""
    bead("gt-a")
    bead("gt-b")
    convoy = convoys.create("A", ["gt-a"])
    many_events(consumers.REPLAY_LIMIT + 1000, "gt-b")
    as_of = events.last_seq()
    mine = [record("bead.updated", "gt-a")]
    many_events(consumers.REPLAY_LIMIT + 1000, "gt-b")
    mine.append(record("bead.updated", "gt-a"))
    head = events.last_seq()
    cookie = session_cookie(viewer("alice"))

    async def page(topics, since):
        comm = communicator(f"/ws/live/?topics={topics}&since={since}", cookie)
        assert (await comm.connect())[0]
        messages = [await comm.receive_json_from()]
        while messages[-1]["type"] not in ("replayed", "resync"):
            messages.append(await comm.receive_json_from(timeout=30))
        await comm.disconnect()
        return [m["type"] for m in messages], [m["seq"] for m in events_of(messages)]

    async def go():
        return [
            await page(f"convoy:{convoy.pk}", as_of),
            await page(f"bead:gt-a,convoy:{convoy.pk}", 0),
            await page("dashboard", head - 3),
            await page("dashboard", head),
            await page("dashboard", head + 1),
        ]

    convoy_page, from_zero, dashboard, current, ahead = async_to_sync(go)()
    assert convoy_page == (["hello", "event", "event", "replayed"], mine)
    assert "resync" not in from_zero[0] and from_zero[1][-2:] == mine
    assert dashboard == (
        ["hello", "event", "event", "event", "replayed"],
        [head - 2, head - 1, head],
    )
    assert current == (["hello", "replayed"], [])
    assert ahead == (["hello", "resync"], [])


def test_live_topics_need_the_view_permission(routes):
    """A user without `view_convoy` follows only the inbox: no dashboard, convoy or bead event
    live or replayed; the permission through a group is enough."""
    bead("gt-a")
    convoy = convoys.create("A", ["gt-a"])
    viewers = Group.objects.create(name="viewers")
    viewers.permissions.add(Permission.objects.get(codename="view_convoy"))
    vera = user_with("vera")
    vera.groups.add(viewers)
    users = {"none": user_with("nobody"), "group": vera}
    topics = f"dashboard,convoy:{convoy.pk},bead:gt-a,inbox"

    cookies = {who: session_cookie(user) for who, user in users.items()}

    async def follow(who):
        user = users[who]
        comm = communicator(f"/ws/live/?topics={topics}&since=0", cookies[who])
        assert (await comm.connect())[0]
        messages = await receive_until(comm, has("replayed"))
        await sync_to_async(record)("bead.updated", "gt-a")
        last = await sync_to_async(sentinel)(user)  # what came before it is all that comes
        messages += await receive_until(comm, has("event", last))
        await comm.disconnect()
        return messages[0]["topics"], len(events_of(messages)) - 1

    async def go():
        return await follow("none"), await follow("group")

    nobody, group = async_to_sync(go)()
    assert nobody == (["inbox"], 0)
    assert group[0] == sorted(topics.split(",")) and group[1] > 1


def test_a_browsers_handshakes_share_one_lookup_and_a_logout_refuses_the_next(routes, monkeypatch):
    """Ten handshakes of one session at once share the lookups under way (a reconnect storm's
    pages of one browser); nothing is remembered after: once the session is gone, the very
    next handshake is refused."""
    from django.contrib.sessions.models import Session

    from convoys.live import wsgate

    cookie = session_cookie(viewer("alice"))
    lookups = []

    def counted_session_user(key):
        lookups.append(key)
        return session_user(key)

    session_user = wsgate.session_user
    monkeypatch.setattr(wsgate, "session_user", counted_session_user)

    async def connected():
        comm = communicator("/ws/live/?topics=dashboard", cookie)
        ok, _ = await comm.connect()
        await comm.disconnect()
        return ok

    async def go():
        together = await asyncio.gather(*[connected() for _ in range(10)])
        read = len(lookups)
        again = await connected()
        await sync_to_async(Session.objects.all().delete)()  # logged out everywhere
        return together, read, again, await connected(), len(lookups) - read

    together, read, again, after_logout, later_reads = async_to_sync(go)()
    assert together == [True] * 10 and read < 10
    assert again is True and after_logout is False and later_reads == 2


async def close_of(comm, timeout=10):
    """The types of the messages a socket gets until the server closes it, the last error
    frame, and the close code."""
    kinds, error = [], None
    while True:
        output = await comm.receive_output(timeout=timeout)
        if output["type"] == "websocket.close":
            return kinds, error, output.get("code")
        message = json.loads(output["text"])
        kinds.append(message["type"])
        if message["type"] == "error":
            error = message["error"]


def test_one_users_sockets_are_limited_and_others_are_not(routes, settings):
    """400 sockets of one session, scaled down: past CONVOY_WS_SOCKETS_PER_USER each new one
    is told why and closed with 4409; another user still connects, and a closed socket frees
    its place."""
    settings.CONVOY_WS_SOCKETS_PER_USER = 5
    mallory, alice = session_cookie(viewer("mallory")), session_cookie(viewer("alice"))

    async def go():
        accepted, refused = [], []
        for _ in range(8):
            comm = communicator("/ws/live/?topics=dashboard", mallory)
            assert (await comm.connect())[0]
            first = json.loads((await comm.receive_output(timeout=10))["text"])
            if first["type"] == "hello":
                accepted.append(comm)
            else:
                refused.append((first, (await comm.receive_output(timeout=10)).get("code")))
        other = communicator("/ws/live/?topics=dashboard", alice)
        assert (await other.connect())[0]
        others_first = (await other.receive_json_from())["type"]
        await accepted.pop().disconnect()
        again = communicator("/ws/live/?topics=dashboard", mallory)
        assert (await again.connect())[0]
        agains_first = (await again.receive_json_from())["type"]
        for comm in [*accepted, other, again]:
            await comm.disconnect()
        return len(accepted) + 1, refused, others_first, agains_first

    accepted, refused, others_first, agains_first = async_to_sync(go)()
    assert accepted == 5 and len(refused) == 3
    for error, code in refused:
        assert (
            code == 4409
            and error["type"] == "error"
            and "more than 5 open sockets" in error["error"]
        )
    assert others_first == "hello" and agains_first == "hello"


def test_too_many_topics_close_with_4413(routes, settings):
    """100 topics on one socket: told and closed with 4413; the limit itself (duplicates
    counted once) still connects."""
    settings.CONVOY_WS_TOPICS = 20
    cookie = session_cookie(viewer("mallory"))
    at_limit = ",".join([f"bead:gt-{i}" for i in range(20)] * 3)
    too_many = ",".join(f"bead:gt-{i}" for i in range(100))

    async def go():
        fits = communicator(f"/ws/live/?topics={at_limit}", cookie)
        assert (await fits.connect())[0]
        hello = await fits.receive_json_from()
        await fits.disconnect()
        over = communicator(f"/ws/live/?topics={too_many}", cookie)
        assert (await over.connect())[0]
        return hello, await close_of(over)

    hello, (kinds, error, code) = async_to_sync(go)()
    assert hello["type"] == "hello" and len(hello["topics"]) == 20
    assert (kinds, error, code) == (["error"], "100 topics (at most 20)", 4413)


def test_a_ping_flood_is_cut_off_without_a_read_per_ping(routes, settings, monkeypatch):
    """130,000 pings in 15 s, scaled down: past the socket's burst of
    CONVOY_WS_FRAMES_PER_S x FRAME_BURST_SECONDS frames it is told and closed with 4429; the
    pongs it got read the log's head once between them (one process-wide read per
    HEAD_SECONDS, here longer than the test)."""
    settings.CONVOY_WS_FRAMES_PER_S = 2  # a burst of 20 frames
    monkeypatch.setattr(consumers, "HEAD_SECONDS", 3600)
    reads = []

    def counted_last_seq():
        reads.append(1)
        return events.last_seq()

    monkeypatch.setattr(consumers, "last_seq", counted_last_seq)
    cookie = session_cookie(viewer("mallory"))

    async def go():
        comm = communicator("/ws/live/?topics=dashboard", cookie)
        assert (await comm.connect())[0]
        assert (await comm.receive_json_from())["type"] == "hello"
        connect_reads = len(reads)
        for _ in range(1300):
            await comm.send_to(text_data='{"type": "ping"}')
        return connect_reads, await close_of(comm)

    connect_reads, (kinds, error, code) = async_to_sync(go)()
    assert code == 4429 and error == "more than 2 frames a second"
    assert kinds[-1] == "error" and 20 <= kinds.count("pong") < 1300
    assert len(reads) - connect_reads == 1


def test_the_relay_stops_when_cancelled_even_if_a_step_swallows_the_cancel(settings):
    """A cancel that lands in a step which does not pass it on (as a sync_to_async call may)
    must still end the relay: the event loop's shutdown waits on it."""
    settings.CONVOY_RELAY_INTERVAL = 0.01

    class Swallowing(relay.Relay):
        async def step(self):
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                pass  # swallowed

        async def tick(self, now):
            return None

    async def go():
        task = asyncio.get_running_loop().create_task(Swallowing(shared=False).run())
        await asyncio.sleep(0.03)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2)
        return task in done

    loop = asyncio.new_event_loop()  # not asyncio.run: its shutdown would wait on the task
    try:
        ended = loop.run_until_complete(go())
    finally:
        loop.close()
    assert ended, "the relay went on after it was cancelled"
