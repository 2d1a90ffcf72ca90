"""API bearer tokens: made here (a write), shown once, stored only as a SHA-256 digest.
The API authenticates with `authenticate`; `manage.py tokens`, the swarm and the admin create,
list and revoke them here. A token stops working when it expires, when its user is
deactivated, and for good when its user's password changes (every token of theirs is deleted:
a leaked password's tokens go with it)."""

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.db.models import Q
from django.db.models.signals import post_save
from django.utils import timezone

from convoys.models import ApiToken
from convoys.services.errors import NotFound, ServiceError

if TYPE_CHECKING:
    from django.contrib.auth.models import User

USED_EVERY = timedelta(minutes=1)  # last_used_at is written at most this often per token


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(user: "User", name: str, expires_at: datetime | None = None) -> str:
    """A new token for `user`, labelled `name`; the only time its text exists."""
    if expires_at is not None and expires_at <= timezone.now():
        raise ServiceError(f"expiry {expires_at.isoformat()} is not in the future")
    token = "cvw_" + secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, name=name, digest=digest(token), expires_at=expires_at)
    return token


def rename_token(token_id: int, name: str) -> None:
    """A token's label; the token, its digest and its user never change."""
    ApiToken.objects.filter(pk=token_id).update(name=name)


def authenticate(token: str) -> "User | None":
    """The active user a live token belongs to, noting when it was used; else None."""
    now = timezone.now()
    row = (
        ApiToken.objects.filter(digest=digest(token))
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .select_related("user")
        .first()
    )
    if row is None or not row.user.is_active:
        return None
    if row.last_used_at is None or row.last_used_at <= now - USED_EVERY:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.user


def tokens_of(username: str | None = None) -> list[ApiToken]:
    rows = ApiToken.objects.select_related("user").order_by("user__username", "created_at", "pk")
    return list(rows.filter(user__username=username) if username else rows)


def revoke(token_id: int) -> ApiToken:
    row = ApiToken.objects.select_related("user").filter(pk=token_id).first()
    if row is None:
        raise NotFound(f"token {token_id} not found")
    row.delete()
    return row


def _password_changed(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    # set_password() leaves the new password on `_password` until save() has finished.
    if not created and getattr(instance, "_password", None) is not None:
        ApiToken.objects.filter(user=instance).delete()


def connect() -> None:
    """Called once from the app's ready()."""
    post_save.connect(_password_changed, sender=get_user_model(), dispatch_uid="convoys.tokens")
