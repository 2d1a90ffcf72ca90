"""What the page views share: who may see or change what (login, then the model permission),
the actor a change is recorded under, the safe way back after a POST, and the answer when
the database cannot be reached (pages and API alike)."""

import logging
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils.http import url_has_allowed_host_and_scheme

from convoys.services.errors import ServiceError

if TYPE_CHECKING:
    from django.contrib.auth.models import User

VIEW = "convoys.view_convoy"
View = Callable[..., HttpResponse]


class AuthenticatedHttpRequest(HttpRequest):
    """For annotations only: the request a view behind `needs` (login_required) is given,
    whose user is signed in (django-stubs' pattern; never instantiated)."""

    user: "User"


def needs(perm: str) -> Callable[[View], View]:
    """Login, then the model permission (403 without it)."""

    def wrap(view: View) -> View:
        @wraps(view)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.has_perm(perm):
                raise PermissionDenied(f"You need the {perm.split('.')[1]} permission.")
            return view(request, *args, **kwargs)

        return login_required(checked)

    return wrap


viewer = needs(VIEW)  # every page: login, then the view permission


def actor(request: HttpRequest) -> str:
    """Who a change made on a page is recorded as."""
    return f"web:{request.user.get_username()}"


def refusal(exc: ServiceError) -> str:
    """A service's refusal as a page says it (how to go on in a page's words)."""
    return exc.explained("web")


def back(request: HttpRequest, fallback: str) -> HttpResponse:
    """After a POST: to the form's `next` when it is a page of this site, else `fallback`
    (never to another host, `//evil.example/` included)."""
    target = request.POST.get("next", "")
    # A path, never a view name (redirect() would look "x" up as one and fail).
    if target.startswith("/") and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}
    ):
        return HttpResponseRedirect(target)
    return redirect(fallback)


log = logging.getLogger(__name__)
RETRY_AFTER = "5"  # seconds a client is asked to wait before trying again after a 503


def database_down(exc: BaseException) -> bool:
    """Did `exc` come from a database that cannot be reached (down, unreachable, or no pooled
    connection free within DATABASE_CONNECT_TIMEOUT), rather than from a statement it
    refused? The connection tells: never opened, or no longer answering."""
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    connection = connections[DEFAULT_DB_ALIAS]
    return connection.connection is None or not connection.is_usable()


def database_unavailable(request: HttpRequest, exc: BaseException) -> HttpResponse | None:
    """The answer to a request the database could not serve: 503, in the API's error shape
    under /api/, else a short page; None for any other error. Nothing was written: the
    statement that failed never committed."""
    if not database_down(exc):
        return None
    log.warning("database unavailable: %s %s: %s", request.method, request.path[:200], exc)
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": "database unavailable: try again shortly"}, status=503)
    else:
        response = HttpResponse(render_to_string("503.html"), status=503)
    response["Retry-After"] = RETRY_AFTER
    response["Cache-Control"] = "no-store"
    return response


def forbidden(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """The 403 page (Django's handler403), saying why."""
    return render(request, "403.html", {"reason": str(exception or "")}, status=403)
