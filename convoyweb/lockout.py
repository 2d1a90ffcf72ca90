"""The page django-axes answers with once a username + address pair is locked out: it says
when that pair may try again (the cool-off runs from the last counted failure)."""

from typing import Any

from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone


def locked_out(
    request: HttpRequest, original_response: HttpResponse | None, credentials: dict[str, Any] | None
) -> HttpResponse:
    username = get_client_username(request, credentials) or ""
    last_failure = (
        AccessAttempt.objects.filter(
            username=username, ip_address=getattr(request, "axes_ip_address", None)
        )
        .order_by("-attempt_time")
        .values_list("attempt_time", flat=True)
        .first()
    )
    retry_at = (last_failure or timezone.now()) + get_cool_off(request)
    context = {
        "username": username,
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "retry_at": retry_at,
    }
    return render(request, "registration/locked_out.html", context, status=429)


def attempted_username(request: HttpRequest | None, credentials: dict[str, Any] | None) -> str:
    """The username an attempt is counted under, as stored by axes (a 255-character column):
    NUL removed (PostgreSQL refuses it) and cut to the column, so a hostile username is a
    failed login, never a database error."""
    field = getattr(settings, "AXES_USERNAME_FORM_FIELD", "username")
    value = (credentials or {}).get(field)
    if value is None and request is not None:
        value = request.POST.get(field, "")
    return str(value or "").replace("\x00", "")[:255]
