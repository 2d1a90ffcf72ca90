"""Dispatch: claim a bead with one conditional update, then call the dispatcher.

Only the caller whose UPDATE matched the row it read wins; a second feeder, cluster or scan
racing it updates zero rows and walks away (no lock held across the dispatcher's call, and
no double dispatch however many feeders race). A failed dispatch
releases the claim, and the bead cools down before it is tried again.

Two operator controls are enforced here, so every path (launch, close, catch-up, scan, sling)
obeys them: a bead tracked by a paused convoy is not claimed, and a bead whose dispatch
failed CONVOY_MAX_DISPATCH_FAILURES times in a row is parked (rules/breaker.py) until
retried.
The town's cap on beads in flight (rules/capacity.py) is enforced here too: with a cap set,
a claim takes the town lock first, then counts the beads in flight in its own transaction.
"""

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypedDict

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from convoys.core.logids import bound
from convoys.infra.dispatchers import Dispatcher, Outcome, get_dispatcher
from convoys.log import queue
from convoys.log.events import record, record_many
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    CONVOY_CLOSED,
    CONVOY_OPEN,
    Bead,
    Convoy,
    Dispatch,
    TrackedBead,
    Worker,
)
from convoys.rules import breaker, capacity
from convoys.rules.readiness import worker_dead
from convoys.services import hooks
from convoys.services.notify import notify_action_needed

log = logging.getLogger("convoys.dispatch")

WORKER_NAMES = (
    "nux",
    "slit",
    "furiosa",
    "capable",
    "toast",
    "dag",
    "ace",
    "max",
    "rictus",
    "morsov",
    "keeper",
    "cheedo",
    "organic",
    "coma",
    "valkyrie",
)
SPIN_LIMIT = 3


@dataclass
class Claim:
    bead_id: str
    title: str
    rig: str | None  # None: a bead of no rig (town level)
    convoy_id: str
    worker: str
    path: str
    dispatch_id: int
    previous_status: str


class DispatchResult(TypedDict):
    """One dispatch attempt as the feeders, `sling` and the API report it."""

    id: str
    title: str
    rig: str | None
    worker: str  # "" when the dispatch failed
    ok: bool
    error: str


def paused_convoys(bead_id: str, convoy_id: str = "") -> list[str]:
    """Ids of the paused convoys that track `bead_id` or that the dispatch is for.

    Called inside the claim's transaction. On PostgreSQL the convoy rows are read FOR KEY
    SHARE: a pause locks its row FOR UPDATE, so a claim in flight holds the pause back until
    it commits, and a claim that starts while a pause is in flight waits for it and then
    reads it (other claims and counter updates of the row do not wait). SQLite runs write
    transactions one at a time (IMMEDIATE), which gives the same order."""
    holders = Q(pk__in=TrackedBead.objects.filter(bead_id=bead_id).values("convoy_id"))
    if convoy_id:
        holders |= Q(pk=convoy_id)
    query = Convoy.objects.filter(holders).order_by("pk").values_list("pk", "paused_at")
    if connection.vendor != "postgresql":
        return [pk for pk, paused_at in query if paused_at]
    sql, params = query.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql + " FOR KEY SHARE", params)
        return [pk for pk, paused_at in cursor.fetchall() if paused_at]


def full_convoys(bead: Bead, convoy_id: str = "") -> list[tuple[str, int]]:
    """(id, limit) of the open convoys tracking `bead` (or that the dispatch is for) whose
    `max_in_flight` its claim would exceed: every path claims, so the limit holds on all.

    Called inside the claim's transaction. The capped convoys' rows are locked (FOR NO KEY
    UPDATE on PostgreSQL; SQLite runs write transactions one at a time), so two claims for one
    convoy count in turn. A dead worker's bead taken over is in flight already: not counted."""
    holders = Q(pk__in=TrackedBead.objects.filter(bead_id=bead.pk).values("convoy_id"))
    if convoy_id:
        holders |= Q(pk=convoy_id)
    capped = (
        Convoy.objects.filter(holders, status=CONVOY_OPEN, max_in_flight__isnull=False)
        .order_by("pk")
        .select_for_update(no_key=True)
    )
    full = []
    for pk, limit in capped.values_list("pk", "max_in_flight"):
        if limit is None:  # excluded by the filter; the type of the column allows it
            continue
        tracked = TrackedBead.objects.filter(convoy_id=pk).values("bead_id")
        busy = Bead.objects.filter(pk__in=tracked, status__in=ACTIVE_WORK_STATUSES)
        if busy.exclude(pk=bead.pk).count() >= limit:
            full.append((pk, limit))
    return full


