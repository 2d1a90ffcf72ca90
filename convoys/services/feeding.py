"""Feeding: the event-driven feeder, the catch-up pass and the stranded scan.

Every path dispatches through `dispatch.claim`, so running any of them twice, in two
clusters, or racing each other never dispatches a bead twice. One drain runs at a time per
convoy (a lease), and each close event is handled once (a unique marker row).

With a town cap (rules/capacity.py) a freed slot belongs to the head of the town's queue,
not to the convoy whose bead closed: every feeder (close, resume, catch-up, scan) then lands
what is complete and runs `feed_town`, which dispatches queue heads while slots are free.
"""

import logging
import os
import socket
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, Required, TypedDict

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from convoys.log import kinds
from convoys.log.events import last_seq, record
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    CONVOY_CLOSED,
    CONVOY_OPEN,
    Bead,
    Convoy,
    Cursor,
    Dispatch,
    Event,
    HandledEvent,
    Lease,
    TrackedBead,
)
from convoys.rules import breaker, capacity, stranding
from convoys.rules.readiness import ready_beads
from convoys.services import dispatch, leases, staging
from convoys.services.convoys import EMPTY_REASON, check, close_if_complete, get_convoy, set_status
from convoys.services.dispatch import DispatchResult

if TYPE_CHECKING:
    from convoys.services.escalation import Escalated

log = logging.getLogger("convoys.feeding")
HOLDER = f"{socket.gethostname()}:{os.getpid()}"
CATCH_UP_CURSOR = "close-feeder"
EVERY = sys.maxsize  # a close's feed: every ready bead (its convoy's max in flight still holds)


class CloseHandled(TypedDict, total=False):
    """`handle_close_event`: {seq, skipped} or {seq, bead, fed}."""

    seq: Required[int]
    skipped: str  # why nothing was fed
    bead: str | None  # the closed bead
    fed: dict[str, list[str]]  # {convoy id, or "town" with a cap: [bead ids dispatched]}


class CatchUp(TypedDict, total=False):
    """`catch_up`: {skipped}, {seeded} on a first run, else {handled, position[, dispatched]
    [, recovered]}."""

    skipped: str
    seeded: int  # the high-water mark a first run set
    handled: list[int]  # close events handled
    position: int
    dispatched: list[str]  # with a town cap: beads fed into slots no event freed
    recovered: list[str]  # beads whose claims were settled (`recover_dispatches`)
    credits_paid: list[str]  # convoys whose dead drain's credits were paid


class ScanSummary(TypedDict, total=False):
    """`stranded_scan`: {skipped}, or the bead and convoy ids each kind of convoy gave."""

    skipped: str
    dispatched: list[str]
    closed_empty: list[str]
    landed: list[str]
    stuck: list[str]
    escalated: list["Escalated"]  # added by the task (tasks.stranded_scan)
    deadlines: list[str]  # the deadline states told by the task (tasks.stranded_scan)


class Report(NamedTuple):
    """The convoy page's Check: whether it is fine as it is, and one line for the user."""

    ok: bool
    line: str


def holder() -> str:
    return f"{HOLDER}:{id(object())}"


def drain_ttl() -> float:
    """A drain holds its lease for one dispatch at a time (renewed before each), so a killed
    process blocks the convoy for at most one dispatch timeout."""
    timeout: float = settings.CONVOY_DISPATCH_TIMEOUT
    return timeout + 10


