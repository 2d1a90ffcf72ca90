"""Notifications: landings (claimed once per completion by `convoys.notify_landing`),
action-needed notices (a parked bead, a stuck convoy's escalation), stored in inboxes and delivered as each user chose per kind
(DeliveryPreference): immediately (a live toast, a browser notification and an e-mail), in
the app only, or, for receipts, quietly in the inbox and in one daily digest e-mail. E-mails
are sent by tasks; a user without an e-mail address gets everything in the app only."""

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime, time, timedelta
from typing import TYPE_CHECKING, NamedTuple

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils import timezone

from convoys.core import forecast
from convoys.core.formatting import convoy_title, duration
from convoys.core.ids import name_problem
from convoys.log import queue
from convoys.log.events import record_many
from convoys.models import (
    SKIPPED,
    Bead,
    Convoy,
    DeliveryPreference,
    Merge,
    Notification,
    Subscription,
    status_symbol,
)
from convoys.rules import forecasting
from convoys.services import hooks
from convoys.services.errors import ServiceError

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger("convoys.notify")
ACTION_NEEDED = Notification.ACTION_NEEDED  # a kind: someone must act (not a receipt)
DIGEST_LIMIT = 200  # receipts listed in one digest e-mail (the rest are counted)


class Recipient(NamedTuple):
    user: "User | None"  # None: an address that names no user
    address: str  # "" for a subscriber
    email: bool  # an e-mail is wanted


def format_duration(delta: timedelta) -> str:
    return duration(delta.total_seconds())


def landing_message(convoy: Convoy, pairs: Sequence[tuple[str, Bead | None]]) -> tuple[str, str]:
    # One header line (titles may hold newlines, which e-mail refuses), within the column.
    subject = f"🚚 Convoy landed: {' '.join(convoy_title(convoy.title).split())}"[:600]
    lines = [f"Convoy {convoy.id} has landed.", "", f"Beads ({len(pairs)}):"]
    for bead_id, bead in pairs:
        status = bead.status if bead else "unknown"
        lines.append(f"  {status_symbol(status)} {bead_id}  {bead.title if bead else ''}".rstrip())
    skipped = [(i, b) for i, b in pairs if b is not None and b.status == SKIPPED]
    if skipped:
        lines += ["", f"Skipped, not needed ({len(skipped)}):"]
        for bead_id, bead in skipped:
            why = f"  ({bead.close_reason})" if bead.close_reason else ""
            lines.append(f"  {bead_id}  {bead.title}{why}".rstrip())
    merges = Merge.objects.filter(bead_id__in=[i for i, _ in pairs], state=Merge.MERGED).order_by(
        "bead_id"
    )
    if merges:
        lines += ["", f"Merges ({len(merges)}):"]
        for merge in merges:
            where = " ".join(p for p in (merge.ref, merge.link) if p) or merge.source
            lines.append(f"  {merge.bead_id}  {where}".rstrip())
    end = convoy.closed_at or timezone.now()
    lines += ["", f"Duration: {format_duration(end - convoy.created_at)}"]
    if convoy.close_reason:
        lines.append(f"Reason: {convoy.close_reason}")
    return subject, "\n".join(lines)


def recipients(convoy: Convoy) -> list[Recipient]:
    """[(user or None, address, wants e-mail)], de-duplicated; a user who may not view
    convoys (or is inactive) is told nothing: the report lists bead ids and titles."""
    result: list[Recipient] = []
    seen_users: set[int] = set()
    for sub in Subscription.objects.filter(
        Q(convoy=convoy) | Q(convoy__isnull=True)
    ).select_related("user"):
        if sub.user_id not in seen_users and sub.user.has_perm("convoys.view_convoy"):
            seen_users.add(sub.user_id)
            result.append(Recipient(sub.user, "", sub.email))
    return result + address_recipients(convoy.notify_addresses(), seen_users)


