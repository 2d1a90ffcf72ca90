"""Outbound HTTP for webhooks and chat: a host's addresses, one POST to the checked address
(never a redirect followed: http.client follows none), and one Apprise notification."""

import http.client
import importlib
import logging
import re
import socket
import ssl
import time
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


def chat_plugin(url: str) -> "apprise.NotifyBase | None":
    """Apprise's notifier for `url` (None: Apprise knows no such URL)."""
    library = _apprise()
    plugin = library.Apprise.instantiate(url, suppress_exceptions=True)
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


def send_chat(url: str, title: str, body: str, timeout: float) -> Sent:
    """One message through Apprise."""
    plugin = chat_plugin(url)
    started = time.monotonic()
    if plugin is None:
        return Sent(None, 0.0, "Apprise knows no such URL", False)
    plugin.socket_connect_timeout = timeout
    plugin.socket_read_timeout = timeout
    library = _apprise()
    sender = library.Apprise()
    sender.add(plugin)
    capture = library.LogCapture(level=logging.WARNING, fmt="%(message)s")
    with capture as output:
        ok = bool(sender.notify(body=body, title=title))
        said = output.getvalue().strip()
    latency = (time.monotonic() - started) * 1000
    # Apprise reports no status, but its warning names the answer's code ("error=500.").
    code = re.search(r"error=(\d{3})\b", said)
    status = int(code.group(1)) if code else None
    return Sent(status, latency, "" if ok else (said or "Apprise could not send it")[:500], ok)
