"""Revoked means revoked on open sockets: each way a user loses a session or a right closes
their open sockets (or drops the topics they may no longer see) within 5 s, through the signal
path alone (the periodic re-check is pushed out of the way), and a replay never holds more
than the user may see now. Two real daphne processes on Redis show it across processes."""

import asyncio
import contextlib
import json
import urllib.request

import pytest
import websockets
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import Group, Permission, User
from django.contrib.sessions.models import Session
from django.db import connection, transaction
from django.test import Client

from convoys.log import events
from convoys.services import convoys, tokens

from .support.databases import redis_url
from .support.factories import bead
from .support.live import communicator, events_of, has, receive_until, sentinel
from .support.processes import child_env, free_port, spawn, wait_port
from .support.users import PASSWORD, cookie_of, logged_in, user_with, viewer

pytestmark = pytest.mark.django_db(transaction=True)

WITHIN = 5  # seconds a revocation may take to reach an open socket
TOPICS = "dashboard,inbox"


@pytest.fixture(autouse=True)
def _signals_only(settings):
    """The periodic re-check never fires during a test: what closes a socket is the signal."""
    settings.CONVOY_WS_RECHECK = 3600


def client_and_cookie(user):
    """A test client with a real login (a session of its own) and its socket cookie."""
    client = logged_in(user)
    return client, cookie_of(client)


async def opened(cookie, topics=TOPICS, since=None):
    path = f"/ws/live/?topics={topics}" + (f"&since={since}" if since is not None else "")
    comm = communicator(path, cookie)
    assert (await comm.connect())[0]
    hello = (await receive_until(comm, has("hello")))[-1]
    return comm, hello


async def closed(comm, timeout=WITHIN):
    """The messages a socket gets until the server closes it, and the close code."""
    messages = []
    while True:
        output = await comm.receive_output(timeout=timeout)
        if output["type"] == "websocket.close":
            return messages, output.get("code")
        messages.append(json.loads(output["text"]))


async def still_live(comm, user):
    """The socket still gets the user's events (a sentinel inbox event arrives)."""
    last = await sync_to_async(sentinel)(user)
    await receive_until(comm, has("event", last), timeout=WITHIN)


def record_on(bead_id):
    with transaction.atomic():
        return events.record("bead.updated", bead_id=bead_id, actor="test").seq


def assert_signed_out(outcome):
    messages, code = outcome
    assert code == 4401
    assert messages[-1]["type"] == "error" and messages[-1]["code"] == 4401


def test_logout_closes_that_sessions_sockets_and_refuses_new_ones(routes):
    alice = viewer("alice")
    browser, cookie = client_and_cookie(alice)
    _, other_cookie = client_and_cookie(alice)  # alice on another computer

    async def go():
        mine = [(await opened(cookie))[0] for _ in range(2)]
        elsewhere, _ = await opened(other_cookie)
        await sync_to_async(browser.post)("/logout/")
        outcomes = [await closed(comm) for comm in mine]
        await still_live(elsewhere, alice)  # a logout ends its own session only
        refused = communicator(f"/ws/live/?topics={TOPICS}", cookie)
        again = (await refused.connect())[0]
        await elsewhere.disconnect()
        return outcomes, again

    outcomes, again = async_to_sync(go)()
    for outcome in outcomes:
        assert_signed_out(outcome)
    assert again is False


@pytest.mark.parametrize(
    "revoke",
    [
        pytest.param(lambda u: (u.set_password("another-pw-456"), u.save()), id="password"),
        pytest.param(lambda u: (setattr(u, "is_active", False), u.save()), id="deactivated"),
        pytest.param(lambda u: u.delete(), id="deleted"),
    ],
)
def test_every_session_of_a_user_closes(routes, revoke):
    alice, bob = viewer("alice"), viewer("bob")
    cookies = [client_and_cookie(alice)[1], client_and_cookie(alice)[1]]
    bob_cookie = client_and_cookie(bob)[1]

    async def go():
        sockets = [(await opened(cookie))[0] for cookie in cookies]
        bystander, _ = await opened(bob_cookie)
        await sync_to_async(revoke)(alice)
        outcomes = [await closed(comm) for comm in sockets]
        await still_live(bystander, bob)
        await bystander.disconnect()
        return outcomes

    for outcome in async_to_sync(go)():
        assert_signed_out(outcome)


