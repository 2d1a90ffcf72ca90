"""The websocket: authentication, Origin, topic filtering, replay, gaps and duplicates."""

import asyncio

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission, User
from django.test import Client

from convoys import relay
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


async def collect(comm, timeout=1.5):
    """Everything the server sends until it has been quiet for `timeout` seconds."""
    out = []
    while not await comm.receive_nothing(timeout=timeout):
        out.append(await comm.receive_json_from())
    return out


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
    cookie = session_cookie(make_user("mallory", view=False))
    a, _ = two_convoys

    async def go():
        comm = communicator(f"/ws/live/?topics=dashboard,convoy:{a},inbox&since=0", cookie)
        connected, _ = await comm.connect()
        assert connected
        messages = await collect(comm)
        hello = messages[0]
        assert hello["type"] == "hello" and hello["topics"] == ["inbox"]
        await sync_to_async(beads.close_bead)("gt-a")
        messages += await collect(comm)
        assert events_of(messages) == []
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
        replayed = events_of(await collect(comm))
        assert [e["bead_id"] for e in replayed] == ["gt-a"]
        await sync_to_async(beads.update_bead)("gt-b", priority=3)
        await sync_to_async(beads.update_bead)("gt-a", priority=3)
        live = events_of(await collect(comm))
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
        await collect(comm, timeout=0.5)
        # one change reaches both groups; the client must get it once
        await sync_to_async(beads.update_bead)("gt-a", priority=0)
        got = events_of(await collect(comm))
        assert len(got) == 1
        first = got[0]["seq"]
        # a change the layer "drops": it is in the log, but only the next message arrives
        missed = await sync_to_async(beads.update_bead)("gt-a", priority=4)
        del missed
        seqs = await sync_to_async(
            lambda: list(Event.objects.filter(seq__gt=first).values_list("seq", flat=True))
        )()
        await asyncio.sleep(0.6)
        await collect(comm, timeout=0.3)  # the relay already delivered it; simulate a loss:
        layer = get_channel_layer()
        group = relay.group_name("convoy", a)
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
        after = await collect(comm)
        delivered = [m["seq"] for m in events_of(after)]
        assert delivered[-1] == seqs[-1] + 6  # no duplicates of what was already sent
        assert "replayed" in [m["type"] for m in after]
        await comm.disconnect()

    async_to_sync(go)()


def test_resync_when_the_log_no_longer_reaches_back(two_convoys):
    cookie = session_cookie(make_user("alice"))
    Event.objects.filter(seq__lt=5).delete()

    async def go():
        comm = communicator("/ws/live/?topics=dashboard&since=1", cookie)
        assert (await comm.connect())[0]
        messages = await collect(comm, timeout=0.5)
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
        await collect(ca, 0.3)
        await collect(cb, 0.3)
        await sync_to_async(beads.close_bead)("gt-z")
        await sync_to_async(convoys.check)(convoy.pk)
        got_a = events_of(await collect(ca))
        got_b = events_of(await collect(cb))
        assert [e["kind"] for e in got_a] == ["notification"]
        assert got_a[0]["data"]["subject"] == "🚚 Convoy landed: Z"
        assert got_b == []
        await ca.disconnect()
        await cb.disconnect()

    async_to_sync(go)()
