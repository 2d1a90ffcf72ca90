"""The websocket: authentication, Origin, topic filtering, replay, gaps and duplicates."""

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission, User
from django.db import transaction
from django.test import Client

from convoys.core.ids import group_name
from convoys.log import events
from convoys.log.events import last_seq
from convoys.models import Event
from convoys.services import beads, convoys

from .factories import bead

pytestmark = pytest.mark.django_db(transaction=True)


def session_cookie(user):
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def make_user(name, view=True):
    user = User.objects.create_user(name, password="pw-pw-pw-123")
    if view:
        user.user_permissions.add(*Permission.objects.filter(codename__in=["view_convoy"]))
    return user


def communicator(path, cookie=None, origin=b"http://localhost"):
    from convoyweb.asgi import application

    headers = [(b"host", b"localhost")]
    if origin:
        headers.append((b"origin", origin))
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, path, headers=headers)


async def receive_until(comm, done, timeout=20):
    """The messages the server sends until `done(messages)` holds; fails when nothing comes
    for `timeout` seconds before that."""
    out = []
    while not done(out):
        try:
            out.append(await comm.receive_json_from(timeout=timeout))
        except TimeoutError:
            raise AssertionError(f"nothing for {timeout} s; received so far: {out}") from None
    return out


def has(kind, seq=None):
    """done() for receive_until: a message of type `kind` (with sequence number `seq`) came."""
    return lambda messages: any(
        m.get("type") == kind and (seq is None or m.get("seq") == seq) for m in messages
    )


def sentinel(user):
    """An inbox event for `user` alone, recorded now: events reach a socket in sequence order,
    so once it has arrived, every earlier event the socket would get has arrived before it.
    Checks that something is *not* sent wait for it instead of for a quiet spell."""
    with transaction.atomic():
        return events.record("notification", data={"user_id": user.pk, "subject": "sentinel"}).seq


def events_of(messages):
    return [m for m in messages if m.get("type") == "event"]


@pytest.fixture
def two_convoys(routes):
    bead("gt-a")
    bead("gt-b")
    a = convoys.create("A", ["gt-a"])
    b = convoys.create("B", ["gt-b"])
    return a.pk, b.pk


def test_anonymous_and_foreign_origin_are_refused(two_convoys):
    user = make_user("alice")

    async def go():
        comm = communicator("/ws/live/?topics=dashboard")
        connected, code = await comm.connect()
        assert not connected
        comm = communicator(
            "/ws/live/?topics=dashboard", session_cookie_async, b"https://evil.example"
        )
        connected, _ = await comm.connect()
        assert not connected
        comm = communicator("/ws/live/?topics=dashboard", session_cookie_async, origin=None)
        connected, _ = await comm.connect()
        assert not connected

    session_cookie_async = session_cookie(user)
    async_to_sync(go)()


def test_no_event_leaks_to_a_user_without_access_even_on_replay(two_convoys):
    mallory = make_user("mallory", view=False)
    cookie = session_cookie(mallory)
    a, _ = two_convoys
    assert Event.objects.filter(convoy_id=a).exists()  # there is something to leak

    async def go():
        comm = communicator(f"/ws/live/?topics=dashboard,convoy:{a},inbox&since=0", cookie)
        connected, _ = await comm.connect()
        assert connected
        messages = await receive_until(comm, has("replayed"))
        hello = messages[0]
        assert hello["type"] == "hello" and hello["topics"] == ["inbox"]
        assert events_of(messages) == []  # the replay from 0 held none of the convoys' events
        await sync_to_async(beads.close_bead)("gt-a")
        last = await sync_to_async(sentinel)(mallory)
        messages = await receive_until(comm, has("event", last))
        assert [e["seq"] for e in events_of(messages)] == [last]  # the close never came
        await comm.disconnect()

    async_to_sync(go)()


