"""Hostile ids, frames and clients on the live websocket: nothing one of them sends or names
stops the others' live updates or sees past its rights."""

import logging
from urllib.parse import quote

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction

from convoys import events, relay

from .factories import bead
from .test_live import collect, communicator, events_of, make_user, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE_IDS = ["cm2-$(id)", "gt-" + "ü名 :<>$" * 25]  # the second is 203 characters


def record(kind, bead_id):
    with transaction.atomic():
        return events.record(kind, bead_id=bead_id, actor="test").seq


def test_group_names_are_layer_safe_for_any_id():
    for key in [*HOSTILE_IDS, "x" * 5000, "\ud800", 7, ""]:
        name = relay.group_name("bead", key)
        assert name.isascii() and len(name) < 100, name
        assert name.replace(".", "").isalnum()
    assert relay.group_name("bead", "a") != relay.group_name("convoy", "a")
    assert relay.group_name("user", 7) == relay.group_name("user", "7")


def test_hostile_bead_ids_do_not_stop_live_updates(routes, caplog):
    bead("gt-a")
    cookie = session_cookie(make_user("alice"))

    async def go():
        other = communicator("/ws/live/?topics=bead:gt-a", cookie)
        named = communicator(f"/ws/live/?topics={quote('bead:' + HOSTILE_IDS[1])}", cookie)
        assert (await other.connect())[0] and (await named.connect())[0]
        assert (await other.receive_json_from())["topics"] == ["bead:gt-a"]
        assert (await named.receive_json_from())["topics"] == ["bead:" + HOSTILE_IDS[1]]
        hostile = [await sync_to_async(record)("bead.updated", i) for i in HOSTILE_IDS]
        after = await sync_to_async(record)("bead.updated", "gt-a")
        assert [e["seq"] for e in events_of(await collect(other))] == [after]
        assert [e["seq"] for e in events_of(await collect(named))] == [hostile[1]]
        await other.disconnect()
        await named.disconnect()

    with caplog.at_level(logging.INFO, logger="convoys.relay"):
        async_to_sync(go)()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_message_the_layer_refuses_is_logged_once_and_skipped(routes, caplog, monkeypatch):
    bead("gt-a")
    bead("gt-b")
    cookie = session_cookie(make_user("alice"))
    layer = get_channel_layer()
    group_send = layer.group_send
    refused = relay.group_name("bead", "gt-b")

    async def picky_group_send(group, message):
        if group == refused and message["type"] == "convoy.event":
            raise ValueError("message too large")
        await group_send(group, message)

    monkeypatch.setattr(layer, "group_send", picky_group_send)

    async def go():
        comm = communicator("/ws/live/?topics=bead:gt-a", cookie)
        assert (await comm.connect())[0]
        await collect(comm, 0.3)
        await sync_to_async(record)("bead.updated", "gt-b")
        first = await sync_to_async(record)("bead.updated", "gt-a")
        second = await sync_to_async(record)("bead.updated", "gt-a")
        assert [e["seq"] for e in events_of(await collect(comm))] == [first, second]
        await comm.disconnect()

    with caplog.at_level(logging.INFO, logger="convoys.relay"):
        async_to_sync(go)()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and refused in errors[0], errors
