"""What the page views share: who may see or change what (login, then the model permission),
the actor a change is recorded under, and the safe way back after a POST."""

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.http import url_has_allowed_host_and_scheme

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


def back(request: HttpRequest, fallback: str) -> HttpResponse:
    """After a POST: to the form's `next` when it is a page of this site, else `fallback`
    (never to another host, `//evil.example/` included)."""
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return redirect(target)
    return redirect(fallback)