def feed_convoy(
    convoy: Convoy, path: str, limit: int | None = None, wait: float = 0.5
) -> list[DispatchResult]:
    """Land the convoy if complete; else dispatch its ready beads by (priority, id), iterating
    past failures: all of them (up to its max in flight) with `limit` None, or `limit`; with
    CONVOY_FEED=one, one. One drain runs per convoy at a time: a caller that finds it busy
    leaves a credit, which the running drain pays before it stops (nobody waits long, so no
    task outlives its timeout behind a lease). Returns the successful dispatch results."""
    me = holder()
    name = f"drain:{convoy.pk}"
    results: list[DispatchResult] = []
    first = True
    while True:
        if not leases.acquire_waiting(name, me, ttl=drain_ttl(), wait=wait):
            if first:  # later rounds only re-check credits that the holder will pay
                Convoy.objects.filter(pk=convoy.pk).update(feed_credit=F("feed_credit") + 1)
            return results
        first = False
        try:
            results += _drain(convoy, path, limit, me, name)
            while True:
                credit = (
                    Convoy.objects.filter(pk=convoy.pk)
                    .values_list("feed_credit", flat=True)
                    .first()
                )
                if not credit:
                    break
                if Convoy.objects.filter(pk=convoy.pk, feed_credit=credit).update(feed_credit=0):
                    results += _drain(convoy, path, credit, me, name)
        finally:
            leases.release(name, me)
        # A credit left between our last look and the release is paid by another round.
        if not Convoy.objects.filter(pk=convoy.pk, feed_credit__gt=0).exists():
            return results
        limit, wait = 0, 0


def _drain(
    convoy: Convoy, path: str, limit: int | None, me: str, name: str
) -> list[DispatchResult]:
    convoy.refresh_from_db()
    if convoy.status != CONVOY_OPEN:
        return []
    if close_if_complete(convoy, actor=path):
        return []
    if capacity.cap():  # a town cap: the slot goes to the head of the town's queue
        return feed_town(path)
    tracked = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    if limit is None:  # a close: every bead it made ready, or one as the original feeds
        limit = 1 if settings.CONVOY_FEED == "ONE" else convoy.max_in_flight or EVERY
    if convoy.max_in_flight:  # every caller, credits and scans too (the claim checks again)
        busy = Bead.objects.filter(pk__in=tracked, status__in=ACTIVE_WORK_STATUSES).count()
        limit = min(limit, convoy.max_in_flight - busy)
    results: list[DispatchResult] = []
    if limit <= 0:
        return results
    candidates = list(ready_beads(Bead.objects.filter(pk__in=tracked)))
    cooling = breaker.cooling_down([b.pk for b in candidates])
    for bead in candidates:
        if bead.pk in cooling:
            continue
        leases.acquire(name, me, ttl=drain_ttl())  # renew: one dispatch at a time
        result = dispatch.dispatch(bead, convoy_id=convoy.pk, path=path)
        if result is None or not result["ok"]:
            continue
        results.append(result)
        if len(results) >= limit:
            break
    if not results:
        log.info("convoy %s: no ready issues to feed", convoy.pk, extra={"convoy": convoy.pk})
    return results


def feed_town(path: str) -> list[DispatchResult]:
    """With a town cap: dispatch the heads of the town's queue while slots are free (a
    failed dispatch frees its slot for the next head: the queue is read again only after a
    lost claim or a failure). Several feeders may run at once, in any process: each claim
    counts the beads in flight under the town lock, so a feeder whose claim is refused
    because the town filled up stops, and one that lost a bead to another feeder tries the
    next. Returns the successful dispatch results."""
    results: list[DispatchResult] = []
    tried: set[str] = set()
    while True:
        snap = capacity.snapshot(heads=True)
        heads = [q for q in snap.queue if q.bead_id not in tried][: snap.free]
        if not heads:
            return results
        filled = 0
        for queued in heads:
            tried.add(queued.bead_id)
            won = dispatch.claim(queued.bead, convoy_id=queued.convoy_id, path=path)
            if won is None:
                if capacity.town_full(queued.bead_id):
                    return results  # the town filled up: whoever frees a slot feeds next
                continue  # taken by another feeder, or its convoy filled up
            result = dispatch.run(won)
            if result["ok"]:
                results.append(result)
                filled += 1
        if filled == snap.free:
            return results  # every slot seen free is filled; later frees have their own events