def test_a_login_elsewhere_closes_nothing(routes):
    alice = viewer("alice")
    cookie = client_and_cookie(alice)[1]

    async def go():
        comm, _ = await opened(cookie)
        form = {"username": "alice", "password": PASSWORD}
        answer = await sync_to_async(Client().post)("/login/", form)
        assert answer.status_code == 302  # signed in
        await still_live(comm, alice)  # last_login saved: no right taken away
        await comm.disconnect()

    async_to_sync(go)()


def view():
    return Permission.objects.get(codename="view_convoy")


def viewers_group(user):
    group = Group.objects.create(name=f"viewers-{user.pk}")
    group.permissions.add(view())
    user.groups.add(group)
    return group


@pytest.mark.parametrize(
    "grant, revoke",
    [
        (lambda u: u.user_permissions.add(view()), lambda u: u.user_permissions.remove(view())),
        (lambda u: u.user_permissions.add(view()), lambda u: u.user_permissions.clear()),
        (lambda u: u.user_permissions.add(view()), lambda u: view().user_set.remove(u)),
        (lambda u: u.user_permissions.add(view()), lambda u: view().user_set.clear()),
        (viewers_group, lambda u: u.groups.remove(u.groups.get())),
        (viewers_group, lambda u: u.groups.get().user_set.clear()),
        (viewers_group, lambda u: u.groups.get().permissions.remove(view())),
        (viewers_group, lambda u: view().group_set.clear()),
        (viewers_group, lambda u: u.groups.get().delete()),
    ],
    ids=[
        "permission-removed",
        "permissions-cleared",
        "permission-users-removed",
        "permission-users-cleared",
        "group-left",
        "group-emptied",
        "group-permission-removed",
        "permission-groups-cleared",
        "group-deleted",
    ],
)
def test_a_removed_right_drops_the_topics_it_gave(routes, grant, revoke):
    bead("gt-a")
    convoy = convoys.create("A", ["gt-a"])
    vera = user_with("vera")
    grant(vera)
    cookie = client_and_cookie(vera)[1]
    topics = f"dashboard,convoy:{convoy.pk},bead:gt-a,inbox"

    async def go():
        comm, hello = await opened(cookie, topics)
        await sync_to_async(revoke)(vera)
        told = await receive_until(comm, has("topics"), timeout=WITHIN)
        await sync_to_async(record_on)("gt-a")  # no longer hers to see
        last = await sync_to_async(sentinel)(vera)
        after = await receive_until(comm, has("event", last), timeout=WITHIN)
        await comm.send_json_to({"type": "replay", "since": 0})
        replayed = await receive_until(comm, has("replayed"), timeout=WITHIN)
        await comm.disconnect()
        return hello["topics"], told[-1]["topics"], after, replayed

    before, left, after, replayed = async_to_sync(go)()
    assert before == sorted(topics.split(","))
    assert left == ["inbox"]
    assert [e["kind"] for e in events_of(after)] == ["notification"]
    assert {e["kind"] for e in events_of(replayed)} <= {"notification"}


def test_a_replay_checks_the_rights_afresh_even_unannounced(routes):
    """Permission rows deleted behind the signals' back (no m2m_changed): the next replay
    reads the rights first and holds none of the convoy's events."""
    bead("gt-a")
    convoy = convoys.create("A", ["gt-a"])
    vera = viewer("vera")
    cookie = client_and_cookie(vera)[1]

    async def go():
        comm, _ = await opened(cookie, f"convoy:{convoy.pk},inbox")
        rows = User.user_permissions.through.objects.filter(user=vera)
        await sync_to_async(rows.delete)()
        await comm.send_json_to({"type": "replay", "since": 0})
        messages = await receive_until(comm, has("replayed"), timeout=WITHIN)
        await comm.disconnect()
        return messages

    messages = async_to_sync(go)()
    assert messages[0] == {"type": "topics", "topics": ["inbox"]}
    assert events_of(messages) == []


