"""Outbound webhooks and chat: targets (a URL, a secret, a scope, the kinds it wants) and
deliveries (one per target per event, its body kept as sent).

An event is turned into delivery rows in the writer's transaction (`notify._deliver`,
`merges.record`, the dispatch claim) and handed to the task cluster after the commit. Each
attempt claims its row with one conditional update, so two clusters never send one attempt
twice. A 2xx is delivered; anything else (a status of 300 or more, a timeout, a refused
connection, a private address) is tried again after CONVOY_WEBHOOK_RETRY_BASE seconds, then
twice as long each time, for 24 hours. The schedule lives in the row (`next_attempt_at`) and the
ticker's pass (`deliver_due`) picks up whatever is due, so a restarted cluster loses nothing.

An http(s) URL is a Standard Webhooks delivery: webhook-id, webhook-timestamp and
webhook-signature headers signed with the target's secret. Any other scheme is an Apprise URL
(slack://, ntfy://, json://, …): one short message per event. Every target's host is resolved
and every address checked when it is added and before each attempt: no loopback, link-local
or private address unless CONVOY_WEBHOOK_ALLOW_PRIVATE."""

import json
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from standardwebhooks import Webhook

from convoys.core import webhooks as core
from convoys.core.formatting import convoy_title, duration
from convoys.infra import outbound
from convoys.log import queue
from convoys.models import (
    Bead,
    Convoy,
    ConvoyFacts,
    Subscription,
    TrackedBead,
    WebhookDelivery,
    WebhookTarget,
)
from convoys.services.errors import NotFound, ServiceError

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger("convoys.hooks")
CLAIM_SLACK = timedelta(seconds=30)  # a claimed attempt is due again after its timeout + this
RECENT = 10  # deliveries a page shows per target


class Added(NamedTuple):
    target: WebhookTarget
    secret: str  # the generated secret, "" when one was given


# --- targets ------------------------------------------------------------------------------------
def check_url(url: str) -> None:
    """Refuse a URL that can be no target: malformed, unknown to Apprise, or (unless
    CONVOY_WEBHOOK_ALLOW_PRIVATE) reaching a loopback, link-local or private address."""
    problem = core.url_problem(url)
    if problem:
        raise ServiceError(problem)
    where = reach(url)
    if where is not None:
        problem = host_problem(*where)
        if problem:
            raise ServiceError(problem)


def reach(url: str) -> tuple[str, int | None] | None:
    """The host and port a target's deliveries go to (None: a vendor's own public service)."""
    if not core.is_chat(url):
        parts = urlsplit(url)
        return parts.hostname or "", parts.port
    try:
        return outbound.chat_host(url)
    except ValueError as exc:
        raise ServiceError(str(exc))


def host_problem(host: str, port: int | None) -> str | None:
    """Why `host` may not be reached (it resolves to nothing, or to an address refused)."""
    try:
        found = outbound.addresses(host, port)
    except OSError:
        return f"cannot resolve the host '{host[:80]}'"
    return refused(host, found)


def refused(host: str, addresses: list[str]) -> str | None:
    """Why a target may not reach `host` at `addresses` (a private one), or None."""
    if settings.CONVOY_WEBHOOK_ALLOW_PRIVATE:
        return None
    return core.private_problem(host, addresses)


def add_target(
    url: str,
    *,
    user: "User | None" = None,
    convoy_id: str | None = None,
    town: bool = False,
    kinds: str | Iterable[str] | None = None,
    secret: str | None = None,
    actor: str = "",
) -> Added:
    """A new target for exactly one scope: `user`'s own, `convoy_id`'s, or the `town`'s.
    Bad input is a ServiceError naming what is wrong, and nothing is saved."""
    url = url.strip()
    if sum((user is not None, bool(convoy_id), town)) != 1:
        raise ServiceError("a target is for one of: a user, a convoy, the town")
    try:
        wanted = core.parse_kinds(kinds)
    except ValueError as exc:
        raise ServiceError(str(exc))
    chat = core.is_chat(url)
    if secret and chat:
        raise ServiceError("a chat URL takes no secret: only webhooks (http, https) are signed")
    if secret:
        problem = core.secret_problem(secret)
        if problem:
            raise ServiceError(problem)
    convoy = None
    if convoy_id:
        convoy = Convoy.objects.filter(pk=convoy_id).first()
        if convoy is None:
            raise NotFound(f"convoy '{convoy_id[:80]}' not found")
    check_url(url)
    generated = "" if secret or chat else core.new_secret()
    scope = WebhookTarget.USER if user else WebhookTarget.CONVOY if convoy else WebhookTarget.TOWN
    with transaction.atomic():
        target = WebhookTarget.objects.create(
            url=url,
            secret=secret or generated,
            scope=scope,
            user=user,
            convoy=convoy,
            kinds=core.stored_kinds(wanted),
            created_by=actor,
            created_at=timezone.now(),
        )
    return Added(target, generated)


