"""Operator controls that prove they took effect: pause and resume a convoy, and the
dispatch circuit breaker (park a bead after failed dispatches in a row; `retry` clears it).

The claim in `dispatch` enforces both, so no path feeds a paused convoy or retries a parked
bead. The proof of a pause is read from the dispatch records, not from the flag.
"""

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ..events import record
from ..models import CONVOY_CLOSED, CONVOY_OPEN, Bead, Convoy, Dispatch, TrackedBead
from .convoys import get_convoy
from .errors import NotFound, ServiceError

REASON_LIMIT = 500


def pause(convoy_id, *, actor, reason=""):
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
            return convoy, False
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
    return convoy, True


def resume(convoy_id, *, actor):
    """Resume a paused convoy and feed it once right after the commit. Returns
    (convoy, changed, results of that feed pass)."""
    with transaction.atomic():
        convoy = get_convoy(convoy_id, lock=True)
        if not convoy.paused_at:
            return convoy, False, []
        paused = pause_summary(convoy)
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
    from .feeding import feed_convoy

    return convoy, True, feed_convoy(convoy, "event") if convoy.status == CONVOY_OPEN else []


def pause_summary(convoy):
    """Who paused the convoy, when, why, and the proof: how many of its beads were
    dispatched since (from the dispatch records, by any path). None when not paused."""
    if not convoy.paused_at:
        return None
    tracked = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    since = Dispatch.objects.filter(
        Q(bead_id__in=tracked) | Q(convoy_id=convoy.pk), created_at__gte=convoy.paused_at
    )
    return {
        "by": convoy.paused_by,
        "at": convoy.paused_at,
        "reason": convoy.pause_reason,
        "dispatches_since": since.count(),
    }


def pause_json(convoy):
    summary = pause_summary(convoy)
    if summary is None:
        return None
    return {**summary, "at": summary["at"].isoformat()}


def breaker_tripped(bead_id, title, convoy_id, error):
    """Record that the breaker parked a bead and tell the people of each open convoy tracking
    it that someone must act. Runs in the failing dispatch's transaction."""
    from .notify import notify_action_needed

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


def retry(bead_id, *, actor):
    """Close the breaker of a parked bead: every path may dispatch it again (the cooldown
    still applies). Returns (bead, changed)."""
    with transaction.atomic():
        bead = Bead.objects.select_for_update().filter(pk=bead_id).first()
        if bead is None:
            raise NotFound(f"bead '{bead_id}' not found")
        if not bead.dispatch_failures:
            return bead, False
        failures = bead.dispatch_failures
        Bead.objects.filter(pk=bead_id).update(dispatch_failures=0)
        bead.dispatch_failures = 0
        record(
            "bead.retried",
            bead_id=bead_id,
            actor=actor,
            data={"title": bead.title, "failures": failures, "status": bead.status},
        )
    return bead, True


def last_error(bead):
    failed = Dispatch.objects.filter(bead_id=bead.pk, ok=False).order_by("-created_at").first()
    return failed.error if failed else ""


def parked_among(bead_ids):
    """{bead id: failed dispatches in a row} of the parked beads among `bead_ids`."""
    from .dispatch import parked_beads

    return dict(parked_beads().filter(pk__in=bead_ids).values_list("pk", "dispatch_failures"))


def is_parked(bead):
    from .dispatch import max_failures

    return bead.dispatch_failures >= max_failures()