def test_the_periodic_recheck_closes_a_session_deleted_by_hand(routes, settings):
    settings.CONVOY_WS_RECHECK = 0.2
    alice = viewer("alice")
    cookie = client_and_cookie(alice)[1]

    async def go():
        comm, _ = await opened(cookie)
        await sync_to_async(Session.objects.all().delete)()  # no signal sees this
        return await closed(comm)

    assert_signed_out(async_to_sync(go)())


def test_an_api_token_opens_no_socket(routes):
    """Sockets take the session cookie only: a token has no socket to close when deleted."""
    token = tokens.create_token(viewer("robot"), "ci")
    from channels.testing import WebsocketCommunicator

    from convoyweb.asgi import application

    headers = [
        (b"host", b"localhost"),
        (b"origin", b"http://localhost"),
        (b"authorization", f"Bearer {token}".encode()),
    ]

    async def go():
        comm = WebsocketCommunicator(application, f"/ws/live/?topics={TOPICS}", headers=headers)
        return (await comm.connect())[0]

    assert async_to_sync(go)() is False


@pytest.mark.slow
def test_logout_through_one_web_process_closes_sockets_on_the_other(routes):
    """Two daphne processes on Redis: the socket is open on one, the logout and a removed
    permission go through the other (HTTP and a saved user); each reaches it within 5 s."""
    url = redis_url()
    env = child_env(REDIS_URL=url, CONVOY_WS_RECHECK="3600")
    ports = [free_port(), free_port()]
    procs = [spawn("web", env, port) for port in ports]
    viewer("alice")
    viewer("bob")
    sessions = {}
    for name in ("alice", "bob"):
        client = Client()
        client.force_login(User.objects.get(username=name))
        sessions[name] = client.cookies["sessionid"].value

    async def socket(port, who):
        return await websockets.connect(
            f"ws://127.0.0.1:{port}/ws/live/?topics={TOPICS}",
            additional_headers={
                "Cookie": f"sessionid={sessions[who]}",
                "Origin": f"http://127.0.0.1:{port}",
            },
            open_timeout=10,
        )

    async def until_closed(ws):
        messages = []
        async with asyncio.timeout(WITHIN):
            with contextlib.suppress(websockets.ConnectionClosed):  # raised for a code not 1000
                async for raw in ws:
                    messages.append(json.loads(raw))
        return messages, ws.close_code

    async def until_topics(ws):
        async with asyncio.timeout(WITHIN):
            async for raw in ws:
                if json.loads(raw)["type"] == "topics":
                    return json.loads(raw)["topics"]

    def logout_through(port):
        """A browser's logout: the login page's CSRF cookie and token, then POST /logout/."""
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=10)
        cookies = page.headers.get_all("Set-Cookie")
        token = next(
            c.split(";")[0].split("=", 1)[1] for c in cookies if c.startswith("csrftoken=")
        )
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/logout/",
            data=f"csrfmiddlewaretoken={token}".encode(),
            method="POST",
            headers={
                "Cookie": f"sessionid={sessions['alice']}; csrftoken={token}",
                "Origin": f"http://127.0.0.1:{port}",
            },
        )
        return urllib.request.urlopen(request, timeout=10).status

    def bobs_permissions_cleared():
        try:
            User.objects.get(username="bob").user_permissions.clear()
        finally:
            connection.close()  # a worker thread's: left open, it keeps the test database

    async def main():
        for port in ports:
            await asyncio.to_thread(wait_port, port, 30)
        hers = await socket(ports[0], "alice")
        his = await socket(ports[0], "bob")
        for ws in (hers, his):
            assert json.loads(await ws.recv())["type"] == "hello"
        status = await asyncio.to_thread(logout_through, ports[1])
        closed_hers = await until_closed(hers)
        await asyncio.to_thread(bobs_permissions_cleared)
        left = await until_topics(his)
        await his.close()
        return status, closed_hers, left

    try:
        status, (messages, code), left = asyncio.run(main())
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(20)
    assert status == 200
    assert code == 4401 and messages[-1]["type"] == "error"
    assert left == ["inbox"]
