"""Forge webhooks: /hooks/github, /hooks/gitlab and /hooks/gitea (Forgejo too) say that a
bead's change was opened, merged or abandoned, or how its CI went (docs/api.md).

No login: each forge signs its deliveries its own way (`core.forges`) with its secret
(`CONVOY_GITHUB_SECRET`, `CONVOY_GITLAB_TOKEN`, `CONVOY_GITEA_SECRET`), and a forge whose
secret is unset is refused. Every answer is one line of JSON, and every refusal one warning
line of the `convoys.hooks` log saying why.
"""

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from convoys.core import forges
from convoys.core.forges import Ignored, Report
from convoys.services import merges
from convoys.services.errors import ServiceError

log = logging.getLogger("convoys.hooks")
DELIVERY_MAX = 255  # characters of a delivery id (its column)


@dataclass(frozen=True)
class Forge:
    """How one forge signs, names its event and its delivery, and what its payloads say."""

    name: str
    secret: str  # the setting holding its secret
    signature: tuple[str, ...]  # headers, the first present wins
    event: tuple[str, ...]
    delivery: tuple[str, ...]
    signed: Callable[[bytes, str, str], bool]  # (body, signature, secret)
    read: Callable[[str, object], Report | Ignored]


def _gitlab_signed(body: bytes, token: str, secret: str) -> bool:
    return forges.gitlab_signed(token, secret)  # GitLab sends the token itself, not a digest


GITHUB = Forge(
    "github",
    "CONVOY_GITHUB_SECRET",
    ("X-Hub-Signature-256",),
    ("X-GitHub-Event",),
    ("X-GitHub-Delivery",),
    forges.github_signed,
    forges.github,
)
GITLAB = Forge(
    "gitlab",
    "CONVOY_GITLAB_TOKEN",
    ("X-Gitlab-Token",),
    ("X-Gitlab-Event",),
    ("X-Gitlab-Event-UUID", "Idempotency-Key"),
    _gitlab_signed,
    forges.gitlab,
)
GITEA = Forge(
    "gitea",
    "CONVOY_GITEA_SECRET",
    ("X-Gitea-Signature", "X-Forgejo-Signature"),
    ("X-Gitea-Event", "X-Forgejo-Event"),
    ("X-Gitea-Delivery", "X-Forgejo-Delivery"),
    forges.gitea_signed,
    forges.gitea,
)


@csrf_exempt
@require_POST
def github(request: HttpRequest) -> HttpResponse:
    """A GitHub delivery: `pull_request` and `check_suite` events."""
    return _receive(request, GITHUB)


@csrf_exempt
@require_POST
def gitlab(request: HttpRequest) -> HttpResponse:
    """A GitLab delivery: `Merge Request Hook` and `Pipeline Hook` events."""
    return _receive(request, GITLAB)


@csrf_exempt
@require_POST
def gitea(request: HttpRequest) -> HttpResponse:
    """A Gitea or Forgejo delivery: `pull_request` events."""
    return _receive(request, GITEA)


def _receive(request: HttpRequest, forge: Forge) -> HttpResponse:
    body = _body(request)
    if body is None:
        return _refused(request, forge, 413, f"the body is over {forges.MAX_BODY} bytes")
    unsigned = _unsigned(request, forge, body)
    if unsigned:
        return _refused(request, forge, 401, unsigned)
    event = _header(request, forge.event)
    if not event:
        return _refused(request, forge, 400, f"{forge.event[0]} is missing")
    try:
        said = forge.read(event, json.loads(body))
    except forges.BadPayload as exc:
        return _refused(request, forge, 400, str(exc))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested past the parser
        return _refused(request, forge, 400, "the body is not JSON")
    if isinstance(said, Ignored):
        return _answer({"ignored": said.what}, 202)
    delivery = _header(request, forge.delivery) or _digest(body)
    if len(delivery) > DELIVERY_MAX or not delivery.isprintable():
        return _refused(request, forge, 400, f"{forge.delivery[0]} is not a delivery id")
    try:
        received = merges.receive(forge.name, delivery, said)
    except ServiceError as exc:
        return _refused(request, forge, 400, str(exc))
    if received.duplicate:
        return _answer({"duplicate": True}, 200)
    if not received.beads:
        return _answer({"unknown": True, "branch": said.branch}, 202)
    return _answer({"recorded": received.recorded, "beads": received.beads}, 200)


def _body(request: HttpRequest) -> bytes | None:
    """The raw body, or None past the limit (told by its length before it is read)."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > forges.MAX_BODY:
        return None
    try:
        body = request.body
    except RequestDataTooBig:
        return None
    return body if len(body) <= forges.MAX_BODY else None


def _unsigned(request: HttpRequest, forge: Forge, body: bytes) -> str:
    """Why the delivery is not the forge's, or "" when it is."""
    secret: str = getattr(settings, forge.secret, "")
    if not secret:
        return f"{forge.secret} is not set"
    signature = _header(request, forge.signature)
    if not signature:
        return f"{forge.signature[0]} is missing"
    if not forge.signed(body, signature, secret):
        return f"{forge.signature[0]} is wrong"
    return ""


def _header(request: HttpRequest, names: tuple[str, ...]) -> str:
    for name in names:
        value = request.headers.get(name, "").strip()
        if value:
            return value
    return ""


def _digest(body: bytes) -> str:
    """A delivery without an id is known by its body: the same body twice is one delivery."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _answer(body: dict[str, Any], status: int) -> JsonResponse:
    return JsonResponse(body, status=status)


def _refused(request: HttpRequest, forge: Forge, status: int, why: str) -> JsonResponse:
    """A one-line JSON error, logged once here (not again by django.request)."""
    address = request.META.get("REMOTE_ADDR", "")
    log.warning("%s webhook from %s refused with %s: %s", forge.name, address, status, why)
    response = _answer({"error": why}, status)
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response
