"""Outbound webhooks and chat messages, the pure part: the kinds a target may ask for and the
notification kinds behind them, the retry schedule, which addresses a target may not reach,
what a URL is (a signed webhook or a chat URL), the payload and the chat message."""

import base64
import ipaddress
import os
import secrets
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

# What a target may ask for, in the order pages and `hooks list` show them.
KINDS = ("landed", "closed", "action-needed", "at-risk", "overdue", "merged", "dispatched")
DEFAULT_KINDS = tuple(kind for kind in KINDS if kind != "dispatched")
# Notification.kind -> the target's kind. Strings, not the model's constants: kinds that are
# added later (at_risk, overdue) need no import that may not exist yet.
NOTIFICATION_KINDS: Mapping[str, str] = {
    "landed": "landed",
    "closed": "closed",
    "action_needed": "action-needed",
    "escalation": "action-needed",
    "at_risk": "at-risk",
    "overdue": "overdue",
}
# The `type` of each kind's payload (Standard Webhooks: a dotted event type).
TYPES: Mapping[str, str] = {
    "landed": "convoy.landed",
    "closed": "convoy.closed",
    "action-needed": "convoy.action_needed",
    "at-risk": "convoy.at_risk",
    "overdue": "convoy.overdue",
    "merged": "bead.merged",
    "dispatched": "bead.dispatched",
    "test": "webhook.test",
}
WEB_SCHEMES = ("http", "https")
RETRY_WINDOW = timedelta(hours=24)  # retries stop this long after the event
TIMEOUT = 10.0  # seconds a delivery may take (the default of CONVOY_WEBHOOK_TIMEOUT)
SECRET_PREFIX = "whsec_"
MAX_URL = 2000


def parse_kinds(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """ "landed,at-risk" (or a list) -> the kinds in KINDS order; None or "" -> the defaults.
    An unknown kind is a ValueError naming it."""
    if text is None:
        return DEFAULT_KINDS
    names = text.split(",") if isinstance(text, str) else list(text)
    wanted = {name.strip().lower().replace("_", "-") for name in names if name.strip()}
    if not wanted:
        return DEFAULT_KINDS
    unknown = sorted(wanted - set(KINDS))
    if unknown:
        raise ValueError(f"unknown kind '{unknown[0][:40]}': choose from {', '.join(KINDS)}")
    return tuple(kind for kind in KINDS if kind in wanted)


def stored_kinds(kinds: Iterable[str]) -> str:
    """The kinds as stored: ",landed,closed," (a LIKE '%,kind,%' finds a kind on any database)."""
    return "," + ",".join(kinds) + ","


def kinds_of(stored: str) -> tuple[str, ...]:
    return tuple(kind for kind in stored.split(",") if kind)


def retry_delay(attempts: int, base: float) -> timedelta:
    """The wait after the `attempts`-th failed attempt: base, then twice that, and so on."""
    return timedelta(seconds=base * 2 ** max(attempts - 1, 0))


def next_attempt(
    first: datetime, attempts: int, now: datetime, base: float, window: timedelta = RETRY_WINDOW
) -> datetime | None:
    """When to try again after `attempts` failures, the last at `now`; None: give up (the next
    try would fall more than `window` after the event was first queued at `first`)."""
    when = now + retry_delay(attempts, base)
    return when if when <= first + window else None


def new_secret() -> str:
    """A Standard Webhooks secret: whsec_ and 24 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def secret_problem(secret: str) -> str | None:
    """Why `secret` is no Standard Webhooks secret (whsec_ and base64 of 24-64 bytes)."""
    body = secret.removeprefix(SECRET_PREFIX)
    try:
        raw = base64.b64decode(body, validate=True)
    except ValueError:
        return "the secret must be whsec_ followed by base64"
    if not 16 <= len(raw) <= 64:
        return "the secret must hold 16 to 64 bytes (base64 after whsec_)"
    return None


def is_chat(url: str) -> bool:
    """An Apprise URL (slack://, ntfy://, json://, …): anything whose scheme is not http(s)."""
    return urlsplit(url.strip()).scheme.lower() not in WEB_SCHEMES


def url_problem(url: str) -> str | None:
    """Why `url` can be no target (before its host is looked up)."""
    if not url or len(url) > MAX_URL:
        return f"a target URL must be 1 to {MAX_URL} characters"
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        return "a target URL may hold no spaces or control characters"
    parts = urlsplit(url)
    if not parts.scheme or "://" not in url:
        return f"'{url[:80]}' is not a URL (scheme://host/…)"
    if parts.scheme.lower() in WEB_SCHEMES:
        try:
            parts.port  # noqa: B018 - a bad port raises
        except ValueError:
            return f"'{url[:80]}' has a bad port"
        if not parts.hostname:
            return f"'{url[:80]}' names no host"
        if parts.username or parts.password:
            return "a webhook URL may not carry a user name or password"
    return None


def address_kind(address: str) -> str | None:
    """What keeps a target from `address` (an IP as text), in a word: loopback, link-local,
    private, or otherwise no address of the public internet; None for a public address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for what, bad in (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("unspecified", ip.is_unspecified),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved or not ip.is_global),
    ):
        if bad:
            return what
    return None


def private_problem(host: str, addresses: Iterable[str]) -> str | None:
    """The first address of `host` a target may not reach, said in a line."""
    for address in addresses:
        kind = address_kind(address)
        if kind:
            shown = "" if address == host else f"{host} resolves to "
            return (
                f"{shown}{address} is a {kind} address (CONVOY_WEBHOOK_ALLOW_PRIVATE=1 allows it)"
            )
    return None


def message_id() -> str:
    """A message id (webhook-id): the same for every target of one event and every retry."""
    return "msg_" + base64.b32encode(os.urandom(15)).decode().lower()


def payload(kind: str, at: datetime, data: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of a delivery: {"type", "timestamp", "data"} as Standard Webhooks has it."""
    return {"type": TYPES.get(kind, kind), "timestamp": at.isoformat(), "data": dict(data)}


def chat_message(body: Mapping[str, Any]) -> tuple[str, str]:
    """(title, text) of one short chat message for a payload: what happened, the convoy's
    title, done/total, how long it has run and a link to its page."""
    data = body.get("data", {})
    convoy = data.get("convoy") or {}
    what = {
        "convoy.landed": "Convoy landed",
        "convoy.closed": "Convoy closed",
        "convoy.action_needed": "Action needed",
        "convoy.at_risk": "Convoy at risk",
        "convoy.overdue": "Convoy overdue",
        "bead.merged": "Bead merged",
        "bead.dispatched": "Bead dispatched",
        "webhook.test": "Test message",
    }.get(str(body.get("type", "")), str(body.get("type", "")))
    name = " ".join(str(convoy.get("title") or convoy.get("id") or "").split())[:200]
    title = f"🚚 {what}: {name}" if name else f"🚚 {what}"
    lines = []
    if data.get("bead"):
        bead = data["bead"]
        lines.append(f"{bead.get('id', '')} {bead.get('title', '')}".strip())
    elif data.get("subject"):
        lines.append(str(data["subject"]))
    if convoy:
        facts = [f"{convoy.get('done', 0)}/{convoy.get('total', 0)} done"]
        if convoy.get("duration"):
            facts.append(f"running {convoy['duration']}")
        lines.append(", ".join(facts))
        if convoy.get("url"):
            lines.append(str(convoy["url"]))
    return title, "\n".join(lines) or what
