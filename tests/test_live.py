"""The websocket: authentication, Origin, topic filtering, replay, gaps and duplicates."""

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer

from convoys.core.ids import group_name
from convoys.log.events import last_seq
from convoys.models import Event
from convoys.services import beads, convoys

from .support.factories import bead
from .support.live import communicator, events_of, has, receive_until, sentinel
from .support.users import session_cookie, user_with, viewer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def two_convoys(routes):
    bead("gt-a")
    bead("gt-b")
    a = convoys.create("A", ["gt-a"])
    b = convoys.create("B", ["gt-b"])
    return a.pk, b.pk


def test_anonymous_and_foreign_origin_are_refused(two_convoys):
    user = viewer("alice")

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
    mallory = user_with("mallory")
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
    cookie = session_cookie(viewer("alice"))
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
    cookie = session_cookie(viewer("alice"))
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
    cookie = session_cookie(viewer("alice"))
    Event.objects.filter(seq__lt=5).delete()

    async def go():
        comm = communicator("/ws/live/?topics=dashboard&since=1", cookie)
        assert (await comm.connect())[0]
        messages = await receive_until(comm, has("resync"))
        assert {"type": "resync"} in messages
        await comm.disconnect()

    async_to_sync(go)()


def test_inbox_receives_only_own_notifications(routes):
    alice, bob = viewer("alice"), viewer("bob")
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
