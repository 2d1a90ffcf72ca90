"""The clock for the periodic jobs. django-q2's scheduler wakes only every ~30 s and its finest
schedule is one minute, so a thread in each task-cluster process enqueues the catch-up feeder
every CONVOY_FEED_INTERVAL seconds and the stranded scan every CONVOY_STRANDED_INTERVAL
seconds, and with CONVOY_SYNC_SOURCES set a sync pass (convoys/services/sync.py) every
CONVOY_SYNC_INTERVAL seconds. A lease per job keeps several clusters from enqueueing the same
tick twice (and a lease per sync source keeps two passes over one source apart)."""

import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import close_old_connections

from .. import queue
from . import leases

log = logging.getLogger("convoys.ticker")

Job = tuple[str, str, str]  # (name, task path, setting holding its interval in seconds)

JOBS: tuple[Job, ...] = (
    ("catch-up", "convoys.tasks.catch_up", "CONVOY_FEED_INTERVAL"),
    ("time", "convoys.tasks.pass_time", "CONVOY_FEED_INTERVAL"),
    ("stranded-scan", "convoys.tasks.stranded_scan", "CONVOY_STRANDED_INTERVAL"),
    ("digest", "convoys.tasks.send_digests", "CONVOY_DIGEST_INTERVAL"),
)
SYNC_JOB: Job = ("sync", "convoys.services.sync.sync_configured", "CONVOY_SYNC_INTERVAL")


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
                if leases.acquire(f"tick:{name}", holder, ttl=interval * 0.8):
                    enqueue(func, name)
            except Exception:
                log.exception("ticker could not enqueue %s", name)
            finally:
                close_old_connections()
        stop.wait(max(min(due.values()) - time.monotonic(), 0.05))