def handle_close_event(seq: int, path: str = "event") -> CloseHandled:
    """Handle one close event once: feed every open convoy tracking the closed bead."""
    event = Event.objects.filter(seq=seq).first()
    if event is None or event.kind not in kinds.FEEDS:
        return {"seq": seq, "skipped": "not a close event"}
    if not _take(seq):
        return {"seq": seq, "skipped": "already handled"}
    convoys = list(
        Convoy.objects.filter(tracked__bead_id=event.bead_id, status=CONVOY_OPEN)
        .distinct()
        .order_by("id")
    )
    started = timezone.now()
    if capacity.cap():  # land what is complete; the freed slot is the town queue's
        for convoy in convoys:
            close_if_complete(convoy, actor=path)
        fed = {"town": [r["id"] for r in feed_town(path)]}
    else:
        fed = {convoy.pk: [r["id"] for r in feed_convoy(convoy, path)] for convoy in convoys}
    HandledEvent.objects.filter(seq=seq).update(finished=True)
    _time_from_close(event, started, [bead_id for ids in fed.values() for bead_id in ids])
    log.info("close %s of %s: fed %s", seq, event.bead_id, fed, extra={"bead": event.bead_id})
    return {"seq": seq, "bead": event.bead_id, "fed": fed}


def _take(seq: int) -> bool:
    """Whether this caller handles close `seq`: the first, or the one after a handler that
    died mid-feed (not finished within CONVOY_TASK_TIMEOUT): a retried task then feeds what
    the dead one did not reach. Feeding twice is safe (every dispatch claims)."""
    try:
        with transaction.atomic():
            HandledEvent.objects.create(seq=seq, finished=False)
        return True
    except IntegrityError:
        pass
    now = timezone.now()
    stale = now - timedelta(seconds=float(settings.CONVOY_TASK_TIMEOUT))
    return bool(
        HandledEvent.objects.filter(seq=seq, finished=False, handled_at__lt=stale).update(
            handled_at=now
        )
    )


def _unfinished(limit: int) -> list[int]:
    stale = timezone.now() - timedelta(seconds=float(settings.CONVOY_TASK_TIMEOUT))
    rows = HandledEvent.objects.filter(finished=False, handled_at__lt=stale).order_by("seq")
    return list(rows.values_list("seq", flat=True)[:limit])


def handled_closes(seqs: Sequence[int]) -> set[int]:
    """Those of `seqs` whose close needs no handling now: finished, or a live handler's."""
    stale = timezone.now() - timedelta(seconds=float(settings.CONVOY_TASK_TIMEOUT))
    rows = HandledEvent.objects.filter(seq__in=seqs).exclude(finished=False, handled_at__lt=stale)
    return set(rows.values_list("seq", flat=True))


def _time_from_close(event: Event, started: datetime, bead_ids: list[str]) -> None:
    """Keep on each dispatch this close fed how long after the close it was claimed."""
    if not bead_ids:
        return
    fed = Dispatch.objects.filter(
        bead_id__in=bead_ids, created_at__gte=started, since_close_ms__isnull=True
    ).values_list("pk", "created_at")
    for pk, at in fed:
        ms = max((at - event.created_at).total_seconds() * 1000, 0.0)
        Dispatch.objects.filter(pk=pk).update(since_close_ms=ms)


