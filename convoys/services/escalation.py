"""Escalation of stuck convoys, which stops when someone acknowledges it.

Progress, read from the event log: a `bead.closed` event of a bead the convoy tracks, or
its `bead.dispatched` event when no `dispatch.failed` of the bead follows it (a dispatch
that failed moved nothing). A convoy's clock starts at its latest start (`convoy.created`,
`.imported`, `.launched` or `.reopened` event; its creation time when the log has none) and
restarts at each progress event. An open convoy with tracked work left whose clock reads
CONVOY_STUCK_AFTER seconds or more is stuck (whatever it waits on: a gate, a blocker, a
pause, a parked bead, or a worker busy on one bead for that long). Empty convoys and
complete ones are left to the stranded scan, which closes or lands them.

A stuck convoy raises one action-needed notification (kind `escalation`) to its owner, its
notify addresses and its subscribers (those who may view convoys), naming the cause of each
unfinished bead (convoys/rules/causes.py: blocked, gated, paused, circuit-broken, working, ...). Unacknowledged, it is raised again every CONVOY_REESCALATE_AFTER seconds,
at most MAX_REESCALATIONS times. Acknowledging it (the convoy page, the inbox, `convoy ack`,
`POST /api/convoys/{id}/ack`) stops it; progress after it starts a fresh cycle.

Each step is claimed with one conditional UPDATE (or the row's primary key for the first),
in the transaction that writes the notifications, so two task clusters scanning at once
notify once.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, Max, OuterRef, Subquery
from django.utils import timezone

from convoys.core.formatting import duration
from convoys.core.ids import text_problem
from convoys.log.events import record
from convoys.models import CONVOY_OPEN, Convoy, Escalation, Event, Notification, TrackedBead
from convoys.rules import causes as causemod
from convoys.services import notify
from convoys.services.convoys import get_convoy
from convoys.services.errors import NotFound, ServiceError

if TYPE_CHECKING:
    from django.contrib.auth.models import User

CLOSED, DISPATCHED = "bead.closed", "bead.dispatched"
DONE_KINDS = (CLOSED, "bead.merged")  # a bead done: closed, or (merging by mr) merged
# What undoes a dispatch: it failed, or the catch-up released it (services.dispatch.recover).
UNDONE = ("dispatch.failed", "dispatch.abandoned", "dispatch.released")
START_KINDS = ("convoy.created", "convoy.imported", "convoy.launched", "convoy.reopened")
MAX_REESCALATIONS = 2
MAX_NOTIFICATIONS = 1 + MAX_REESCALATIONS
BATCH = 500  # convoys a progress query covers
CAUSE_LINES = 12  # at most this many cause lines in a notification (then "and N more")

# A bead's cause as convoys/rules/causes.py decides it: {"kind": ..., "text": ..., ...}.
Cause = Mapping[str, Any]


class Escalated(TypedDict):
    """One notification `escalate_stuck` sent."""

    id: str  # the convoy
    escalation: int  # 1..MAX_NOTIFICATIONS
    causes: list[str]  # the lines it gave


def stuck_after() -> timedelta:
    return timedelta(seconds=float(settings.CONVOY_STUCK_AFTER))


def reescalate_after() -> timedelta:
    return timedelta(seconds=float(settings.CONVOY_REESCALATE_AFTER))


def last_progress(convoys: Iterable[Convoy]) -> dict[str, datetime]:
    """{convoy id: when it last made progress} (see the module doc): two queries a batch of
    BATCH convoys, each an aggregate the database computes (the latest progress event of each
    tracked bead found through the event log's bead index), whatever the number of beads."""
    result = {c.pk: c.created_at for c in convoys}
    ids = list(result)
    for start in range(0, len(ids), BATCH):
        part = ids[start : start + BATCH]
        starts = (
            Event.objects.filter(convoy_id__in=part, kind__in=START_KINDS)
            .values_list("convoy_id")
            .annotate(at=Max("created_at"))
        )
        events = Event.objects.filter(bead_id=OuterRef("bead_id")).order_by("-seq")
        closed = events.filter(kind__in=DONE_KINDS)
        # A dispatch that failed (a `dispatch.failed` of the bead after it) is no progress.
        failed = Event.objects.filter(
            bead_id=OuterRef("bead_id"), kind__in=UNDONE, seq__gt=OuterRef("seq")
        )
        dispatched = events.filter(kind=DISPATCHED).exclude(Exists(failed))
        moved = (
            TrackedBead.objects.filter(convoy_id__in=part)
            .values_list("convoy_id")
            .annotate(
                closed=Max(Subquery(closed.values("created_at")[:1])),
                dispatched=Max(Subquery(dispatched.values("created_at")[:1])),
            )
        )
        for convoy_id, *times in [*starts, *moved]:
            for at in times:
                if at is not None:
                    result[convoy_id] = max(result[convoy_id], at)
    return result


@dataclass
class State:
    """What a page shows of a convoy's escalation."""

    row: Escalation
    current: bool  # about the stall the convoy is in now (no progress since, still open)

    @property
    def open(self) -> bool:
        """Escalated, not acknowledged, still stuck: the Acknowledge button shows."""
        return self.current and self.row.acknowledged_at is None

    @property
    def acknowledged(self) -> bool:
        return self.current and self.row.acknowledged_at is not None

    def as_json(self) -> dict[str, Any]:
        row = self.row
        return {
            "stuck_since": row.progress_at.isoformat(),
            "escalations": row.count,
            "max_escalations": MAX_NOTIFICATIONS,
            "escalated_at": row.escalated_at.isoformat(),
            "causes": list(row.causes),
            "current": self.current,
            "acknowledged_at": row.acknowledged_at.isoformat() if row.acknowledged_at else None,
            "acknowledged_by": row.acknowledged_by,
        }


class Inbox(NamedTuple):
    action: list[Notification]  # someone must act; an escalation carries `escalation_state`
    receipts: list[Notification]


class Acknowledged(NamedTuple):
    state: State
    changed: bool  # False: it was acknowledged already


def states(convoys: Iterable[Convoy]) -> dict[str, State]:
    """{convoy id: State} for those of `convoys` that were ever escalated."""
    convoys = list(convoys)
    rows = {e.convoy_id: e for e in Escalation.objects.filter(convoy__in=convoys)}
    if not rows:
        return {}
    escalated = [c for c in convoys if c.pk in rows]
    progress = last_progress(escalated)
    return {
        c.pk: State(
            rows[c.pk], c.status == CONVOY_OPEN and progress[c.pk] <= rows[c.pk].progress_at
        )
        for c in escalated
    }


def state(convoy: Convoy) -> State | None:
    return states([convoy]).get(convoy.pk)


def state_json(convoy: Convoy) -> dict[str, Any] | None:
    found = state(convoy)
    return found.as_json() if found else None


def inbox(user: "User", limit: int = 200) -> Inbox:
    """(action needed, receipts): the user's latest notifications of each kind, newest
    first; each escalation carries `escalation_state` (a State, or None)."""
    base = Notification.objects.filter(user=user).select_related("convoy")
    action = list(base.filter(kind__in=Notification.ACTION_KINDS)[:limit])
    receipts = list(base.exclude(kind__in=Notification.ACTION_KINDS)[:limit])
    escalated = {n.convoy_id: n.convoy for n in action if n.kind == Notification.ESCALATION}
    found = states([c for c in escalated.values() if c is not None])
    for note in action:
        current = found.get(note.convoy_id) if note.convoy_id is not None else None
        # a read-model attribute for the inbox's template, not a field
        note.escalation_state = current  # type: ignore[attr-defined]
    return Inbox(action, receipts)


# --- the scan -----------------------------------------------------------------------------------
def escalate_stuck(now: datetime | None = None) -> list[Escalated]:
    """Escalate every stuck convoy whose next step is due; run by each stranded scan.
    Returns [{"id", "escalation" (1..3), "causes"}] for the notifications this call sent."""
    now = now or timezone.now()
    after = stuck_after()
    candidates = list(Convoy.objects.filter(status=CONVOY_OPEN, created_at__lte=now - after))
    if not candidates:
        return []
    progress = last_progress(candidates)
    rows = {e.convoy_id: e for e in Escalation.objects.filter(convoy__in=candidates)}
    due: list[tuple[Convoy, datetime, Escalation | None, bool]] = []
    for convoy in candidates:
        row = rows.get(convoy.pk)
        since = progress[convoy.pk]
        if row is not None and row.progress_at > since:  # a trimmed log never goes back
            since = row.progress_at
        if now - since < after:
            continue
        if row is None or row.progress_at < since:
            due.append((convoy, since, row, True))
        elif (
            row.acknowledged_at is None
            and row.count < MAX_NOTIFICATIONS
            and now - row.escalated_at >= reescalate_after()
        ):
            due.append((convoy, since, row, False))
    if not due:
        return []
    causes_of = _causes([convoy.pk for convoy, *_ in due], now)
    sent: list[Escalated] = []
    for convoy, since, row, fresh in due:
        found = causes_of[convoy.pk]
        if not found:
            continue  # empty or complete: the stranded scan closes or lands it
        causes = cause_lines(found)
        merging = all(cause["kind"] == causemod.WAITING_TO_MERGE for cause in found.values())
        with transaction.atomic():
            count = _claim(convoy, since, row, fresh, causes, now)
            if count:
                _notify(convoy, since, count, causes, now, merging)
        if count:
            sent.append({"id": convoy.pk, "escalation": count, "causes": causes})
    return sent


def _causes(convoy_ids: Sequence[str], now: datetime) -> dict[str, dict[str, Cause]]:
    """{convoy id: {bead id: cause}} of the unfinished beads of these convoys, loaded at once
    (convoys/rules/causes.py reads a fixed number of queries whatever the number of beads)."""
    tracking = TrackedBead.objects.filter(convoy_id__in=convoy_ids)
    rows = list(tracking.values_list("convoy_id", "bead_id"))
    found = causemod.load(list(dict.fromkeys(b for _, b in rows)), tracking.values("bead_id"), now)
    result: dict[str, dict[str, Cause]] = {convoy_id: {} for convoy_id in convoy_ids}
    for convoy_id, bead_id in rows:
        if bead_id in found:
            result[convoy_id][bead_id] = found[bead_id]
    return result


def _claim(
    convoy: Convoy,
    since: datetime,
    row: Escalation | None,
    fresh: bool,
    causes: list[str],
    now: datetime,
) -> int:
    """Take the next step with one conditional write; the notification number, or 0 when
    another scan took it first."""
    if fresh and row is None:
        try:
            with transaction.atomic():
                Escalation.objects.create(
                    convoy=convoy, progress_at=since, count=1, escalated_at=now, causes=causes
                )
        except IntegrityError:  # another cluster created it
            return 0
        return 1
    assert row is not None  # only a fresh escalation has no row yet
    same = Escalation.objects.filter(
        pk=convoy.pk,
        progress_at=row.progress_at,
        count=row.count,
        escalated_at=row.escalated_at,
    )
    if fresh:
        won = same.update(
            progress_at=since,
            count=1,
            escalated_at=now,
            causes=causes,
            acknowledged_at=None,
            acknowledged_by="",
        )
        return 1 if won else 0
    won = same.filter(acknowledged_at__isnull=True).update(
        count=F("count") + 1, escalated_at=now, causes=causes
    )
    return row.count + 1 if won else 0


def cause_lines(found: Mapping[str, Cause]) -> list[str]:
    """Why the convoy's unfinished beads are not moving ({bead id: cause}, from
    convoys/rules/causes.py): a summary ("1 gated, 2 working"), then one line per bead, in the
    order kinds are decided, at most CAUSE_LINES of them."""
    order = {kind: n for n, kind in enumerate(causemod.KINDS)}
    beads = sorted(found.items(), key=lambda item: order.get(item[1]["kind"], len(order)))
    lines = [causemod.summary(found)]
    lines += [
        f"{bead_id} ({causemod.word(cause['kind'])}): {cause.get('text', '')}".rstrip(": ")
        for bead_id, cause in beads[:CAUSE_LINES]
    ]
    if len(beads) > CAUSE_LINES:
        lines.append(f"and {len(beads) - CAUSE_LINES} more")
    return lines


def _notify(
    convoy: Convoy,
    since: datetime,
    count: int,
    causes: Sequence[str],
    now: datetime,
    merging: bool = False,
) -> None:
    """`merging`: every bead not done waits for its merge, and the notice says so."""
    title = " ".join(convoy.title.split())
    stalled = duration((now - since).total_seconds())
    stuck = f"waiting to merge for {stalled}" if merging else "stuck"
    if count == 1:
        subject = f"⚠ Convoy {stuck}: {title}"
    else:
        subject = f"⚠ Convoy still {stuck} (notice {count} of {MAX_NOTIFICATIONS}): {title}"
    lines = [
        f"Convoy {convoy.pk} has made no progress for {stalled} "
        f"(no bead closed, merged or dispatched since {since:%Y-%m-%d %H:%M} UTC).",
        "",
        "Why it is not moving:",
        *(f"  - {line}" for line in causes),
        "",
        "Acknowledge it to stop these reminders: the Acknowledge button on the convoy page "
        f"or in your inbox, `python manage.py convoy ack {convoy.pk}`, or "
        f"POST /api/convoys/{convoy.pk}/ack.",
    ]
    if count < MAX_NOTIFICATIONS:
        hours = duration(reescalate_after().total_seconds())
        lines.append(
            f"Unacknowledged, it is raised again in {hours} "
            f"(this is notice {count} of {MAX_NOTIFICATIONS}: the first and at most "
            f"{MAX_NOTIFICATIONS - 1} reminders)."
        )
    else:
        lines.append(f"This is the last notice ({count} of {MAX_NOTIFICATIONS}).")
    record(
        "convoy.escalated",
        convoy_id=convoy.pk,
        actor="escalation",
        data={
            "title": convoy.title,
            "escalation": count,
            "stuck_since": since.isoformat(),
            "causes": causes,
        },
    )
    notify.notify_escalation(convoy, subject, "\n".join(lines), now)


# --- acknowledgement ----------------------------------------------------------------------------
def acknowledge(convoy_id: str, *, actor: str, now: datetime | None = None) -> Acknowledged:
    """Stop a convoy's escalation. Returns (State, changed): acknowledging twice changes
    nothing; a convoy that is not escalated now (never, or it moved since) is refused."""
    problem = text_problem(convoy_id)
    if problem:  # no row holds one (and the database would refuse the lookup)
        raise NotFound(f"convoy id {problem}: no such convoy")
    convoy = get_convoy(convoy_id)
    now = now or timezone.now()
    with transaction.atomic():
        # The row lock makes a scan's claim on it wait for this commit (and this wait for one).
        list(Escalation.objects.select_for_update().filter(pk=convoy.pk))
        found = state(convoy)
        if found is None or not found.current:
            raise ServiceError(f"convoy {convoy.pk} is not escalated: nothing to acknowledge")
        if found.row.acknowledged_at is not None:
            return Acknowledged(found, False)
        Escalation.objects.filter(pk=convoy.pk).update(acknowledged_at=now, acknowledged_by=actor)
        record(
            "convoy.acknowledged",
            convoy_id=convoy.pk,
            actor=actor,
            data={"title": convoy.title, "escalations": found.row.count},
        )
        # Handled: nobody needs to read the reminders any more.
        Notification.objects.filter(
            convoy=convoy, kind=Notification.ESCALATION, read_at__isnull=True
        ).update(read_at=now)
        found.row.refresh_from_db()
    return Acknowledged(found, True)
