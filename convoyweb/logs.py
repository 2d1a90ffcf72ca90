"""Log lines a machine reads: with LOG_FORMAT=json every process (web, task cluster, swarm, a
command) writes one JSON object a line: time, level, process, pid, logger, message, the ids
involved (convoy, bead, worker, request; convoys/core/logids.py) when there are any, and a
traceback as `exc_info`."""

import logging
import re
import time
import uuid
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from pythonjsonlogger.json import JsonFormatter

from convoys.core.logids import bound

REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")  # a client's X-Request-ID kept as it is
access_log = logging.getLogger("convoyweb.access")
HEARTBEAT = "/api/heartbeat"  # a worker's "I am alive", every few seconds


class Json(JsonFormatter):
    """One object a line, keys in a fixed order, the ids only when there are some."""

    def __init__(self) -> None:
        super().__init__(
            "{asctime}{levelname}{process_name}{process}{name}{message}",
            style="{",
            rename_fields={
                "asctime": "time",
                "levelname": "level",
                "process_name": "process",
                "process": "pid",
                "name": "logger",
            },
            json_ensure_ascii=False,
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{stamp}.{int(record.msecs):03d}Z"


def chatter(request: HttpRequest) -> bool:
    """What a working town asks all the time, logged only with LOG_ACCESS=1 (when it
    succeeded): workers' heartbeats, live pages' fetches, tools polling the API (reads) and
    static files. Every write and every error is logged."""
    path = request.path
    return (
        path == HEARTBEAT
        or request.headers.get("X-Live") == "1"
        or (request.method in ("GET", "HEAD") and path.startswith(("/api/", "/static/")))
    )


class RequestIds:
    """Each request gets an id (the client's `X-Request-ID` when it is a plain token, else a
    new one), answered in `X-Request-ID` and carried by every line logged while it runs. It
    also writes the access line (`convoyweb.webserver` turns daphne's own off), except for
    the chatter of a working town (`chatter`) unless LOG_ACCESS=1."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        asked = request.headers.get("X-Request-ID", "")
        request_id = asked if REQUEST_ID.fullmatch(asked) else uuid.uuid4().hex
        started = time.perf_counter()
        with bound(request=request_id):
            response = self.get_response(request)
            response["X-Request-ID"] = request_id
            if self.logged(request, response):
                access_log.info(
                    "%s %s %s",
                    request.method,
                    request.get_full_path()[:300],
                    response.status_code,
                    extra={
                        "status": response.status_code,
                        "ms": round((time.perf_counter() - started) * 1000, 1),
                    },
                )
        return response

    @staticmethod
    def logged(request: HttpRequest, response: HttpResponse) -> bool:
        if settings.LOG_ACCESS or response.status_code >= 400:
            return True
        return not chatter(request)