def catch_up(batch: int = 1000) -> CatchUp:
    """Handle close events past the persisted high-water mark. The first run on a database
    with history only seeds the mark."""
    me = holder()
    if not leases.acquire("catch-up", me, ttl=60):
        return {"skipped": "another catch-up is running"}
    try:
        cursor = Cursor.objects.filter(name=CATCH_UP_CURSOR).first()
        if cursor is None:
            mark = last_seq()
            Cursor.objects.get_or_create(name=CATCH_UP_CURSOR, defaults={"position": mark})
            return {"seeded": mark}
        events = list(
            Event.objects.filter(seq__gt=cursor.position)
            .order_by("seq")
            .values_list("seq", "kind")[:batch]
        )
        handled: list[int] = []
        done = handled_closes([seq for seq, kind in events if kind in kinds.FEEDS])
        for seq, kind in events:
            if kind in kinds.FEEDS and seq not in done:
                result = handle_close_event(seq, path="event")
                if "skipped" not in result:
                    handled.append(seq)
        if events:
            Cursor.objects.filter(name=CATCH_UP_CURSOR, position__lt=events[-1][0]).update(
                position=events[-1][0]
            )
        summary: CatchUp = {
            "handled": handled,
            "position": events[-1][0] if events else cursor.position,
        }
        # Closes whose handler died mid-feed (the cursor is past them): fed again here.
        for seq in _unfinished(batch):
            if "skipped" not in handle_close_event(seq, path="event"):
                handled.append(seq)
        summary_credits = pay_orphaned_credits()
        recovered = recover_dispatches()
        if recovered:
            summary["recovered"] = recovered
        if summary_credits:
            summary["credits_paid"] = summary_credits
        if capacity.cap():
            # Slots freed by no event (a worker found dead, the cap raised) are filled here.
            summary["dispatched"] = [r["id"] for r in feed_town("event")]
        return summary
    finally:
        leases.release("catch-up", me)


def pay_orphaned_credits() -> list[str]:
    """Feed the convoys whose drain left credits unpaid: a close that found the drain busy
    leaves a credit for its holder, and a holder that died (kill -9) never pays it. Its
    lease has expired, so this feed takes the drain and pays them. Returns the convoys."""
    now = timezone.now()
    live = Lease.objects.filter(name__startswith="drain:", expires_at__gt=now)
    held = {name.removeprefix("drain:") for name in live.values_list("name", flat=True)}
    owed = Convoy.objects.filter(status=CONVOY_OPEN, feed_credit__gt=0).exclude(pk__in=held)
    paid = []
    for convoy in owed.order_by("pk"):
        feed_convoy(convoy, path="event", wait=0)  # fills, as the close it stands for
        paid.append(convoy.pk)
    return paid


def recover_dispatches(now: datetime | None = None) -> list[str]:
    """Settle the claims whose process died before recording an outcome
    (`dispatch.recover`) and feed the open convoys of the beads it released, at once: they
    are ready again, and no close will feed them. Returns the settled beads."""
    settled = dispatch.recover(now)
    released = sorted({s["id"] for s in settled if s["released"]})
    if released:
        tracking = TrackedBead.objects.filter(bead_id__in=released).values("convoy_id")
        for convoy in Convoy.objects.filter(pk__in=tracking, status=CONVOY_OPEN).order_by("pk"):
            feed_convoy(convoy, path="stranded")
    return [s["id"] for s in settled]


def stranded(now: datetime | None = None) -> list[dict[str, Any]]:
    """Every open convoy, as the original's `gt convoy stranded` lists them (its JSON
    shape, plus kind, cause and reason): feedable, moving (its "stuck" behind work in
    progress), stuck and empty, classified by the one rule in `stranding`."""
    result = []
    for convoy, verdict in stranding.open_verdicts(now, explain=True):
        item: dict[str, Any] = {
            "id": convoy.id,
            "title": convoy.title,
            "tracked_count": verdict.tracked_count,
            "ready_count": len(verdict.ready),
            "ready_issues": verdict.ready,
            "created_at": convoy.created_at.isoformat(),
            "kind": verdict.kind,
            "cause": verdict.code,
            "reason": verdict.detail,
        }
        if convoy.base_branch:
            item["base_branch"] = convoy.base_branch
        result.append(item)
    return result


