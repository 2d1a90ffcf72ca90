"""Landing notifications: claimed once per completion, stored in inboxes, e-mailed by a task."""

import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ..events import record_many
from ..formatting import duration
from ..ids import name_problem
from ..models import Convoy, Notification, Subscription, status_symbol
from .errors import NotFound, ServiceError

log = logging.getLogger("convoys.notify")
ACTION_NEEDED = "action_needed"  # a Notification kind: someone must act (not a receipt)


def format_duration(delta):
    return duration(delta.total_seconds())


def landing_message(convoy, pairs):
    # One header line (titles may hold newlines, which e-mail refuses), within the column.
    subject = f"🚚 Convoy landed: {' '.join(convoy.title.split())}"[:600]
    lines = [f"Convoy {convoy.id} has landed.", "", f"Issues ({len(pairs)}):"]
    for bead_id, bead in pairs:
        status = bead.status if bead else "unknown"
        lines.append(f"  {status_symbol(status)} {bead_id}  {bead.title if bead else ''}".rstrip())
    end = convoy.closed_at or timezone.now()
    lines += ["", f"Duration: {format_duration(end - convoy.created_at)}"]
    if convoy.close_reason:
        lines.append(f"Reason: {convoy.close_reason}")
    return subject, "\n".join(lines)


def recipients(convoy):
    """[(user or None, address, wants e-mail)], de-duplicated; a user who may not view
    convoys (or is inactive) is told nothing: the report lists bead ids and titles."""
    result, seen_users = [], set()
    for sub in Subscription.objects.filter(
        Q(convoy=convoy) | Q(convoy__isnull=True)
    ).select_related("user"):
        if sub.user_id not in seen_users and sub.user.has_perm("convoys.view_convoy"):
            seen_users.add(sub.user_id)
            result.append((sub.user, "", sub.email))
    return result + address_recipients(convoy.notify_addresses(), seen_users)


def address_recipients(addresses, seen_users=None):
    """Addresses -> [(user or None, address, wants e-mail)]: an address naming a user (by
    username or e-mail) reaches that user's inbox if they may view convoys; any other address
    is kept as is, and e-mailed when it is an e-mail address."""
    User = get_user_model()
    seen_users = set() if seen_users is None else seen_users
    users, result = {}, []
    for user in User.objects.filter(Q(username__in=addresses) | Q(email__in=addresses)):
        users[user.username] = user
        if user.email:
            users[user.email] = user
    for address in addresses:
        user = users.get(address)
        if user is not None:
            if user.pk not in seen_users and user.has_perm("convoys.view_convoy"):
                seen_users.add(user.pk)
                result.append((user, address, False))
        else:
            result.append((None, address, "@" in address))
    return result


def notify_landing(convoy):
    """Claim the completion stamp with one conditional update; only the winner notifies."""
    from .convoys import tracked_details

    with transaction.atomic():
        now = timezone.now()
        won = Convoy.objects.filter(pk=convoy.pk, completion_notified_at__isnull=True).update(
            completion_notified_at=now
        )
        if won != 1:
            return []
        convoy.refresh_from_db()
        subject, body = landing_message(convoy, tracked_details([convoy])[convoy.pk])
        return _deliver(convoy, Notification.LANDED, subject, body, recipients(convoy), now)


def notify_action_needed(convoy, subject, body):
    """Tell the convoy's owner, notify addresses and subscribers that someone must act
    (a parked bead): inbox rows, live events, e-mails, in the caller's transaction."""
    subject = " ".join(subject.split())[:600]
    return _deliver(convoy, ACTION_NEEDED, subject, body, recipients(convoy), timezone.now())


@transaction.atomic
def notify_closed(convoy, address):
    """`convoy close --notify ADDR`: tell one address that the convoy closed, and why (the
    original's mail: "🚚 Convoy closed: <title>")."""
    subject = f"🚚 Convoy closed: {' '.join(convoy.title.split())}"[:600]
    body = f"Convoy {convoy.id} has been closed.\n\nReason: {convoy.close_reason}"
    return _deliver(
        convoy, Notification.CLOSED, subject, body, address_recipients([address]), timezone.now()
    )