def get_target(target_id: int) -> WebhookTarget:
    target = WebhookTarget.objects.select_related("user").filter(pk=target_id).first()
    if target is None:
        raise NotFound(f"webhook target {target_id} not found")
    return target


@transaction.atomic
def remove_target(target_id: int) -> WebhookTarget:
    target = get_target(target_id)
    target.delete()
    return target


def targets(user: "User | None" = None, *, others: bool = False) -> list[WebhookTarget]:
    """Every target (no user), or `user`'s own and, with `others`, every convoy's and the
    town's."""
    queryset = WebhookTarget.objects.select_related("user")
    if user is not None:
        mine = Q(scope=WebhookTarget.USER, user=user)
        queryset = queryset.filter(mine | ~Q(scope=WebhookTarget.USER) if others else mine)
    return list(queryset.order_by("id"))


def deliveries(target: WebhookTarget, limit: int = 50) -> list[WebhookDelivery]:
    return list(target.deliveries.order_by("-created_at", "-id")[:limit])


def may_manage(user: "User", target: WebhookTarget) -> bool:
    """A user manages their own targets; a convoy's and the town's need change_convoy."""
    if target.scope == WebhookTarget.USER:
        return target.user_id == user.pk
    return user.has_perm("convoys.change_convoy")


# --- events -> deliveries (in the writer's transaction) ---------------------------------------------
def _wanting(kind: str) -> Q:
    return Q(active=True, kinds__contains=f",{kind},")


def _chosen(kind: str, convoy_ids: Sequence[str], user_ids: Iterable[int]) -> list[WebhookTarget]:
    """The active targets that asked for `kind`: the town's, those of `convoy_ids`, and the
    own targets of `user_ids`; each once."""
    scoped = Q(scope=WebhookTarget.TOWN) | Q(scope=WebhookTarget.CONVOY, convoy_id__in=convoy_ids)
    users = list(set(user_ids))
    if users:
        scoped |= Q(scope=WebhookTarget.USER, user_id__in=users)
    return list(WebhookTarget.objects.filter(_wanting(kind)).filter(scoped).order_by("id"))


def _subscribers(convoy_ids: Sequence[str]) -> list[int]:
    """Users subscribed to one of these convoys (or to all) who may view convoys."""
    subs = Subscription.objects.filter(
        Q(convoy_id__in=convoy_ids) | Q(convoy__isnull=True)
    ).select_related("user")
    return [s.user_id for s in subs if s.user.is_active and s.user.has_perm("convoys.view_convoy")]


def convoy_data(convoy: Convoy, now: datetime | None = None) -> dict[str, Any]:
    """What every payload says of a convoy: id, title, status, done/total, how long it ran,
    its page."""
    facts = ConvoyFacts.objects.filter(pk=convoy.pk).first()
    end = convoy.closed_at or now or timezone.now()
    seconds = max((end - convoy.created_at).total_seconds(), 0.0)
    return {
        "id": convoy.pk,
        "title": convoy_title(convoy.title),
        "status": convoy.status,
        "done": facts.done if facts else 0,
        "total": facts.total if facts else 0,
        "duration_s": round(seconds),
        "duration": duration(seconds),
        "url": f"{settings.CONVOY_PUBLIC_URL}/convoys/{quote(convoy.pk, safe='')}/",
    }


