"""Who may open the live websocket (convoyweb.asgi wraps the consumer in `gate`).

Origin: a page may open it only from this site's own origin, scheme, host and port alike
(the Host it connects to, which ALLOWED_HOSTS must allow), or from an origin listed in
CSRF_TRUSTED_ORIGINS: the rule Django applies to unsafe HTTP requests. channels'
AllowedHostsOriginValidator compares host names only, so a page on another port of the same
host could read the stream with the user's cookie. A handshake without Origin is refused too.

User: the session and user are read by `quick_read`, in a small pool of threads of its own, not
on the one shared database thread of channels' AuthMiddleware: queued there behind everything
else, a reconnect storm's handshakes waited past daphne's 5 s and were dropped.
"""

import asyncio
import functools
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar, cast

from asgiref.typing import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope
from channels.auth import AuthMiddleware, get_user
from channels.security.websocket import WebsocketDenier
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.db import connection
from django.http import HttpRequest
from django.middleware.csrf import CsrfViewMiddleware
from django.utils.http import is_same_domain

QUICK_THREADS = 4
SESSION_SECONDS = 5.0
MAX_SESSIONS = 10000
T = TypeVar("T")
_quick = ThreadPoolExecutor(QUICK_THREADS, thread_name_prefix="ws-quick")
_Lookups = dict[str | None, tuple[float, asyncio.Future[Any]]]  # session key: (expiry, lookup)


def _read_keeping_connection(func: Callable[..., T], *args: Any) -> T:
    try:
        return func(*args)
    except Exception:
        connection.close()  # whatever went wrong, the next read starts on a fresh one
        raise
    finally:
        if connection.vendor != "sqlite":
            connection.close()  # back to the pool (PostgreSQL)


async def quick_read(func: Callable[..., T], *args: Any) -> T:
    """Run a short read-only query (a few milliseconds: session, user, permissions, the last
    sequence number) in the websocket's own thread pool. On SQLite each of its few threads
    keeps its connection: opening one cost twice the reads of a handshake (6 -> 2 ms of CPU
    per handshake); other databases return it to the pool after each read."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        _quick, functools.partial(_read_keeping_connection, func, *args)
    )


class Handshake(HttpRequest):
    """The handshake's headers as Django sees a request's, for its Host and scheme rules
    (ALLOWED_HOSTS, USE_X_FORWARDED_HOST, SECURE_PROXY_SSL_HEADER)."""

    def __init__(self, scope: Scope) -> None:
        super().__init__()
        self.secure = scope.get("scheme") == "wss"
        # Only a websocket's scope reaches here (a lifespan scope, which has no headers, does not).
        headers = cast("Iterable[tuple[bytes, bytes]]", scope.get("headers", []))
        for name, value in headers:
            key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
            self.META[key] = value.decode("latin-1")

    def _get_scheme(self) -> str:
        return "https" if self.secure else "http"


def origin_allowed(scope: Scope) -> bool:
    request = Handshake(scope)
    origin = request.META.get("HTTP_ORIGIN")
    if not origin or "HTTP_HOST" not in request.META:
        return False
    try:
        own = f"{request.scheme}://{request.get_host()}"
    except DisallowedHost:
        return False
    # Only its origin lists are read: get_response is never called.
    csrf = CsrfViewMiddleware(lambda request: None)  # type: ignore[arg-type]
    if origin.lower() == own.lower() or origin in csrf.allowed_origins_exact:
        return True
    scheme, _, netloc = origin.partition("://")
    return any(
        is_same_domain(netloc, pattern) for pattern in csrf.allowed_origin_subdomains[scheme]
    )


class OriginGate:
    def __init__(self, app: ASGI3Application) -> None:
        self.app = app

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if origin_allowed(scope):
            await self.app(scope, receive, send)
        else:
            await WebsocketDenier()(scope, receive, send)


class PooledAuthMiddleware(AuthMiddleware):  # type: ignore[misc]  # channels ships no types
    """channels' AuthMiddleware, reading the session and user through quick_read, and
    remembering a logged-in session's user for SESSION_SECONDS: the pages of one browser
    reconnecting together cost one lookup (and one permission read), not one each; handshakes
    arriving while it runs wait for it. A logout or password change reaches new sockets that
    much later (open ones are not closed by it either way)."""

    # event loop -> {session key: (expiry, future)}
    lookups: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lookups]] = (
        weakref.WeakKeyDictionary()
    )

    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        """`scope`: channels' scope, the ASGI one with `cookies`, `session` and `user` added."""
        key = scope["cookies"].get(settings.SESSION_COOKIE_NAME)
        recent = self.lookups.setdefault(asyncio.get_running_loop(), {})
        now = time.monotonic()
        remembered = recent.get(key)
        if remembered is not None and remembered[0] > now:
            lookup = remembered[1]
        else:
            if len(recent) > MAX_SESSIONS:
                recent.clear()
            # get_user.func: channels' lookup itself, without its thread_sensitive wrapper
            lookup = asyncio.ensure_future(quick_read(get_user.func, scope))
            recent[key] = (now + SESSION_SECONDS, lookup)
            lookup.add_done_callback(functools.partial(_forget_unless_user, recent, key))
        # shielded: a handshake given up (daphne's timeout) must not cancel the others' lookup
        scope["user"]._wrapped = await asyncio.shield(lookup)


def _forget_unless_user(
    recent: _Lookups,
    key: str | None,
    lookup: asyncio.Future[Any],
) -> None:
    """Failed lookups and anonymous answers are not remembered."""
    failed = lookup.cancelled() or lookup.exception() is not None
    if failed or not lookup.result().is_authenticated:
        if recent.get(key, (0, None))[1] is lookup:
            del recent[key]


def gate(app: ASGI3Application) -> OriginGate:
    return OriginGate(CookieMiddleware(SessionMiddleware(PooledAuthMiddleware(app))))
