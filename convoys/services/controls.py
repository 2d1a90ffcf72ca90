"""Operator controls that prove they took effect: pause and resume a convoy, `retry` a bead
parked by the dispatch circuit breaker (rules/breaker.py), and the town's cap set at run
time (rules/capacity.py).

The claim in `dispatch` enforces all three, so no path feeds a paused convoy, retries a parked
bead or passes the cap. The proof of a pause is read from the dispatch records, not from the
flag. Resuming a convoy or raising the cap feeds at once (services/feeding.py).
"""

from datetime import datetime
from typing import Any, NamedTuple, TypedDict

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from convoys.core.formatting import person
from convoys.core.parsing import whole_number
from convoys.log.events import record
from convoys.models import (
    CONVOY_CLOSED,
    CONVOY_OPEN,
    Bead,
    Convoy,
    Dispatch,
    TownSetting,
    TrackedBead,
)
from convoys.rules import capacity
from convoys.services.convoys import get_convoy
from convoys.services.dispatch import DispatchResult
from convoys.services.errors import NotFound, ServiceError
from convoys.services.feeding import feed_convoy, feed_town

REASON_LIMIT = 500


class Paused(NamedTuple):
    convoy: Convoy
    changed: bool  # False: it was paused already


class Resumed(NamedTuple):
    convoy: Convoy
    changed: bool  # False: it was not paused
    fed: list[DispatchResult]  # the feed pass right after the commit


class Retried(NamedTuple):
    bead: Bead
    changed: bool  # False: its breaker was closed


class CapSet(NamedTuple):
    old: int
    new: int
    fed: list[DispatchResult]  # dispatched at once when the change left more room


class PauseSummary(TypedDict):
    by: str
    at: datetime
    reason: str
    dispatches_since: int  # the proof: dispatches of its beads since the pause, by any path


def pause(convoy_id: str, *, actor: str, reason: str = "") -> Paused:
    """Pause a convoy: from this commit on, no path dispatches its beads. Returns
    (convoy, changed): pausing a paused convoy changes nothing."""
    reason = " ".join((reason or "").split())
    if len(reason) > REASON_LIMIT:
        raise ServiceError(f"reason: at most {REASON_LIMIT} characters ({len(reason)} given)")
    with transaction.atomic():
        # FOR UPDATE waits for claims in flight (they hold the row FOR KEY SHARE), so every
        # dispatch after `paused_at` was refused, which `status` shows.
        convoy = get_convoy(convoy_id, lock=True)
        if convoy.status == CONVOY_CLOSED:
            raise ServiceError(f"convoy {convoy.pk} is closed: nothing to pause")
        if convoy.paused_at:
            return Paused(convoy, False)
        now = timezone.now()
        convoy.paused_at, convoy.paused_by, convoy.pause_reason = now, actor, reason
        convoy.updated_at = now
        convoy.save(update_fields=["paused_at", "paused_by", "pause_reason", "updated_at"])
        record(
            "convoy.paused",
            convoy_id=convoy.pk,
            actor=actor,
            data={"title": convoy.title, "reason": reason, "status": convoy.status},
        )
    return Paused(convoy, True)


def resume(convoy_id: str, *, actor: str) -> Resumed:
    """Resume a paused convoy and feed it once right after the commit. Returns
    (convoy, changed, results of that feed pass)."""
    with transaction.atomic():
        convoy = get_convoy(convoy_id, lock=True)
        if not convoy.paused_at:
            return Resumed(convoy, False, [])
        paused = pause_summary(convoy)
        assert paused is not None  # paused_at is set
        convoy.paused_at, convoy.paused_by, convoy.pause_reason = None, "", ""
        convoy.updated_at = timezone.now()
        convoy.save(update_fields=["paused_at", "paused_by", "pause_reason", "updated_at"])
        record(
            "convoy.resumed",
            convoy_id=convoy.pk,
            actor=actor,
            data={
                "title": convoy.title,
                "status": convoy.status,
                "paused_by": paused["by"],
                "paused_at": paused["at"].isoformat(),
                "dispatches_since_pause": paused["dispatches_since"],
            },
        )
    return Resumed(
        convoy, True, feed_convoy(convoy, "event") if convoy.status == CONVOY_OPEN else []
    )


