"""`manage.py cluster`: the django-q2 task cluster plus the ticker thread that drives the
catch-up feeder (every CONVOY_FEED_INTERVAL s) and the stranded scan (CONVOY_STRANDED_INTERVAL).

Stopping: SIGTERM or SIGINT, sent to this process or to its whole process group (systemd's
default KillMode=control-group, supervisord's stopasgroup, Procfile runners, Ctrl-C), all stop
it the same way, within the task timeout (CONVOY_TASK_TIMEOUT):
  1. the ticker stops enqueueing;
  2. the cluster stops pulling tasks, and hands the ones it pulled but has not started back to
     the broker (another cluster, or this one after a restart, runs each once);
  3. running tasks finish (each is bounded by the task timeout) and are acknowledged once.
The cluster's processes (sentinel, workers, pusher, monitor) live in a process group of their
own, so a signal to this command's group reaches only this process, which stops them in that
order. Left to django-q2, a group SIGTERM killed the workers mid-task (re-run later) and left
this process blocked on a lock its dead sentinel held, still enqueueing ticks nothing ran. On
Linux they die with this process if it is killed outright (kill -9); elsewhere they stay in
this process's group.
"""

import logging
import multiprocessing
import os
import queue
import signal
import socket
import threading
import time
import uuid
from argparse import ArgumentParser
from multiprocessing.synchronize import Event
from typing import Any

from django import db
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django_q import cluster as q_cluster
from django_q.humanhash import humanize
from django_q.signing import SignedPackage

from convoys.infra import processes
from convoys.services import ticker

log = logging.getLogger("convoys.cluster")  # one JSON object a line with LOG_FORMAT=json

POLL = 0.2


class Sentinel(q_cluster.Sentinel):  # type: ignore[misc]  # django-q2 ships no types
    """django-q2's sentinel, in its own process group, handing queued tasks back on stop."""

    def __init__(
        self, stop_event: Event, start_event: Event, cluster_id: uuid.UUID, parent_pid: int
    ) -> None:
        if processes.die_with_parent(parent_pid):
            os.setpgid(0, 0)
            me = os.getpid()

            def child_dies_with_me() -> None:
                if os.getppid() == me:  # workers, pusher, monitor; not their own children
                    processes.die_with_parent(me)

            os.register_at_fork(after_in_child=child_dies_with_me)
        super().__init__(stop_event, start_event, cluster_id)

    def stop(self) -> None:
        self.event_out.set()
        while self.pusher.is_alive():
            time.sleep(0.1)
        self.hand_back_queued()
        super().stop()

    def hand_back_queued(self) -> None:
        """Tasks pulled from the broker but not started go back to it (enqueued again, then the
        pulled copy acknowledged: a crash in between duplicates a task, never loses one, and
        every task is idempotent), so a stop waits only for the tasks already running."""
        handed = 0
        while True:
            try:
                task = self.task_queue.get(timeout=POLL)
            except queue.Empty:
                break
            ack_id = task.pop("ack_id")
            task.pop("cluster", None)
            self.broker.enqueue(SignedPackage.dumps(task))
            self.broker.acknowledge(ack_id)
            handed += 1
        if handed:
            log.info("handed %d queued task(s) back to the broker", handed)


class Command(BaseCommand):
    help = "Run the django-q2 task cluster with the convoy ticker (feeder and stranded scan)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--no-ticker",
            action="store_true",
            help="run only the task cluster (another process ticks)",
        )

    def handle(self, *args: Any, no_ticker: bool = False, **options: Any) -> None:
        stopping = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stopping.set())
        timeout = settings.CONVOY_TASK_TIMEOUT
        cluster_id = uuid.uuid4()
        name = humanize(cluster_id.hex)
        context = multiprocessing.get_context("fork")
        stop_event, start_event = context.Event(), context.Event()
        db.connections.close_all()  # the forked processes open their own
        sentinel = context.Process(
            target=Sentinel,
            args=(stop_event, start_event, cluster_id, os.getpid()),
            name=f"Process-{cluster_id.hex}",
        )
        sentinel.start()
        while not (start_event.is_set() or stopping.is_set()):
            if not sentinel.is_alive():
                raise CommandError(f"the task cluster failed to start (exit {sentinel.exitcode})")
            time.sleep(0.1)
        log.info("cluster %s running", name)
        ticker_stop = threading.Event()
        thread = None
        if not (no_ticker or stopping.is_set()):
            holder = f"{socket.gethostname()}:{os.getpid()}"
            thread = threading.Thread(
                target=ticker.run, args=(ticker_stop, holder), name="ticker", daemon=True
            )
            thread.start()
            log.info("ticker started")
        while not stopping.wait(POLL) and sentinel.is_alive():
            pass
        deadline = time.monotonic() + timeout - 1
        ticker_stop.set()
        if thread is not None:
            thread.join(max(deadline - time.monotonic(), POLL))
        if not sentinel.is_alive():
            raise CommandError(f"the task cluster died (exit {sentinel.exitcode})")
        log.info("cluster %s stopping: running tasks finish, queued ones go back", name)
        stop_event.set()
        sentinel.join(max(deadline - time.monotonic(), POLL))
        if sentinel.is_alive():
            log.error("cluster %s did not stop within %ss; killing it", name, timeout)
            if sentinel.pid is not None and os.getpgid(sentinel.pid) == sentinel.pid:
                os.killpg(sentinel.pid, signal.SIGKILL)
            sentinel.kill()
            sentinel.join()
            raise CommandError("stopped by force; killed tasks are re-run by the broker")
        log.info("cluster %s has stopped", name)