def _deliver(convoy, kind, subject, body, to, now):
    """Inbox rows for `to` ([(user, address, e-mail?)]), a live event for each user's inbox,
    and the wanted e-mails queued after commit. Runs in the caller's transaction."""
    rows = [
        Notification(
            user=user,
            address=address,
            convoy=convoy,
            kind=kind,
            subject=subject,
            body=body,
            created_at=now,
            email_wanted=email,
        )
        for user, address, email in to
    ]
    created = Notification.objects.bulk_create(rows)
    ids = [n.pk for n in created if n.pk is not None]
    if not ids:  # some backends do not return ids from bulk_create
        ids = list(
            Notification.objects.filter(convoy=convoy, kind=kind, created_at=now).values_list(
                "pk", flat=True
            )
        )
    notifications = list(Notification.objects.filter(pk__in=ids))
    record_many(
        [
            dict(
                kind="notification",
                convoy_id=convoy.id,
                data={
                    "user_id": n.user_id,
                    "notification_id": n.pk,
                    "subject": n.subject,
                    "kind": n.kind,
                    "title": convoy.title,
                },
            )
            for n in notifications
            if n.user_id
        ]
    )
    emails = [n.pk for n in notifications if n.email_wanted]
    if emails:
        transaction.on_commit(lambda: _enqueue_emails(emails), robust=True)
    return notifications


def _enqueue_emails(ids):
    from ..tasks import enqueue

    enqueue("convoys.tasks.send_notification_emails", ids, group="email")


def send_emails(notification_ids):
    """Send the e-mails of these notifications once each (the stamp is claimed first)."""
    sent = 0
    for note in Notification.objects.filter(
        pk__in=notification_ids, email_wanted=True, emailed_at__isnull=True
    ).select_related("user"):
        to = note.user.email if note.user_id else note.address
        if not to or "@" not in to or name_problem(to):  # no header injection, no retry loop
            continue
        if not Notification.objects.filter(pk=note.pk, emailed_at__isnull=True).update(
            emailed_at=timezone.now()
        ):
            continue
        try:
            send_mail(note.subject, note.body, settings.DEFAULT_FROM_EMAIL, [to])
            sent += 1
        except Exception:
            log.exception("e-mail for notification %s failed", note.pk)
            Notification.objects.filter(pk=note.pk).update(emailed_at=None)
            raise
    return sent


@transaction.atomic
def mark_read(user, ids=None):
    queryset = Notification.objects.filter(user=user, read_at__isnull=True)
    if ids is not None:
        queryset = queryset.filter(pk__in=ids)
    return queryset.update(read_at=timezone.now())


def watch(username, convoy_id, email=False):
    """`convoy watch`: subscribe a user who may view convoys (as the web does). Returns
    "subscribed", "updated" (the e-mail choice changed) or "already_watching"."""
    from .convoys import get_convoy

    convoy = get_convoy(convoy_id)
    user = _user(username)
    if not (user.is_active and user.has_perm("convoys.view_convoy")):
        raise ServiceError(f"user '{username}' may not view convoys: nothing to watch")
    existing = Subscription.objects.filter(user=user, convoy=convoy).first()
    if existing and existing.email == email:
        return "already_watching"
    subscribe(user, convoy, email=email)
    return "updated" if existing else "subscribed"


def unwatch(username, convoy_id):
    """`convoy unwatch`: True if the user was watching the convoy."""
    from .convoys import get_convoy

    convoy = get_convoy(convoy_id)
    return bool(unsubscribe(_user(username), convoy))


def _user(username):
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"user '{username}' not found")
    return user


@transaction.atomic
def subscribe(user, convoy=None, email=False):
    sub, _ = Subscription.objects.update_or_create(
        user=user, convoy=convoy, defaults={"email": email}
    )
    return sub


@transaction.atomic
def unsubscribe(user, convoy=None):
    return Subscription.objects.filter(user=user, convoy=convoy).delete()[0]