def emit(
    kind: str,
    data: dict[str, Any],
    *,
    convoy_ids: Sequence[str] = (),
    user_ids: Iterable[int] = (),
    now: datetime | None = None,
) -> list[WebhookDelivery]:
    """One delivery per target that asked for `kind` (see `_chosen`), queued to go after the
    caller's transaction commits. Nothing is written when no target wants it."""
    chosen = _chosen(kind, convoy_ids, user_ids)
    if not chosen:
        return []
    now = now or timezone.now()
    event_id = core.message_id()
    body = core.payload(kind, now, data)
    rows = WebhookDelivery.objects.bulk_create(
        [
            WebhookDelivery(
                target=target,
                event_id=event_id,
                kind=kind,
                body=body,
                created_at=now,
                next_attempt_at=now,
            )
            for target in chosen
        ]
    )
    ids = [row.pk for row in rows if row.pk is not None] or list(
        WebhookDelivery.objects.filter(event_id=event_id).values_list("pk", flat=True)
    )
    queue.deliver_webhooks_on_commit(ids)
    return rows


def notified(
    convoy: Convoy, kind: str, subject: str, body: str, user_ids: Iterable[int], now: datetime
) -> list[WebhookDelivery]:
    """A notification of `kind` (Notification.kind) about `convoy` told to these users: the
    convoy's and the town's targets, and each user's own."""
    wanted = core.NOTIFICATION_KINDS.get(kind)
    if wanted is None:
        return []
    data = {"kind": wanted, "subject": subject, "body": body, "convoy": convoy_data(convoy, now)}
    return emit(wanted, data, convoy_ids=[convoy.pk], user_ids=user_ids, now=now)


def bead_event(kind: str, bead: Bead, convoy_ids: Sequence[str], extra: dict[str, Any]) -> None:
    """A bead's event (merged, dispatched) for the targets of the convoys tracking it, the
    town's, and those of these convoys' subscribers."""
    if not WebhookTarget.objects.filter(_wanting(kind)).exists():
        return  # the common case: one query, nothing else (the dispatch path is hot)
    convoy_ids = list(convoy_ids) or list(
        TrackedBead.objects.filter(bead_id=bead.pk).values_list("convoy_id", flat=True)
    )
    convoy = Convoy.objects.filter(pk__in=convoy_ids).order_by("-created_at").first()
    data: dict[str, Any] = {
        "kind": kind,
        "bead": {"id": bead.pk, "title": bead.title, "status": bead.status, **extra},
        "convoy": convoy_data(convoy) if convoy else None,
        "convoys": convoy_ids,
    }
    emit(kind, data, convoy_ids=convoy_ids, user_ids=_subscribers(convoy_ids))


# --- sending ------------------------------------------------------------------------------------
def signed_headers(
    target: WebhookTarget, event_id: str, at: datetime, body: bytes
) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt, signed with the library."""
    signature = Webhook(target.secret).sign(event_id, at, body.decode())
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


def send(target: WebhookTarget, event_id: str, body: dict[str, Any]) -> outbound.Sent:
    """One attempt, now: the host checked first (every address), then a signed POST to the
    checked address or one Apprise message."""
    timeout = float(settings.CONVOY_WEBHOOK_TIMEOUT)
    try:
        where = reach(target.url)
    except ServiceError as exc:
        return outbound.Sent(None, 0.0, str(exc), False)
    address, pins = "", {}
    if where is not None:
        host, port = where
        try:
            found = outbound.addresses(host, port)
        except OSError:
            return outbound.Sent(None, 0.0, f"cannot resolve the host '{host[:80]}'", False)
        problem = refused(host, found)
        if problem:
            return outbound.Sent(None, 0.0, problem, False)
        address = found[0]
        pins[host] = address
    if core.is_chat(target.url):
        title, text = core.chat_message(body)
        return outbound.send_chat(target.url, title, text, timeout, pins, refused)
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    headers = signed_headers(target, event_id, timezone.now(), raw)
    return outbound.post(target.url, raw, headers, address, timeout)


def attempt(delivery_id: int, now: datetime | None = None) -> WebhookDelivery | None:
    """Claim one due delivery and try it; None when it is not due or another process took it.
    `now` is the scheduler's clock (tests pass it); the request itself goes out at once."""
    now = now or timezone.now()
    row = (
        WebhookDelivery.objects.select_related("target")
        .filter(pk=delivery_id, delivered_at__isnull=True, gave_up_at__isnull=True)
        .first()
    )
    if row is None or row.next_attempt_at is None or row.next_attempt_at > now:
        return None
    hold = now + timedelta(seconds=float(settings.CONVOY_WEBHOOK_TIMEOUT)) + CLAIM_SLACK
    if not WebhookDelivery.objects.filter(
        pk=row.pk, next_attempt_at=row.next_attempt_at, delivered_at__isnull=True
    ).update(next_attempt_at=hold):
        return None
    return _record(row, send(row.target, row.event_id, row.body), now)


