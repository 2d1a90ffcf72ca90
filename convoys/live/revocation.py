"""Revoked means revoked on open sockets too: a logout, a password change, a deactivation, a
deleted user, a removed permission or group each tell that user's live sockets, in every web
process (through the channel layer, Redis when there is one), to check their session and
rights afresh (convoys.live.consumers). A socket whose session no longer signs its user in closes;
one whose user may no longer see a topic drops it.

The message goes once the change is committed, so the check reads what it left. A logout names
the session it ended: that session's sockets close without a read. Changes these signals do
not see (a session deleted by hand or expired, a permission row deleted, a change made by
another process on the embedded in-memory layer) reach the sockets at their periodic re-check
(CONVOY_WS_RECHECK).

Sockets never authenticate with an API token (only with the session cookie, convoys.live.wsgate):
deleting a token has no socket to close.
"""

import functools
import hashlib
import logging
from collections.abc import Iterable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete

from convoys.core.ids import group_name

log = logging.getLogger("convoys.live")

REVOKE = "convoy.revoke"
SHRINKING = ("pre_remove", "pre_clear")  # m2m actions that may take rights away


def account_group(user_pk: object) -> str:
    """The channel-layer group every live socket of this user joins."""
    return group_name("account", user_pk)


def session_tag(session_key: str | None) -> str:
    """What a revocation says of a session: a digest, so no session key travels the layer."""
    return hashlib.blake2b((session_key or "").encode(), digest_size=16).hexdigest()


def revoke(user_pks: Iterable[object], ended_session: str | None = None) -> None:
    """Tell the live sockets of these users to check afresh, once the current transaction has
    committed (at once outside one)."""
    pks = sorted({pk for pk in user_pks if pk is not None}, key=str)
    if pks:
        tag = session_tag(ended_session) if ended_session else None
        transaction.on_commit(functools.partial(_send, pks, tag))


def _send(user_pks: list[object], tag: str | None) -> None:
    message = {"type": REVOKE, "session": tag}
    layer = get_channel_layer()
    try:
        for pk in user_pks:
            async_to_sync(layer.group_send)(account_group(pk), message)
    except Exception:
        # A logout or a permission change must never fail for the layer: the sockets' own
        # periodic re-check closes them instead.
        log.exception("could not tell the live sockets of users %s to check again", user_pks)


def _logged_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None:
        revoke([user.pk], ended_session=getattr(request.session, "session_key", None))


def _user_saved(
    sender: Any, instance: Any, created: bool, update_fields: Any, **kwargs: Any
) -> None:
    # A login saves last_login alone: nothing taken away. Any other save may be a new
    # password, a deactivation or a superuser flag removed.
    if not created and not (update_fields and set(update_fields) <= {"last_login"}):
        revoke([instance.pk])


def _user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    revoke([instance.pk])


def _losing(instance: Any, action: str, reverse: bool, pk_set: Any, related: str) -> list[Any]:
    """The owners (users, or groups for a group's permissions) of the rows an m2m change
    removes, seen from either side of the relation (`related`: the other side's name for the
    owners); none when rows are only added."""
    if action not in SHRINKING:
        return []
    if not reverse:
        return [instance.pk]
    if action == "pre_remove":
        return list(pk_set)
    return list(getattr(instance, related).values_list("pk", flat=True))  # all cleared


def _user_rights_changed(
    sender: Any, instance: Any, action: str, reverse: bool, pk_set: Any, **kwargs: Any
) -> None:
    """A user's permissions or groups lose rows."""
    revoke(_losing(instance, action, reverse, pk_set, "user_set"))


def _group_rights_changed(
    sender: Any, instance: Any, action: str, reverse: bool, pk_set: Any, **kwargs: Any
) -> None:
    """A group loses permissions: its members may lose topics."""
    groups = _losing(instance, action, reverse, pk_set, "group_set")
    if groups:
        _revoke_members(groups)


def _group_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    _revoke_members([instance.pk])


def _revoke_members(group_pks: list[Any]) -> None:
    members = get_user_model().objects.filter(groups__in=group_pks)
    revoke(members.values_list("pk", flat=True).distinct())


def connect() -> None:
    """Called once from the app's ready()."""
    user = get_user_model()
    uid = "convoys.live.revocation"
    user_logged_out.connect(_logged_out, dispatch_uid=uid)
    post_save.connect(_user_saved, sender=user, dispatch_uid=uid)
    post_delete.connect(_user_deleted, sender=user, dispatch_uid=uid)
    for through in (user.user_permissions.through, user.groups.through):
        m2m_changed.connect(_user_rights_changed, sender=through, dispatch_uid=uid)
    m2m_changed.connect(_group_rights_changed, sender=Group.permissions.through, dispatch_uid=uid)
    pre_delete.connect(_group_deleted, sender=Group, dispatch_uid=uid)
