"""API bearer tokens: made here (a write), shown once, stored only as a SHA-256 digest.
The API authenticates with `digest`; `manage.py tokens create`, the swarm and admin create."""

import hashlib
import secrets
from typing import TYPE_CHECKING

from ..models import ApiToken

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(user: "User", name: str) -> str:
    """A new token for `user`, labelled `name`; the only time its text exists."""
    token = "cvw_" + secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, name=name, digest=digest(token))
    return token


def rename_token(token_id: int, name: str) -> None:
    """A token's label; the token, its digest and its user never change."""
    ApiToken.objects.filter(pk=token_id).update(name=name)
