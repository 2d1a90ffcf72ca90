"""The clock for the periodic jobs. django-q2's scheduler wakes only every ~30 s and its finest
schedule is one minute, so a thread in each task-cluster process enqueues the catch-up feeder
every CONVOY_FEED_INTERVAL seconds and the stranded scan every CONVOY_STRANDED_INTERVAL
seconds, the webhook retries that are due every CONVOY_FEED_INTERVAL seconds, and with CONVOY_SYNC_SOURCES set a sync pass (convoys/services/bdsync/) every
CONVOY_SYNC_INTERVAL seconds. A lease per job keeps several clusters from enqueueing the same
tick twice (and a lease per sync source keeps two passes over one source apart).

The rule "the cluster has stalled" is stated here once (`stalled_since`): no cluster took a
feed tick (`tick:catch-up`, `tick:time`) for STALL_INTERVALS feed intervals. A tick's lease
runs LEASE_SHARE of its interval, so its expiry says when it was taken. /readyz, the
dashboard and `serve` ask it."""

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import close_old_connections, transaction
from django.db.models import Max
from django.utils import timezone

from convoys.log import queue
from convoys.log.events import record
from convoys.models import Cursor, Event, Lease
from convoys.services import leases

log = logging.getLogger("convoys.ticker")

Job = tuple[str, str, str]  # (name, task path, setting holding its interval in seconds)

JOBS: tuple[Job, ...] = (
    ("catch-up", "convoys.tasks.catch_up", "CONVOY_FEED_INTERVAL"),
    ("time", "convoys.tasks.pass_time", "CONVOY_FEED_INTERVAL"),
    ("stranded-scan", "convoys.tasks.stranded_scan", "CONVOY_STRANDED_INTERVAL"),
    ("digest", "convoys.tasks.send_digests", "CONVOY_DIGEST_INTERVAL"),
    ("webhooks", "convoys.tasks.deliver_due_webhooks", "CONVOY_FEED_INTERVAL"),
)
FEED_TICKS = ("tick:catch-up", "tick:time")  # the leases of the jobs on CONVOY_FEED_INTERVAL
LEASE_SHARE = 0.8  # a tick's lease runs this share of its interval
STALL_INTERVALS = 3  # feed intervals without a tick: the cluster has stalled
SYNC_JOB: Job = ("sync", "convoys.services.bdsync.sync_configured", "CONVOY_SYNC_INTERVAL")


def jobs() -> tuple[Job, ...]:
    return (*JOBS, SYNC_JOB) if settings.CONVOY_SYNC_SOURCES else JOBS


def run(
    stop: threading.Event, holder: str, enqueue: Callable[[str, str], object] | None = None
) -> None:
    """Enqueue each job on its interval until `stop` (a threading.Event) is set."""
    if enqueue is None:

        def enqueue(func: str, name: str) -> None:
            queue.enqueue(func, task_name=name, group="ticker")

    due = dict.fromkeys((name for name, _, _ in jobs()), time.monotonic())
    while not stop.is_set():
        now = time.monotonic()
        for name, func, setting in jobs():
            interval = float(getattr(settings, setting))
            if now < due[name]:
                continue
            due[name] = max(due[name] + interval, now + interval / 2)
            try:
                if leases.acquire(f"tick:{name}", holder, ttl=interval * LEASE_SHARE):
                    enqueue(func, name)
            except Exception:
                log.exception("ticker could not enqueue %s", name)
            finally:
                close_old_connections()
        stop.wait(max(min(due.values()) - time.monotonic(), 0.05))


def last_tick() -> datetime | None:
    """When a task cluster (any) last took a feed tick; None if none ever did. One query."""
    expires = Lease.objects.filter(name__in=FEED_TICKS).aggregate(at=Max("expires_at"))["at"]
    if expires is None:
        return None
    interval = float(settings.CONVOY_FEED_INTERVAL)
    tick: datetime = expires - timedelta(seconds=interval * LEASE_SHARE)
    return tick


def stall_after() -> float:
    """Seconds without a feed tick after which the cluster counts as stalled."""
    return float(settings.CONVOY_FEED_INTERVAL) * STALL_INTERVALS


def stalled_since(now: datetime | None = None) -> tuple[bool, datetime | None]:
    """(stalled, last tick): stalled when no cluster took a feed tick for STALL_INTERVALS
    feed intervals, or none ever did (then the last tick is None)."""
    now = now or timezone.now()
    tick = last_tick()
    if tick is None:
        return True, None
    return (now - tick).total_seconds() > stall_after(), tick


# --- children serve started again ----------------------------------------------------------------
RESTARTED = "restarted"  # the Cursor naming the last process.restarted event
RESTART_SHOWN = 600.0  # seconds the dashboard says that a process was started again


def record_restart(process: str, code: int | None, wait: float) -> Event:
    """serve is starting `process` again after it exited with `code`: one event, and the cursor
    the dashboard reads it by (two lookups by key, however long the log)."""
    with transaction.atomic():
        event = record(
            "process.restarted",
            actor="serve",
            data={"process": process, "code": code, "wait": round(wait, 1)},
        )
        Cursor.objects.update_or_create(name=RESTARTED, defaults={"position": event.seq})
    return event


def last_restart(now: datetime | None = None) -> Event | None:
    """The last restart of a process by serve, within RESTART_SHOWN seconds; else None."""
    now = now or timezone.now()
    position = Cursor.objects.filter(name=RESTARTED).values_list("position", flat=True).first()
    if position is None:
        return None
    event = Event.objects.filter(seq=position).first()
    if event is None or (now - event.created_at).total_seconds() > RESTART_SHOWN:
        return None
    return event