def address_recipients(
    addresses: Collection[str], seen_users: set[int] | None = None
) -> list[Recipient]:
    """Addresses -> [(user or None, address, wants e-mail)]: an address naming a user (by
    username or e-mail) reaches that user's inbox if they may view convoys; any other address
    is kept as is, and e-mailed when it is an e-mail address. E-mail addresses match whatever
    their case (`Alice@Example.com` is alice@example.com's), so no capital letter turns a
    user who may not view convoys into an outside address that is sent the report."""
    seen_users = set() if seen_users is None else seen_users
    users: dict[str, User] = {}
    result: list[Recipient] = []
    mailboxes = {address.lower() for address in addresses if "@" in address}
    for named in (
        get_user_model()
        .objects.annotate(mailbox=Lower("email"))
        .filter(Q(username__in=addresses) | Q(mailbox__in=mailboxes))
    ):
        users[named.username] = named
        if named.email:
            users[named.email.lower()] = named
    for address in addresses:
        user = users.get(address) or ("@" in address and users.get(address.lower())) or None
        if user is not None:
            if user.pk not in seen_users and user.has_perm("convoys.view_convoy"):
                seen_users.add(user.pk)
                result.append(Recipient(user, address, False))
        else:
            result.append(Recipient(None, address, "@" in address))
    return result


def notify_landed(
    convoy: Convoy, pairs: Sequence[tuple[str, Bead | None]], now: datetime
) -> list[Notification]:
    """A landing (its tracked beads: [(id, Bead or None)]), in the caller's transaction,
    once the caller won the completion stamp (`convoys.notify_landing`)."""
    subject, body = landing_message(convoy, pairs)
    return _deliver(convoy, Notification.LANDED, subject, body, recipients(convoy), now)


def notify_action_needed(convoy: Convoy, subject: str, body: str) -> list[Notification]:
    """Tell the convoy's owner, notify addresses and subscribers that someone must act
    (a parked bead): inbox rows, live events, e-mails, in the caller's transaction."""
    subject = " ".join(subject.split())[:600]
    return _deliver(convoy, ACTION_NEEDED, subject, body, recipients(convoy), timezone.now())


def notify_deadline(
    convoy: Convoy, kind: str, subject: str, body: str, now: datetime
) -> list[Notification]:
    """A convoy at risk or overdue (services/deadlines.py), in the caller's transaction."""
    subject = " ".join(subject.split())[:600]
    return _deliver(convoy, kind, subject, body, recipients(convoy), now)


def notify_escalation(convoy: Convoy, subject: str, body: str, now: datetime) -> list[Notification]:
    """A stuck convoy's escalation (services/escalation.py), in the caller's transaction."""
    subject = " ".join(subject.split())[:600]
    return _deliver(convoy, Notification.ESCALATION, subject, body, recipients(convoy), now)


@transaction.atomic
def notify_closed(convoy: Convoy, address: str) -> list[Notification]:
    """`convoy close --notify ADDR`: tell one address that the convoy closed, and why (the
    original's mail: "🚚 Convoy closed: <title>")."""
    subject = f"🚚 Convoy closed: {' '.join(convoy_title(convoy.title).split())}"[:600]
    body = f"Convoy {convoy.id} has been closed.\n\nReason: {convoy.close_reason}"
    return _deliver(
        convoy, Notification.CLOSED, subject, body, address_recipients([address]), timezone.now()
    )


def _deliver(
    convoy: Convoy,
    kind: str,
    subject: str,
    body: str,
    to: Iterable[Recipient],
    now: datetime,
) -> list[Notification]:
    """Inbox rows for `to` ([(user, address, e-mail?)]), a live event for each user's inbox,
    and the wanted e-mails queued after commit. Runs in the caller's transaction.

    A user's delivery preference for the kind decides: immediate e-mails them (with an
    address), in-app keeps the subscription's e-mail choice for receipts and e-mails no
    action-needed notice, digest e-mails nothing now and marks the row for the next digest
    (no toast either). An address that is no user keeps its e-mail choice."""
    to = list(to)
    prefs = preferences_of([user for user, _, _ in to if user is not None])
    rows = []
    for user, address, email in to:
        digest = False
        if user is not None:
            choice = prefs[user.pk].for_kind(kind)
            has_address = bool(user.email)
            if choice == DeliveryPreference.IMMEDIATE:
                email = has_address
            elif choice == DeliveryPreference.DIGEST:
                email, digest = False, has_address
            elif kind in Notification.ACTION_KINDS:
                email = False
        rows.append(
            Notification(
                user=user,
                address=address,
                convoy=convoy,
                kind=kind,
                subject=subject,
                body=body,
                created_at=now,
                email_wanted=email,
                digest=digest,
            )
        )
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
                    "action_needed": n.action_needed,
                    "title": convoy.title,
                    # no toast nor browser notification: it waits for the digest
                    **({"quiet": True} if quiet(n, prefs) else {}),
                },
            )
            for n in notifications
            if n.user_id
        ]
    )
    queue.send_emails_on_commit([n.pk for n in notifications if n.email_wanted])
    # Outbound webhooks and chat: the convoy's and the town's targets, each recipient's own.
    hooks.notified(
        convoy, kind, subject, body, [n.user_id for n in notifications if n.user_id], now
    )
    return notifications


