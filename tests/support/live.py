"""Websocket clients of the live endpoint, and what they receive."""

from channels.testing import WebsocketCommunicator
from django.db import transaction

from convoys.log import events


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