def stranded_scan(now: datetime | None = None) -> ScanSummary:
    """One dispatch per feedable convoy; land complete ones; close old empty ones quietly."""
    me = holder()
    if not leases.acquire("stranded-scan", me, ttl=max(settings.CONVOY_STRANDED_INTERVAL, 10)):
        return {"skipped": "another scan is running"}
    try:
        now = now or timezone.now()
        summary: ScanSummary = {"dispatched": [], "closed_empty": [], "landed": [], "stuck": []}
        grace = timedelta(seconds=settings.CONVOY_EMPTY_GRACE)
        verdicts = list(stranding.open_verdicts(now))
        town = bool(capacity.cap())
        if town:
            _town_scan(summary, verdicts)
        for convoy, verdict in verdicts:
            if verdict.kind == stranding.FEEDABLE:
                if town:
                    continue  # fed from the town's queue above
                results = feed_convoy(convoy, "stranded", limit=1, wait=0)
                summary["dispatched"] += [r["id"] for r in results]
                if results:
                    _found(convoy, results[0]["id"], len(verdict.ready))
            elif verdict.kind == stranding.EMPTY:
                if now - convoy.created_at >= grace:
                    with transaction.atomic():
                        set_status(convoy, "closed", reason=EMPTY_REASON, actor="stranded")
                    summary["closed_empty"].append(convoy.pk)
            elif verdict.kind == stranding.STUCK:
                if verdict.code == "complete" and close_if_complete(convoy, actor="stranded"):
                    summary["landed"].append(convoy.pk)
                else:
                    summary["stuck"].append(convoy.pk)
        return summary
    finally:
        leases.release("stranded-scan", me)


def _town_scan(summary: ScanSummary, verdicts: Sequence[tuple[Convoy, stranding.Verdict]]) -> None:
    """The scan with a town cap: one pass over the town's queue (one dispatch per feedable
    convoy would jump the queue's order); the first dispatch into a feedable convoy is
    recorded as found, as without a cap."""
    feedable = {c.pk: (c, v) for c, v in verdicts if v.kind == stranding.FEEDABLE}
    for result in feed_town("stranded"):
        summary["dispatched"].append(result["id"])
        convoy_id = (
            Dispatch.objects.filter(bead_id=result["id"], path="stranded")
            .values_list("convoy_id", flat=True)
            .first()
        )
        if convoy_id in feedable:
            convoy, verdict = feedable.pop(convoy_id)
            _found(convoy, result["id"], len(verdict.ready))


def _found(convoy: Convoy, bead_id: str, ready_count: int) -> None:
    with transaction.atomic():
        record(
            "stranded.found",
            convoy_id=convoy.pk,
            actor="stranded",
            data={"title": convoy.title, "dispatched": bead_id, "ready_count": ready_count},
        )


def check_report(convoy_id: str, actor: str = "web") -> Report:
    """The convoy page's Check: a staged convoy is re-checked (re-staged in place); an open
    one lands if complete, else says what it waits for (the one stranded rule).
    Returns (ok, one line for the user)."""
    convoy = get_convoy(convoy_id)
    if convoy.is_staged:
        plan = staging.recheck(convoy.pk, actor=actor)
        if plan.errors:
            return Report(
                False,
                "Re-check found errors; nothing changed: "
                + "; ".join(f.message for f in plan.errors),
            )
        if plan.warnings:
            return Report(False, f"Re-checked {convoy.pk}: {len(plan.warnings)} warning(s) remain.")
        return Report(True, f"Re-checked {convoy.pk}: no warnings, ready to launch.")
    convoy, closed, info = check(convoy.pk, actor=actor)[0]
    if closed:
        return Report(True, f"Landed: all {info['total']} tracked beads are done.")
    if convoy.status == CONVOY_CLOSED:
        return Report(True, f"{convoy.pk} is closed ({convoy.close_reason or 'no reason given'}).")
    verdict = stranding.classify_one(convoy)
    state = verdict.reason if verdict.kind == stranding.MOVING else verdict.label
    if verdict.kind != stranding.MOVING:
        state += f" — {verdict.reason}"
    return Report(False, f"{info['done']}/{info['total']} done, not complete: {state}.")