def send_emails(notification_ids: Iterable[int]) -> int:
    """Send the e-mails of these notifications once each (the stamp is claimed first)."""
    sent = 0
    for note in Notification.objects.filter(
        pk__in=notification_ids, email_wanted=True, emailed_at__isnull=True
    ).select_related("user"):
        to = note.user.email if note.user is not None else note.address
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
def mark_read(user: "User", ids: Iterable[int] | None = None) -> int:
    queryset = Notification.objects.filter(user=user, read_at__isnull=True)
    if ids is not None:
        queryset = queryset.filter(pk__in=ids)
    return queryset.update(read_at=timezone.now())


@transaction.atomic
def subscribe(user: "User", convoy: Convoy | None = None, email: bool = False) -> Subscription:
    sub, _ = Subscription.objects.update_or_create(
        user=user, convoy=convoy, defaults={"email": email}
    )
    return sub


@transaction.atomic
def unsubscribe(user: "User", convoy: Convoy | None = None) -> int:
    return Subscription.objects.filter(user=user, convoy=convoy).delete()[0]


# --- delivery preferences -----------------------------------------------------------------------
class Preference:
    """A user's choices (the defaults without a row)."""

    def __init__(self, row: DeliveryPreference | None = None) -> None:
        self.action_needed = row.action_needed if row else DeliveryPreference.IMMEDIATE
        self.receipts = row.receipts if row else DeliveryPreference.IN_APP

    def for_kind(self, kind: str) -> str:
        return self.action_needed if kind in Notification.ACTION_KINDS else self.receipts


def preferences_of(users: Iterable["User"]) -> dict[int, Preference]:
    """{user id: Preference} for these users (one query)."""
    ids = {u.pk for u in users}
    rows = {p.user_id: p for p in DeliveryPreference.objects.filter(user_id__in=ids)}
    return {pk: Preference(rows.get(pk)) for pk in ids}


def preference(user: "User") -> Preference:
    return preferences_of([user])[user.pk]


def quiet(note: Notification, prefs: Mapping[int, Preference] | None = None) -> bool:
    """Does this notification wait for the digest (no toast, no browser notification)?"""
    if note.user_id is None:
        return False
    pref = (prefs or {}).get(note.user_id) or Preference(
        DeliveryPreference.objects.filter(user_id=note.user_id).first()
    )
    return pref.for_kind(note.kind) == DeliveryPreference.DIGEST


def set_preferences(
    user: "User", *, action_needed: str | None = None, receipts: str | None = None
) -> DeliveryPreference:
    """Change how `user` hears about each kind; a value that is no choice is refused."""
    allowed = {
        "action_needed": dict(DeliveryPreference.ACTION_CHOICES),
        "receipts": dict(DeliveryPreference.RECEIPT_CHOICES),
    }
    wanted = {"action_needed": action_needed, "receipts": receipts}
    changes: dict[str, str] = {}
    for name, value in wanted.items():
        if value is None:
            continue
        if value not in allowed[name]:
            choices = ", ".join(allowed[name])
            shown = value if len(value) <= 40 else value[:40] + "…"
            raise ServiceError(f"{name}: {shown!r} is not one of {choices}")
        changes[name] = value
    with transaction.atomic():
        row, _ = DeliveryPreference.objects.get_or_create(user=user)
        for name, value in changes.items():
            setattr(row, name, value)
        row.save(update_fields=[*changes] or None)
    return row