@transaction.atomic
def refusal(bead: Bead, convoy_id: str = "") -> str:
    """Why a claim of `bead` came back empty, in words for the caller's report."""
    full = full_convoys(bead, convoy_id)
    if full:
        return "; ".join(f"convoy {pk} at max in flight ({limit})" for pk, limit in full)
    town = capacity.town_full(bead.pk)
    if town:
        return capacity.refusal_text(town)
    return "claimed by another dispatcher"


def pick_worker(rig: str | None) -> str:
    busy = set(
        Bead.objects.filter(
            status__in=ACTIVE_WORK_STATUSES, assignee__startswith=f"{rig}/"
        ).values_list("assignee", flat=True)
    )
    round_ = 0
    while True:
        for name in WORKER_NAMES:
            candidate = f"{rig}/polecats/{name}" + (f"-{round_}" if round_ else "")
            if candidate not in busy:
                return candidate
        round_ += 1


@transaction.atomic
def claim(
    bead: Bead,
    convoy_id: str = "",
    path: str = "manual",
    actor: str = "feeder",
    forced: bool = False,
) -> Claim | None:
    """Claim `bead` as read by the caller; return a Claim, or None if someone else won.
    `forced`: sent past open blockers by `sling --force` (recorded on the attempt).
    Nobody wins a bead held by a paused convoy, one at its max in flight, or parked by the
    breaker, nor any bead while the town is at its cap."""
    town_cap = capacity.cap()
    if town_cap:
        capacity.lock_town()  # before any row lock: claims of the town count in turn
    if paused_convoys(bead.pk, convoy_id) or full_convoys(bead, convoy_id):
        return None
    now = timezone.now()
    if town_cap and capacity.town_full(bead.pk, now, limit=town_cap):
        return None
    target = Bead.objects.filter(
        pk=bead.pk,
        status=bead.status,
        assignee=bead.assignee,
        dispatch_failures__lt=breaker.max_failures(),
    )
    if bead.status != "open" or bead.assignee:
        # Only work whose worker is dead may be taken over; a live worker keeps it.
        if bead.status not in ("open", *ACTIVE_WORK_STATUSES) or not bead.assignee:
            return None
        target = target.filter(worker_dead(now))
    worker = pick_worker(bead.rig_id)
    won = target.update(status="hooked", assignee=worker, updated_at=now)
    if won != 1:
        return None
    Worker.objects.update_or_create(name=worker, defaults={"rig": bead.rig_id, "last_seen": now})
    attempt = Dispatch.objects.create(
        bead_id=bead.pk,
        convoy_id=convoy_id,
        # A bead of no rig is never ready (readiness.ready_q); one sent anyway fails NOT NULL
        rig=bead.rig_id,  # type: ignore[misc]
        worker=worker,
        path=path,
        forced=forced,
        created_at=now,
        held_until=now + claim_grace(),
    )
    record(
        "bead.dispatched",
        bead_id=bead.pk,
        convoy_id=convoy_id,
        actor=actor,
        data={
            "status": "hooked",
            "assignee": worker,
            "title": bead.title,
            "rig": bead.rig_id,
            "path": path,
            "old_status": bead.status,
            "previous_assignee": bead.assignee,
            **({"forced": True} if forced else {}),
        },
    )
    hooks.bead_event(
        "dispatched",
        bead,
        [convoy_id] if convoy_id else [],
        {"status": "hooked", "assignee": worker, "rig": bead.rig_id},
    )
    return Claim(bead.pk, bead.title, bead.rig_id, convoy_id, worker, path, attempt.pk, bead.status)


def claim_grace() -> timedelta:
    return timedelta(seconds=settings.CONVOY_CLAIM_GRACE)


def run(claim_: Claim, dispatcher: Dispatcher | None = None) -> DispatchResult:
    """Call the dispatcher for a claim; record the attempt; release the claim on failure.
    The call is marked started first, by a conditional update: a claim that `recover`
    settled already (its holder seemed dead) is not sent."""
    dispatcher = dispatcher or get_dispatcher()
    started = time.monotonic()
    now = timezone.now()
    held = now + timedelta(seconds=settings.CONVOY_DISPATCH_TIMEOUT) + claim_grace()
    unsettled = Dispatch.objects.filter(pk=claim_.dispatch_id, ok__isnull=True, resolution="")
    if not unsettled.filter(started_at__isnull=True).update(started_at=now, held_until=held):
        return _result(claim_, Outcome(False, "not sent: the claim was released before it ran"))
    with bound(bead=claim_.bead_id, convoy=claim_.convoy_id, worker=claim_.worker):
        return _run(claim_, dispatcher, started)


def hold(claims: Sequence[Claim]) -> None:
    """Renew the claims a caller will run next (a launch runs its claims one by one): they
    are not settled as abandoned while it works through the ones before them."""
    pending = Dispatch.objects.filter(
        pk__in=[c.dispatch_id for c in claims], ok__isnull=True, started_at__isnull=True
    )
    pending.update(held_until=timezone.now() + claim_grace())


