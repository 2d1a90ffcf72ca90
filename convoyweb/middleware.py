"""Middleware of the whole site: no cached copy of what a signed-in user was shown, a 503
(not a 500 after the pool's 30 s) when the database cannot be reached, and the API's wrong
methods answered in JSON like its other errors."""

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.cache import patch_cache_control

from convoys.web.access import database_unavailable

Handler = Callable[[HttpRequest], HttpResponse]


class NoStoreWhenSignedIn:
    """`Cache-Control: no-store, private` on every answer to a request with credentials (a
    session cookie or an Authorization header), so no page or API answer outlives a logout
    in a browser's or a proxy's cache. Decided from the request, not the user lookup: it costs
    no query and a database outage cannot turn it into an error. Static files are answered
    before this (WhiteNoise), and the login page's own rules (never cached) are kept."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if settings.SESSION_COOKIE_NAME in request.COOKIES or "Authorization" in request.headers:
            patch_cache_control(response, no_store=True, private=True)
        return response


class DatabaseUnavailable:
    """A view that could not reach the database answers 503 (`convoys.web.access.database_unavailable`)."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return database_unavailable(request, exception)


class ApiMethodNotAllowed:
    """A 405 under /api/ (django-ninja answers it in plain text) says in JSON, as the API's
    other errors do, which methods the path takes; the Allow header stays."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code != 405 or not request.path.startswith("/api/"):
            return response
        if response.get("Content-Type", "").startswith("application/json"):
            return response
        allowed = response.get("Allow", "")
        detail = (
            f"{(request.method or '')[:10]} is not allowed on {request.path[:200]}; use {allowed}"
        )
        answer = JsonResponse({"detail": detail}, status=405)
        answer["Allow"] = allowed
        return answer