# --- the daily digest ---------------------------------------------------------------------------
def digest_cutoff(now: datetime) -> datetime:
    """The latest digest time (CONVOY_DIGEST_HOUR:00 UTC) at or before `now`."""
    hour = int(settings.CONVOY_DIGEST_HOUR) % 24
    day = now.astimezone(UTC)
    cutoff = datetime.combine(day.date(), time(hour), tzinfo=day.tzinfo)
    return cutoff if cutoff <= day else cutoff - timedelta(days=1)


def send_digests(now: datetime | None = None) -> int:
    """Send each user with receipts waiting for a digest their daily e-mail, once per digest
    time: a receipt from before the latest CONVOY_DIGEST_HOUR is in that day's digest. The
    user's preference row is claimed with one conditional update in the transaction that
    stamps the receipts, so two clusters send one e-mail. Returns the number sent."""
    now = now or timezone.now()
    cutoff = digest_cutoff(now)
    waiting = Notification.objects.filter(
        digest=True, digested_at__isnull=True, created_at__lt=cutoff
    )
    sent = 0
    for user_id in sorted(set(waiting.values_list("user_id", flat=True))):
        try:
            sent += _send_digest(user_id, cutoff, now)
        except Exception:  # one user's failing mail must not stop the others
            log.exception("digest e-mail for user %s failed", user_id)
    return sent


def _send_digest(user_id: int, cutoff: datetime, now: datetime) -> int:
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None or not user.email or "@" not in user.email or name_problem(user.email):
        return 0
    with transaction.atomic():
        row, _ = DeliveryPreference.objects.get_or_create(user=user)
        last = row.last_digest_at
        if last is not None and last >= cutoff:
            return 0
        won = (
            DeliveryPreference.objects.filter(pk=user.pk, last_digest_at=last)
            if last is not None
            else DeliveryPreference.objects.filter(pk=user.pk, last_digest_at__isnull=True)
        ).update(last_digest_at=now)
        if not won:
            return 0
        notes = list(
            Notification.objects.filter(
                user=user, digest=True, digested_at__isnull=True, created_at__lt=cutoff
            ).order_by("created_at", "id")
        )
        if not notes:
            return 0
        Notification.objects.filter(pk__in=[n.pk for n in notes]).update(digested_at=now)
        subject, body = digest_message(notes, cutoff, deadline_lines(now))
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [user.email])
    return 1


def deadline_lines(now: datetime) -> list[str]:
    """One line per open convoy at risk or overdue (`forecasting.told_q`), the soonest due
    first: the digest lists them."""
    late = Convoy.objects.filter(
        forecasting.told_q(forecast.AT_RISK, now) | forecasting.told_q(forecast.OVERDUE, now)
    ).order_by("due_at", "id")
    return [
        f"{convoy.pk}  {forecast.WORDS[forecasting.told_state(convoy, now)]}, due "
        f"{convoy.due_at:%Y-%m-%d %H:%M} UTC  {' '.join(convoy_title(convoy.title).split())}"
        for convoy in late[:DIGEST_LIMIT]
    ]


def digest_message(
    notes: Sequence[Notification], cutoff: datetime, late: Sequence[str] = ()
) -> tuple[str, str]:
    """The digest e-mail: the receipts waiting, then the convoys at risk or overdue."""
    count = len(notes)
    subject = f"🚚 convoyweb daily digest: {count} receipt{'s' if count != 1 else ''}"
    lines = [f"Receipts up to {cutoff:%Y-%m-%d %H:%M} UTC ({count}):", ""]
    for note in notes[:DIGEST_LIMIT]:
        lines.append(f"{note.created_at:%Y-%m-%d %H:%M}  {note.subject}")
    if count > DIGEST_LIMIT:
        lines.append(f"… and {count - DIGEST_LIMIT} more in your inbox")
    lines += [
        "",
        "Each one is in your inbox. Change how you hear about receipts on the",
        "Subscriptions page.",
    ]
    if late:
        lines += ["", f"Convoys at risk or overdue ({len(late)}):", *(f"  {x}" for x in late)]
    return subject, "\n".join(lines)