def _run(claim_: Claim, dispatcher: Dispatcher, started: float) -> DispatchResult:
    try:
        # no rig: the dispatchers read None and "" alike (`CommandDispatcher.argv`)
        rig = claim_.rig or ""
        outcome = dispatcher.dispatch(claim_.bead_id, rig, claim_.convoy_id, claim_.worker)
    except Exception as exc:  # a broken dispatcher must not stop the others
        log.exception("dispatcher failed for %s", claim_.bead_id)
        outcome = Outcome(False, f"{type(exc).__name__}: {exc}")
    except BaseException as exc:  # the task timeout (SystemExit) or an interrupt: release, stop
        _record(claim_, Outcome(False, f"interrupted: {type(exc).__name__}: {exc}"), started)
        raise
    return _record(claim_, outcome, started)


def _record(claim_: Claim, outcome: Outcome, started: float) -> DispatchResult:
    duration = (time.monotonic() - started) * 1000
    with transaction.atomic():
        Dispatch.objects.filter(pk=claim_.dispatch_id).update(
            ok=outcome.ok, error=outcome.error, output=outcome.output, duration_ms=duration
        )
        if outcome.ok:
            Bead.objects.filter(pk=claim_.bead_id, dispatch_failures__gt=0).update(
                dispatch_failures=0
            )
            record(
                "dispatch.ok",
                bead_id=claim_.bead_id,
                convoy_id=claim_.convoy_id,
                data={"worker": claim_.worker, "path": claim_.path},
            )
        else:
            Bead.objects.filter(pk=claim_.bead_id, status="hooked", assignee=claim_.worker).update(
                status="open", assignee="", updated_at=timezone.now()
            )
            Bead.objects.filter(pk=claim_.bead_id).update(
                dispatch_failures=F("dispatch_failures") + 1
            )
            record(
                "dispatch.failed",
                bead_id=claim_.bead_id,
                convoy_id=claim_.convoy_id,
                data={
                    "status": "open",
                    "assignee": "",
                    "error": outcome.error,
                    "worker": claim_.worker,
                    "path": claim_.path,
                },
            )
            _check_breaker(claim_, outcome)
            if capacity.cap():  # the freed slot goes to the town queue's head
                queue.feed_town_on_commit()
        _check_spin(claim_)
    return _result(claim_, outcome)


def _result(claim_: Claim, outcome: Outcome) -> DispatchResult:
    return {
        "id": claim_.bead_id,
        "title": claim_.title,
        "rig": claim_.rig,
        "worker": claim_.worker if outcome.ok else "",
        "ok": outcome.ok,
        "error": outcome.error,
    }


def _check_breaker(claim_: Claim, outcome: Outcome) -> None:
    """Park the bead when this failure is the one that reaches the limit, and ask its
    convoys' people to act (once: only the failure that lands on the limit does)."""
    failures = Bead.objects.filter(pk=claim_.bead_id).values_list("dispatch_failures", flat=True)
    if failures.first() != breaker.max_failures():
        return
    _park(claim_.bead_id, claim_.title, claim_.convoy_id, outcome.error)


def _park(bead_id: str, title: str, convoy_id: str, error: str) -> None:
    """Record that the breaker parked a bead and tell the people of each open convoy tracking
    it that someone must act. Runs in the failing dispatch's transaction."""
    failures = Bead.objects.filter(pk=bead_id).values_list("dispatch_failures", flat=True)[0]
    record(
        "bead.parked",
        bead_id=bead_id,
        convoy_id=convoy_id,
        data={"title": title, "failures": failures, "error": error},
    )
    convoys = Convoy.objects.filter(
        pk__in=TrackedBead.objects.filter(bead_id=bead_id).values("convoy_id")
    ).exclude(status=CONVOY_CLOSED)
    for convoy in convoys:
        notify_action_needed(
            convoy,
            f"⚠ Dispatch failing: {bead_id} parked",
            f"Dispatching {bead_id} ({' '.join(title.split())}) failed {failures} times in a "
            f"row; it is parked and convoy {convoy.pk} cannot land until it moves.\n\n"
            f"Last error: {error}\n\nFix the cause, then retry it: `beads retry {bead_id}` "
            "or the Retry button on the bead page.",
        )


def _check_spin(claim_: Claim) -> None:
    hour_ago = timezone.now() - timedelta(hours=1)
    count = Dispatch.objects.filter(bead_id=claim_.bead_id, created_at__gte=hour_ago).count()
    if count > SPIN_LIMIT:
        record(
            "spin",
            bead_id=claim_.bead_id,
            convoy_id=claim_.convoy_id,
            data={"dispatches_last_hour": count, "title": claim_.title},
        )