def test_topic_filtering_and_replay_since(two_convoys):
    cookie = session_cookie(make_user("alice"))
    a, b = two_convoys
    since = Event.objects.order_by("-seq").values_list("seq", flat=True)[0]
    beads.update_bead("gt-a", priority=1)
    beads.update_bead("gt-b", priority=1)

    async def go():
        comm = communicator(f"/ws/live/?topics=convoy:{a}&since={since}", cookie)
        assert (await comm.connect())[0]
        replayed = events_of(await receive_until(comm, has("replayed")))
        assert [e["bead_id"] for e in replayed] == ["gt-a"]
        await sync_to_async(beads.update_bead)("gt-b", priority=3)
        await sync_to_async(beads.update_bead)("gt-a", priority=3)
        last = await sync_to_async(last_seq)()
        # gt-b's change comes first in the log: had it leaked it would arrive before gt-a's
        live = events_of(await receive_until(comm, has("event", last)))
        assert [e["bead_id"] for e in live] == ["gt-a"]
        assert live[0]["seq"] > replayed[0]["seq"]
        await comm.disconnect()

    async_to_sync(go)()


def test_duplicates_suppressed_and_gap_filled_from_the_log(two_convoys):
    cookie = session_cookie(make_user("alice"))
    a, _ = two_convoys

    async def go():
        comm = communicator(f"/ws/live/?topics=dashboard,convoy:{a}", cookie)
        assert (await comm.connect())[0]
        await receive_until(comm, has("hello"))
        # one change reaches both groups; the client must get it once (a copy would come
        # before the next change)
        await sync_to_async(beads.update_bead)("gt-a", priority=0)
        first = await sync_to_async(last_seq)()
        await sync_to_async(beads.update_bead)("gt-a", priority=4)
        second = await sync_to_async(last_seq)()
        got = events_of(await receive_until(comm, has("event", second)))
        assert [e["seq"] for e in got] == [first, second]
        seqs = [first, second]
        # a change the layer "drops": the relay delivered `second`; now the next message to
        # the group claims to follow seq + 5, so the consumer must fill the gap from the log
        layer = get_channel_layer()
        group = group_name("convoy", a)
        fake_next = {
            "type": "convoy.event",
            "group": group,
            "prev": seqs[-1] + 5,
            "event": {
                "seq": seqs[-1] + 6,
                "kind": "bead.updated",
                "bead_id": "gt-a",
                "convoy_id": "",
                "actor": "",
                "data": {"convoys": [a]},
                "created_at": "",
            },
        }
        await layer.group_send(group, fake_next)
        after = await receive_until(
            comm, lambda m: has("replayed")(m) and has("event", seqs[-1] + 6)(m)
        )
        delivered = [m["seq"] for m in events_of(after)]
        assert delivered == [seqs[-1] + 6]  # no duplicates of what was already sent
        await comm.disconnect()

    async_to_sync(go)()


def test_resync_when_the_log_no_longer_reaches_back(two_convoys):
    cookie = session_cookie(make_user("alice"))
    Event.objects.filter(seq__lt=5).delete()

    async def go():
        comm = communicator("/ws/live/?topics=dashboard&since=1", cookie)
        assert (await comm.connect())[0]
        messages = await receive_until(comm, has("resync"))
        assert {"type": "resync"} in messages
        await comm.disconnect()

    async_to_sync(go)()


def test_inbox_receives_only_own_notifications(routes):
    alice, bob = make_user("alice"), make_user("bob")
    from convoys.services import notify

    bead("gt-z")
    convoy = convoys.create("Z", ["gt-z"])
    notify.subscribe(alice, convoy)
    cookie_a, cookie_b = session_cookie(alice), session_cookie(bob)

    async def go():
        ca = communicator("/ws/live/?topics=inbox", cookie_a)
        cb = communicator("/ws/live/?topics=inbox", cookie_b)
        assert (await ca.connect())[0] and (await cb.connect())[0]
        await receive_until(ca, has("hello"))
        await receive_until(cb, has("hello"))
        await sync_to_async(beads.close_bead)("gt-z")
        await sync_to_async(convoys.check)(convoy.pk)
        last_a = await sync_to_async(sentinel)(alice)
        last_b = await sync_to_async(sentinel)(bob)
        got_a = events_of(await receive_until(ca, has("event", last_a)))
        got_b = events_of(await receive_until(cb, has("event", last_b)))
        assert [e["kind"] for e in got_a] == ["notification", "notification"]
        assert got_a[0]["data"]["subject"] == "🚚 Convoy landed: Z"
        assert [e["seq"] for e in got_b] == [last_b]  # alice's landing never reached bob
        await ca.disconnect()
        await cb.disconnect()

    async_to_sync(go)()