def _record(row: WebhookDelivery, sent: outbound.Sent, now: datetime) -> WebhookDelivery:
    row.attempts += 1
    row.status_code, row.latency_ms, row.error = sent.status, round(sent.latency_ms, 1), sent.error
    row.last_attempt_at = now
    if sent.ok:
        row.delivered_at, row.next_attempt_at, row.gave_up_at = now, None, None
    else:
        base = float(settings.CONVOY_WEBHOOK_RETRY_BASE)
        row.next_attempt_at = core.next_attempt(row.created_at, row.attempts, now, base)
        if row.next_attempt_at is None:
            row.gave_up_at = now
            log.warning(
                "webhook %s to target %s: gave up after %s attempts (%s)",
                row.event_id,
                row.target_id,
                row.attempts,
                row.error,
            )
    row.save(
        update_fields=[
            "attempts",
            "status_code",
            "latency_ms",
            "error",
            "last_attempt_at",
            "delivered_at",
            "next_attempt_at",
            "gave_up_at",
        ]
    )
    return row


def deliver(delivery_ids: Iterable[int], now: datetime | None = None) -> int:
    """The task after a commit: try each of these deliveries that is due. Returns how many
    were delivered."""
    done = 0
    for pk in delivery_ids:
        try:
            row = attempt(pk, now)
        except Exception:  # one target's failure must not stop the others; the pass retries
            log.exception("webhook delivery %s failed", pk)
            continue
        done += bool(row and row.delivered_at)
    return done


def due(now: datetime | None = None, limit: int = 200) -> list[int]:
    now = now or timezone.now()
    return list(
        WebhookDelivery.objects.filter(
            delivered_at__isnull=True, gave_up_at__isnull=True, next_attempt_at__lte=now
        )
        .order_by("next_attempt_at", "id")
        .values_list("pk", flat=True)[:limit]
    )


def deliver_due(now: datetime | None = None) -> int:
    """The ticker's pass: every delivery whose next attempt is due (first tries whose task was
    lost included). Returns how many were delivered."""
    return deliver(due(now), now)


def send_test(target: WebhookTarget, actor: str = "") -> WebhookDelivery:
    """A test event to `target`, sent now (not queued): its delivery row says how it went."""
    now = timezone.now()
    data = {
        "kind": "test",
        "subject": f"Test from convoyweb for target {target.pk}",
        "by": actor,
        "convoy": {
            "id": "",
            "title": "A test message",
            "status": "",
            "done": 0,
            "total": 0,
            "duration": "",
            "url": f"{settings.CONVOY_PUBLIC_URL}/subscriptions/",
        },
    }
    row = WebhookDelivery.objects.create(
        target=target,
        event_id=core.message_id(),
        kind="test",
        body=core.payload("test", now, data),
        created_at=now,
        next_attempt_at=now,
    )
    return attempt(row.pk, now) or row


def redeliver(delivery_id: int) -> WebhookDelivery:
    """Send a delivery again now, with its body and webhook-id as before; a failure goes on
    with the retry schedule while the event's 24 hours last."""
    row = WebhookDelivery.objects.filter(pk=delivery_id).first()
    if row is None:
        raise NotFound(f"webhook delivery {delivery_id} not found")
    now = timezone.now()
    WebhookDelivery.objects.filter(pk=row.pk).update(
        next_attempt_at=now, delivered_at=None, gave_up_at=None
    )
    return attempt(row.pk, now) or WebhookDelivery.objects.get(pk=row.pk)


def users_named(username: str) -> "User":
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"user '{username[:80]}' not found")
    return user
