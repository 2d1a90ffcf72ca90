"""Outbound HTTP for webhooks and chat: a host's addresses, one POST to the checked address
(never a redirect followed: http.client follows none), and one Apprise notification whose
lookups are pinned to the checked address or checked as they are made."""

import contextvars
import http.client
import importlib
import logging
import re
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import apprise


def _apprise() -> "Any":
    """Apprise, imported on first use: only chat targets need it (a tenth of a second that
    every command's start-up would otherwise pay)."""
    return importlib.import_module("apprise")


class Sent(NamedTuple):
    status: int | None  # the HTTP status, None when no answer came (or Apprise says no code)
    latency_ms: float
    error: str  # "" when it was delivered
    ok: bool


def addresses(host: str, port: int | None) -> list[str]:
    """Every address `host` resolves to (an OSError when it resolves to none)."""
    infos = socket.getaddrinfo(host, port or 0, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class _Pinned(http.client.HTTPSConnection):
    """HTTPS to one address already checked, with the host's name for SNI and the
    certificate: no second lookup between the check and the connection."""

    def __init__(self, host: str, port: int | None, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def post(url: str, body: bytes, headers: dict[str, str], address: str, timeout: float) -> Sent:
    """POST `body` to `url` at `address` (one of its host's, checked by the caller). A 2xx is
    delivered; anything else (a redirect included, never followed) is not."""
    parts = urlsplit(url)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    host = parts.hostname or ""
    started = time.monotonic()
    connection: http.client.HTTPConnection
    if parts.scheme.lower() == "https":
        connection = _Pinned(host, parts.port or 443, address, timeout)
    else:
        connection = http.client.HTTPConnection(address, parts.port or 80, timeout=timeout)
    try:
        netloc = host if ":" not in host else f"[{host}]"
        if parts.port:
            netloc += f":{parts.port}"
        connection.putrequest("POST", path, skip_host=True, skip_accept_encoding=True)
        connection.putheader("Host", netloc)
        for name, value in {
            **headers,
            "content-type": "application/json",
            "content-length": str(len(body)),
            "user-agent": "convoyweb-webhooks",
        }.items():
            connection.putheader(name, value)
        connection.endheaders(body)
        response = connection.getresponse()
        response.read(65536)
        status = response.status
    except (OSError, http.client.HTTPException) as exc:
        latency = (time.monotonic() - started) * 1000
        what = "timed out" if isinstance(exc, TimeoutError | socket.timeout) else str(exc)
        return Sent(None, latency, f"{type(exc).__name__}: {what}"[:500], False)
    finally:
        connection.close()
    latency = (time.monotonic() - started) * 1000
    ok = 200 <= status < 300
    return Sent(status, latency, "" if ok else f"HTTP {status}", ok)


# --- chat: every name Apprise looks up while it sends is answered here --------------------------
Refuse = Callable[[str, list[str]], "str | None"]  # (host, its addresses) -> why not, or None
_lookup = socket.getaddrinfo
# (pins, refuse, refusals) while a chat message is sent: a context variable, as Apprise copies
# its caller's context into the worker thread that sends.
_rules: contextvars.ContextVar[tuple[dict[str, str], Refuse, list[str]] | None]
_rules = contextvars.ContextVar("convoy_chat_lookups", default=None)


def _checked_lookup(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    """`socket.getaddrinfo`, but while a chat message is sent from this context: a pinned host
    resolves to the address already checked (no second lookup between check and connection),
    and any other host is resolved and refused like a target's (an OSError)."""
    rules = _rules.get()
    if rules is None or not isinstance(host, str):
        return _lookup(host, port, *args, **kwargs)
    pins, refuse, refusals = rules
    pinned = pins.get(host.lower().rstrip("."))
    if pinned is not None:
        return _lookup(pinned, port, *args, **kwargs)
    infos = _lookup(host, port, *args, **kwargs)
    problem = refuse(host, sorted({str(info[4][0]) for info in infos}))
    if problem:
        refusals.append(problem)
        raise OSError(problem)
    return infos


@contextmanager
def _looked_up(pins: dict[str, str], refuse: Refuse) -> Iterator[list[str]]:
    """Check this thread's lookups (`_checked_lookup`) while in the block; yields the
    refusals made."""
    socket.getaddrinfo = _checked_lookup  # installed once; a pass-through elsewhere
    refusals: list[str] = []
    pinned = {host.lower().rstrip("."): address for host, address in pins.items()}
    token = _rules.set((pinned, refuse, refusals))
    try:
        yield refusals
    finally:
        _rules.reset(token)


def _asset() -> "apprise.AppriseAsset":
    """Apprise follows no redirect, as a webhook does not."""
    asset: apprise.AppriseAsset = _apprise().AppriseAsset(http_redirects=False)
    return asset


def chat_plugin(url: str) -> "apprise.NotifyBase | None":
    """Apprise's notifier for `url` (None: Apprise knows no such URL)."""
    library = _apprise()
    plugin = library.Apprise.instantiate(url, asset=_asset(), suppress_exceptions=True)
    return plugin if isinstance(plugin, library.NotifyBase) else None


def chat_host(url: str) -> tuple[str, int | None] | None:
    """The host (and port) a chat URL reaches when its service is one you host yourself
    (json://, ntfy://host, matrix://, mmost://, …); None for a vendor's service at its own
    fixed public address (slack://, discord://, ntfy.sh). ValueError: no such URL."""
    plugin = chat_plugin(url)
    if plugin is None:
        raise ValueError(f"'{url[:80]}' is no chat URL Apprise knows")
    host = str(getattr(plugin, "host", "") or "")
    if not getattr(type(plugin), "protocol", None) or not host:
        return None
    port = getattr(plugin, "port", None)
    return host, int(port) if port else None


def send_chat(
    url: str, title: str, body: str, timeout: float, pins: dict[str, str], refuse: Refuse
) -> Sent:
    """One message through Apprise; `pins`: {host: the address checked for it}, and any
    other host it looks up is asked of `refuse`."""
    plugin = chat_plugin(url)
    started = time.monotonic()
    if plugin is None:
        return Sent(None, 0.0, "Apprise knows no such URL", False)
    plugin.socket_connect_timeout = timeout
    plugin.socket_read_timeout = timeout
    library = _apprise()
    sender = library.Apprise(asset=_asset())
    sender.add(plugin)
    capture = library.LogCapture(level=logging.WARNING, fmt="%(message)s")
    with capture as output, _looked_up(pins, refuse) as refusals:
        ok = bool(sender.notify(body=body, title=title))
        said = output.getvalue().strip()
    if refusals:
        said = refusals[0]
    latency = (time.monotonic() - started) * 1000
    # Apprise reports no status, but its warning names the answer's code ("error=500.").
    code = re.search(r"error=(\d{3})\b", said)
    status = int(code.group(1)) if code else None
    return Sent(status, latency, "" if ok else (said or "Apprise could not send it")[:500], ok)
