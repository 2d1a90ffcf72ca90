"""When a convoy will land: samples of how long its beads took, and an estimate from them."""

import statistics
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db.models import Min

from convoys.core.formatting import duration
from convoys.models import (
    Bead,
    Dispatch,
)
from convoys.rules.merging import SUBMITTED
from convoys.rules.rows import TrackedRow


class Samples(NamedTuple):
    """How long beads took from their first dispatch to their close (seconds), and whose."""

    seconds: list[float]
    basis: str  # "this convoy" or "its rigs"


# Events after which the samples may differ: a close or reopen, a dispatch.


def samples(tracked_rows: Iterable[TrackedRow]) -> Samples:
    """The convoy's closed beads' times (else, with fewer than three, its rigs' recent ones)."""
    tracked_rows = list(tracked_rows)
    # A submitted bead (closed, waiting for its merge) took its time too.
    closed = [b for b in tracked_rows if b.status in ("closed", SUBMITTED) and b.closed_at]
    started = dict(
        Dispatch.objects.filter(bead_id__in=[b.pk for b in closed], ok=True)
        .values("bead_id")
        .annotate(first=Min("created_at"))
        .values_list("bead_id", "first")
    )
    seconds = [
        (b.closed_at - started[b.pk]).total_seconds()
        for b in closed
        if b.pk in started and b.closed_at > started[b.pk]
    ]
    if len(seconds) >= 3:
        return Samples(seconds, "this convoy")
    rigs = {b.rig_id for b in tracked_rows if b.rig_id}
    recent = (
        Dispatch.objects.filter(rig__in=rigs, ok=True)
        .values("bead_id")
        .annotate(first=Min("created_at"))
        .values_list("bead_id", "first")[:500]
    )
    firsts = dict(recent)
    closes = dict(
        Bead.objects.filter(pk__in=firsts, status="closed").values_list("id", "closed_at")
    )
    seconds = [
        (closes[i] - firsts[i]).total_seconds()
        for i in closes
        if closes[i] and closes[i] > firsts[i]
    ]
    return Samples(seconds, "its rigs")


def estimate(found: Samples, remaining: int, now: datetime) -> dict[str, Any] | None:
    """Median time a bead of this convoy (else of its rigs) took from dispatch to close, times
    the beads left on the critical path; None without samples."""
    if not found.seconds or not remaining:
        return None
    median = statistics.median(found.seconds)
    return {
        "median": duration(median),
        "samples": len(found.seconds),
        "basis": found.basis,
        "eta": now + timedelta(seconds=median * remaining),
    }
