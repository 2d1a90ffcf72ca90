"""Deadlines: a convoy's due time against its forecast. The ticker's scan (`check`) tells the
owner and subscribers once when a convoy becomes at risk (its forecast's 90th percentile lands
after the due time) and once when it becomes overdue; back on track re-arms both. What was
told is kept on the convoy (`Convoy.deadline`), claimed by one conditional update, so two
clusters never tell twice; each change is an event (`convoy.at_risk`, `convoy.overdue`,
`convoy.on_track`)."""

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from convoys.core import forecast
from convoys.core.formatting import convoy_title, duration
from convoys.log.events import record
from convoys.models import CONVOY_OPEN, Convoy, Notification
from convoys.rules import forecasting
from convoys.services import notify

TOLD = {forecast.AT_RISK: Notification.AT_RISK, forecast.OVERDUE: Notification.OVERDUE}
KIND_OF = {
    forecast.AT_RISK: "convoy.at_risk",
    forecast.OVERDUE: "convoy.overdue",
    forecast.ON_TRACK: "convoy.on_track",
}


@dataclass(frozen=True)
class Told:
    convoy_id: str
    state: str  # at-risk, overdue or on-track (re-armed)


def check(now: datetime | None = None) -> list[Told]:
    """Compare every open convoy that has a due time with its forecast; returns what changed."""
    now = now or timezone.now()
    told: list[Told] = []
    for convoy in Convoy.objects.filter(status=CONVOY_OPEN, due_at__isnull=False):
        state, found = forecasting.deadline_of(convoy, now)
        if state in TOLD and state != convoy.deadline:
            if _claim(convoy, state, found, now):
                told.append(Told(convoy.pk, state))
        elif state == forecast.ON_TRACK and convoy.deadline:
            if _claim(convoy, "", found, now):
                told.append(Told(convoy.pk, forecast.ON_TRACK))
    return told


def _claim(convoy: Convoy, state: str, found: forecast.Forecast | None, now: datetime) -> bool:
    """Move the told state from what this scan read to `state` (one conditional update) and,
    when it won, record it and tell people."""
    with transaction.atomic():
        won = Convoy.objects.filter(pk=convoy.pk, deadline=convoy.deadline).update(deadline=state)
        if not won:
            return False
        shown = state or forecast.ON_TRACK
        assert convoy.due_at is not None
        data: dict[str, object] = {
            "due_at": convoy.due_at.isoformat(),
            "was": convoy.deadline or forecast.ON_TRACK,
        }
        if found is not None:
            data["forecast"] = found.as_json()
        record(KIND_OF[shown], convoy_id=convoy.pk, actor="deadlines", data=data)
        if state in TOLD:
            subject, body = message(convoy, state, found, now)
            notify.notify_deadline(convoy, TOLD[state], subject, body, now)
    return True


def message(
    convoy: Convoy, state: str, found: forecast.Forecast | None, now: datetime
) -> tuple[str, str]:
    """The notice's subject and body."""
    assert convoy.due_at is not None
    title = " ".join(convoy_title(convoy.title).split())
    due = f"{convoy.due_at:%Y-%m-%d %H:%M} UTC"
    if state == forecast.OVERDUE:
        late = duration((now - convoy.due_at).total_seconds())
        subject = f"⏰ Convoy overdue: {title}"
        lines = [f"Convoy {convoy.pk} was due {due} and has not landed ({late} late)."]
    else:
        subject = f"⏰ Convoy at risk: {title}"
        lines = [f"Convoy {convoy.pk} is due {due}; its forecast lands after that."]
    if found is not None:
        lines.append(
            f"Forecast: half the time by {found.p50:%Y-%m-%d %H:%M} UTC, nine times in ten by "
            f"{found.p90:%Y-%m-%d %H:%M} UTC ({found.steps} beads in a row still to go, "
            f"{found.samples} samples, {duration(found.median)} a bead)."
        )
    return subject, "\n".join(lines)