def pause_summary(convoy: Convoy) -> PauseSummary | None:
    """Who paused the convoy, when, why, and the proof: how many of its beads were
    dispatched since (from the dispatch records, by any path). None when not paused, or when
    closed: a closed convoy dispatches nothing, so its pause holds nothing back."""
    if not convoy.paused_at or convoy.status == CONVOY_CLOSED:
        return None
    tracked = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    since = Dispatch.objects.filter(
        Q(bead_id__in=tracked) | Q(convoy_id=convoy.pk), created_at__gte=convoy.paused_at
    )
    return {
        "by": person(convoy.paused_by),  # a person, whichever entry they paused it from
        "at": convoy.paused_at,
        "reason": convoy.pause_reason,
        "dispatches_since": since.count(),
    }


def pause_json(convoy: Convoy) -> dict[str, Any] | None:
    summary = pause_summary(convoy)
    if summary is None:
        return None
    return {**summary, "at": summary["at"].isoformat()}


def retry(bead_id: str, *, actor: str) -> Retried:
    """Close the breaker of a parked bead: every path may dispatch it again (the cooldown
    still applies). Returns (bead, changed)."""
    with transaction.atomic():
        bead = Bead.objects.select_for_update().filter(pk=bead_id).first()
        if bead is None:
            raise NotFound(f"bead '{bead_id}' not found")
        if not bead.dispatch_failures:
            return Retried(bead, False)
        failures = bead.dispatch_failures
        Bead.objects.filter(pk=bead_id).update(dispatch_failures=0)
        bead.dispatch_failures = 0
        record(
            "bead.retried",
            bead_id=bead_id,
            actor=actor,
            data={"title": bead.title, "failures": failures, "status": bead.status},
        )
    return Retried(bead, True)


def parse_cap(text: object) -> int:
    """A cap typed by an operator: a whole number from 0 (unlimited) to capacity.CAP_LIMIT."""
    text = str(text).strip()
    cap = whole_number(text, most=capacity.CAP_LIMIT)
    if cap is None:
        raise ServiceError(
            f"cap: a whole number from 0 (unlimited) to {capacity.CAP_LIMIT:,} ({text[:40]!r} given)"
        )
    return cap


def set_cap(value: object, *, actor: str) -> CapSet:
    """Override the town's cap at run time (None: back to CONVOY_MAX_IN_FLIGHT), recorded as a
    `capacity.changed` event; a value that is no cap is refused (`parse_cap`). When it leaves
    more room the town is fed at once. Returns (old cap, new cap, dispatch results)."""
    wanted = None if value is None else parse_cap(value)
    with transaction.atomic():
        capacity.lock_town()  # claims in flight finish counting under the old cap first
        old = capacity.cap()
        waiting = sorted({q.convoy_id for q in capacity.queue()}) if old else []
        if wanted is None:
            TownSetting.objects.filter(pk=capacity.SETTING).delete()
        else:
            TownSetting.objects.update_or_create(
                pk=capacity.SETTING,
                defaults={"value": wanted, "set_by": actor, "set_at": timezone.now()},
            )
        new = capacity.cap()
        if new != old:
            record("capacity.changed", actor=actor, data={"old": old, "new": new})
    results: list[DispatchResult] = []
    if old and (not new or new > old):  # more room: the queue moves now
        if new:
            results = feed_town("event")
        else:  # no cap any more: each convoy that waited is fed as a close would feed it
            for convoy in Convoy.objects.filter(pk__in=waiting):
                results += feed_convoy(convoy, "event")
    return CapSet(old, new, results)
