"""The operator's endpoints: /healthz (the process answers), /readyz (it can serve: database,
channel layer, task cluster, relay) and /metrics (Prometheus). No login: a load balancer and
a scraper have none; /metrics asks for CONVOY_METRICS_TOKEN or an allowed address instead."""

import hmac
import ipaddress

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from convoys.web import health, metrics


@never_cache
@require_safe
def healthz(request: HttpRequest) -> HttpResponse:
    """200 while the process answers; reads nothing."""
    return HttpResponse("ok\n", content_type="text/plain; charset=utf-8")


@never_cache
@require_safe
def readyz(request: HttpRequest) -> HttpResponse:
    """200 with every check, or 503 naming those that fail (`health.readiness`)."""
    ok, body = health.readiness()
    response = JsonResponse(body, status=200 if ok else 503)
    # Polled each second: a 503 here is an answer, not a server error for django.request's
    # log (one ERROR line a second while the cluster is down). The body says what is wrong.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def _allowed_address(request: HttpRequest) -> bool:
    allowed = settings.CONVOY_METRICS_ALLOW
    if not allowed:
        return False
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(a, strict=False) for a in allowed)


def _bearer(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics for a bearer of CONVOY_METRICS_TOKEN or a client in CONVOY_METRICS_ALLOW;
    401 without a token, 403 with a wrong one."""
    token = _bearer(request)
    expected: str = settings.CONVOY_METRICS_TOKEN
    if token is not None:
        if not (expected and hmac.compare_digest(token.encode(), expected.encode())):
            return HttpResponse("forbidden\n", status=403, content_type="text/plain")
    elif not _allowed_address(request):
        response = HttpResponse("a bearer token is needed\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(metrics.render(), content_type=metrics.CONTENT_TYPE)