def dispatch(
    bead: Bead,
    convoy_id: str = "",
    path: str = "manual",
    dispatcher: Dispatcher | None = None,
    forced: bool = False,
) -> DispatchResult | None:
    """Claim then run. Returns the result dict, or None when the claim was lost."""
    won = claim(bead, convoy_id=convoy_id, path=path, forced=forced)
    if won is None:
        return None
    return run(won, dispatcher)


class Settled(TypedDict):
    """One attempt `recover` settled."""

    id: str  # the bead
    dispatch: int
    worker: str
    resolution: str  # Dispatch.RESOLUTIONS
    released: bool  # the bead went back to ready


# What a settled attempt records when it changes what the bead shows.
SETTLED_KINDS = {
    "abandoned": "dispatch.abandoned",
    "released": "dispatch.released",
    "confirmed": "dispatch.confirmed",
}


def recover(now: datetime | None = None, limit: int = 500) -> list[Settled]:
    """Settle the attempts whose holder's time ran out (`held_until`) with no outcome: its
    process died between the claim and the dispatcher's call, or during the call. A bead its
    worker moved on (closed) confirms it; else a bead the attempt still holds goes back to
    ready ("abandoned" when the dispatcher was never called: nothing ran;
    "released" when it was: its outcome is unknown). Not a failure: no cooldown, no breaker."""
    now = now or timezone.now()
    due = Dispatch.objects.filter(ok__isnull=True, resolution="", held_until__lt=now)
    settled = []
    for attempt in due.order_by("held_until")[:limit]:
        with transaction.atomic():
            item = _settle(attempt, now)
        if item is not None:
            log.warning(
                "dispatch of %s to %s settled: %s",
                item["id"],
                item["worker"],
                item["resolution"],
                extra={"bead": item["id"], "worker": item["worker"]},
            )
            settled.append(item)
    return settled


def _settle(attempt: Dispatch, now: datetime) -> Settled | None:
    worker = attempt.worker
    bead = Bead.objects.filter(pk=attempt.bead_id).values("status", "assignee").first()
    holds = (
        bead is not None and bead["assignee"] == worker and bead["status"] in ACTIVE_WORK_STATUSES
    )
    # (A worker's heartbeat confirms its attempts itself, `confirm`: its last_seen is no sign
    # here, since a later claim that picks the same name touches it too.)
    if bead is not None and bead["assignee"] == worker and not holds:
        resolution, fields = "confirmed", {"ok": True}  # its worker moved it on (closed it)
    elif attempt.started_at is None:
        resolution, fields = "abandoned", {}
    else:
        resolution, fields = "released", {}
    text = {
        "confirmed": "no answer recorded; its worker moved the bead on, so it ran",
        "abandoned": "not sent: the process that claimed it stopped first",
        "released": "outcome unknown: no answer and no word from the worker in time",
    }[resolution]
    won = Dispatch.objects.filter(pk=attempt.pk, ok__isnull=True, resolution="").update(
        resolution=resolution, error="" if fields else text, output=text, **fields
    )
    if not won:
        return None
    released = False
    if resolution != "confirmed" and holds:
        released = bool(
            Bead.objects.filter(
                pk=attempt.bead_id, assignee=worker, status__in=ACTIVE_WORK_STATUSES
            ).update(status="open", assignee="", updated_at=now)
        )
    if released or (resolution == "confirmed" and holds):
        data: dict[str, object] = {"worker": worker, "path": attempt.path, "reason": text}
        if released:
            data |= {"status": "open", "assignee": ""}
        record(
            SETTLED_KINDS[resolution],
            bead_id=attempt.bead_id,
            convoy_id=attempt.convoy_id,
            data=data,
        )
    return {
        "id": attempt.bead_id,
        "dispatch": attempt.pk,
        "worker": worker,
        "resolution": resolution,
        "released": released,
    }


def confirm(worker: str) -> list[str]:
    """The worker reported: its attempts with no outcome recorded, sent to the dispatcher,
    for the beads it holds now ran (not an older one's: a bead taken over, its name picked
    again; not a claim never sent). Returns their beads."""
    held = Bead.objects.filter(assignee=worker, status__in=ACTIVE_WORK_STATUSES)
    open_ = Dispatch.objects.filter(
        worker=worker,
        ok__isnull=True,
        resolution="",
        started_at__isnull=False,  # a claim never sent has started no worker
        bead_id__in=held.values("pk"),
    )
    beads = list(open_.values_list("bead_id", flat=True))
    if beads:
        open_.update(ok=True, resolution="confirmed", output="its worker reported, so it ran")
        record_many(
            [
                {"kind": "dispatch.confirmed", "bead_id": b, "data": {"worker": worker}}
                for b in sorted(set(beads))
            ]
        )
    return beads
