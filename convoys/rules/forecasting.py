"""When a convoy will land: samples of how long its beads took, and the forecast from them
(`core.forecast`), for a convoy page (`estimate`) and for what is kept of a convoy
(`for_convoy`: the deadline check, the dashboard)."""

from collections.abc import Iterable
from datetime import datetime
from typing import Any, NamedTuple

from django.db.models import Min, Q

from convoys.core import forecast
from convoys.core.formatting import duration
from convoys.models import (
    CONVOY_CLOSED,
    CONVOY_OPEN,
    Bead,
    Convoy,
    ConvoyFacts,
    Dispatch,
    TrackedBead,
)
from convoys.rules.merging import SUBMITTED
from convoys.rules.rows import TrackedRow, read_rows

SAMPLES_READ = 2000  # closed beads read for a kept convoy's samples


class Samples(NamedTuple):
    """How long beads took from their first dispatch to their close (seconds), and whose."""

    seconds: list[float]
    basis: str  # "this convoy" or "its rigs"


# Events after which the samples may differ: a close or reopen, a dispatch.


def samples(tracked_rows: Iterable[TrackedRow]) -> Samples:
    """The convoy's closed beads' times (else its rigs' recent ones: `forecast.pool`)."""
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
    rigs = {b.rig_id for b in tracked_rows if b.rig_id}
    chosen, own = forecast.pool(seconds, lambda: _rigs_recent(rigs))
    return Samples(chosen, "this convoy" if own else "its rigs")


def _rigs_recent(rigs: set[str]) -> list[float]:
    """The times of the rigs' `forecast.WIDER` most recently dispatched beads that closed."""
    recent = (
        Dispatch.objects.filter(rig__in=rigs, ok=True)
        .values("bead_id")
        .annotate(first=Min("created_at"))
        .order_by("-first")
        .values_list("bead_id", "first")[: forecast.WIDER]
    )
    firsts = dict(recent)
    closes = dict(
        Bead.objects.filter(pk__in=firsts, status="closed").values_list("id", "closed_at")
    )
    return [
        (closes[i] - firsts[i]).total_seconds()
        for i in closes
        if closes[i] and closes[i] > firsts[i]
    ]


def estimate(
    found: Samples,
    remaining: int,
    now: datetime,
    convoy: Convoy | None = None,
    left: int = 0,
) -> dict[str, Any] | None:
    """When the convoy lands: the 50th (`eta`) and 90th (`p90`) percentiles of its forecast
    (`core.forecast`: the convoy's own bead times, else its rigs', resampled over the
    `remaining` critical path or the `left` beads over its max in flight, whichever is
    longer), and what that says of its due time (`deadline`); None without samples."""
    width = convoy.max_in_flight if convoy is not None else None
    steps = forecast.steps_left(remaining, left or remaining, width)
    found_forecast = forecast.forecast(
        found.seconds, steps, now, convoy.pk if convoy is not None else ""
    )
    if found_forecast is None or not remaining:
        return None
    return {
        "median": duration(found_forecast.median),
        "samples": found_forecast.samples,
        "basis": found.basis,
        "eta": found_forecast.p50,
        "p90": found_forecast.p90,
        "steps": found_forecast.steps,
        "forecast": found_forecast,
    }


def for_convoy(convoy: Convoy, now: datetime) -> forecast.Forecast | None:
    """A convoy's forecast from what is kept of it (`ConvoyFacts`: its counts and critical
    path) and its beads' times: the deadline check and the dashboard ask this."""
    facts = ConvoyFacts.objects.filter(pk=convoy.pk).first()
    if facts is None or not facts.critical:
        return None
    tracking = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    rows = read_rows(Bead.objects.filter(pk__in=tracking, status="closed")[:SAMPLES_READ])
    if len(rows) < 3:
        rows |= read_rows(Bead.objects.filter(pk__in=tracking))
    found = samples(rows.values())
    left = facts.total - facts.done
    steps = forecast.steps_left(len(facts.critical), left, convoy.max_in_flight)
    return forecast.forecast(found.seconds, steps, now, convoy.pk)


def deadline_of(convoy: Convoy, now: datetime) -> tuple[str, forecast.Forecast | None]:
    """What a convoy's due time says now (`core.forecast.deadline_state`) and the forecast it
    rests on ("" and None without a due time; a landed convoy's forecast is None)."""
    if convoy.due_at is None:
        return "", None
    if convoy.status == CONVOY_CLOSED:
        landed = convoy.closed_at if convoy.landed else None
        return forecast.deadline_state(convoy.due_at, now, None, landed or now), None
    found = for_convoy(convoy, now)
    return forecast.deadline_state(convoy.due_at, now, found, None), found


def open_deadlines(now: datetime) -> list[tuple[Convoy, str, forecast.Forecast | None]]:
    """(convoy, deadline state, forecast) of every open convoy that has a due time, the
    soonest due first."""
    convoys = Convoy.objects.filter(status=CONVOY_OPEN, due_at__isnull=False).order_by("due_at")
    return [(c, *deadline_of(c, now)) for c in convoys]


def told_q(state: str, now: datetime) -> Q:
    """The convoys in a deadline state by what the deadline scan last told
    (`Convoy.deadline`, `services.deadlines`) and the clock: overdue is an open convoy past
    its due time; at risk, one the scan found at risk and not yet due; on track, the rest
    that have a due time; "none", the convoys without one; any other word, every convoy."""
    due = Q(due_at__isnull=False, status=CONVOY_OPEN)
    overdue = due & Q(due_at__lt=now)
    at_risk = due & Q(deadline=forecast.AT_RISK) & ~overdue
    if state == forecast.OVERDUE:
        return overdue
    if state == forecast.AT_RISK:
        return at_risk
    if state == forecast.ON_TRACK:
        return due & ~overdue & ~at_risk
    if state == "none":
        return Q(due_at__isnull=True)
    return Q()


def told_state(convoy: Convoy, now: datetime) -> str:
    """The dashboard row's deadline word: `told_q`'s rule for one convoy ("" none)."""
    if convoy.due_at is None or convoy.status != CONVOY_OPEN:
        return ""
    if convoy.due_at < now:
        return forecast.OVERDUE
    return forecast.AT_RISK if convoy.deadline == forecast.AT_RISK else forecast.ON_TRACK
