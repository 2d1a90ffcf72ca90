"""Who may open the live websocket (convoyweb.asgi wraps the consumer in `gate`).

Origin: a page may open it only from this site's own origin, scheme, host and port alike
(the Host it connects to, which ALLOWED_HOSTS must allow), or from an origin listed in
CSRF_TRUSTED_ORIGINS: the rule Django applies to unsafe HTTP requests. channels'
AllowedHostsOriginValidator compares host names only, so a page on another port of the same
host could read the stream with the user's cookie. A handshake without Origin is refused too.

User: the session and user are read by `quick_read`, in a small pool of threads of its own, not
on the one shared database thread of channels' AuthMiddleware: queued there behind everything
else, a reconnect storm's handshakes waited past daphne's 5 s and were dropped. Every handshake
reads the session afresh (`session_user`, Django's rule for a request's user): handshakes of one
session arriving while its lookup runs share it, and nothing is remembered after, so a
logged-out cookie never opens a socket.
"""

import asyncio
import functools
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from importlib import import_module
from typing import Any, ClassVar, TypeVar, cast

from asgiref.typing import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope
from channels.auth import AuthMiddleware
from channels.security.websocket import WebsocketDenier
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, load_backend
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import DisallowedHost
from django.db import connection
from django.http import HttpRequest
from django.middleware.csrf import CsrfViewMiddleware
from django.utils.crypto import constant_time_compare
from django.utils.http import is_same_domain

QUICK_THREADS = 4
T = TypeVar("T")
_quick = ThreadPoolExecutor(QUICK_THREADS, thread_name_prefix="ws-quick")
_Lookups = dict[str | None, asyncio.Future[Any]]  # session key: its lookup under way


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


def session_user(session_key: str | None) -> AbstractBaseUser | None:
    """The user a session cookie signs in now, read afresh, or None: Django's rule for a
    request's user (a known backend, an active user, the session's hash of the password and
    secret still the user's), without flushing a stale session (a socket never writes).
    None after a logout, a password change elsewhere, a deactivation or a deleted user."""
    if not session_key:
        return None
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    try:
        user_id = session[SESSION_KEY]
        backend_path = session[BACKEND_SESSION_KEY]
    except KeyError:
        return None
    if backend_path not in settings.AUTHENTICATION_BACKENDS:
        return None
    user = load_backend(backend_path).get_user(user_id)
    if user is None:
        return None
    session_hash = session.get(HASH_SESSION_KEY) or ""
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    if not any(constant_time_compare(session_hash, valid) for valid in hashes):
        return None
    return user


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
    """channels' AuthMiddleware, reading the session and user through quick_read
    (`session_user`): the pages of one browser reconnecting together while the lookup runs
    share it, not one each. Nothing is remembered once it is done: a logout, a password change
    or a deactivation refuses the very next handshake."""

    # event loop -> {session key: lookup under way}
    lookups: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lookups]] = (
        weakref.WeakKeyDictionary()
    )

    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        """`scope`: channels' scope, the ASGI one with `cookies`, `session` and `user` added."""
        key = scope["cookies"].get(settings.SESSION_COOKIE_NAME)
        running = self.lookups.setdefault(asyncio.get_running_loop(), {})
        lookup = running.get(key)
        if lookup is None:
            lookup = asyncio.ensure_future(quick_read(session_user, key))
            running[key] = lookup
            lookup.add_done_callback(functools.partial(_forget, running, key))
        # shielded: a handshake given up (daphne's timeout) must not cancel the others' lookup
        scope["user"]._wrapped = await asyncio.shield(lookup) or AnonymousUser()


def _forget(running: _Lookups, key: str | None, lookup: asyncio.Future[Any]) -> None:
    if running.get(key) is lookup:
        del running[key]


def gate(app: ASGI3Application) -> OriginGate:
    return OriginGate(CookieMiddleware(SessionMiddleware(PooledAuthMiddleware(app))))
