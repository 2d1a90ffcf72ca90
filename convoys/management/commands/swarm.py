"""`manage.py swarm --url http://127.0.0.1:8000`: simulated workers for the demo.

A real client of the JSON API (Bearer token, HTTP): it finds beads dispatched to workers,
heartbeats those workers, marks some in progress, and closes each after a while, so the
feeder dispatches the next wave and convoys land. As they land it keeps the demo going:
every --replenish-every seconds it stages and launches a fresh small epic from the demo
templates while fewer than --keep-open convoys are open (convoys/services/demo.py; a direct
service call, since the API has no bulk epic builder). Now and then (--discover-rate) a worker
finds more work while doing a bead and files a follow-up with a discovered-from dependency,
which joins that bead's convoys (also direct service calls: the API creates no beads). Stop it
with Ctrl-C or SIGTERM (it says what it did and exits 0), or leave it out (`serve` without
--swarm). It logs a line a minute of what its workers did and each convoy it launches; every
bead picked up and closed with -v 2.
"""

import json
import logging
import random
import signal
import threading
import time
import urllib.error
import urllib.request
from argparse import ArgumentParser
from types import FrameType
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import close_old_connections, transaction

from convoys.core.formatting import several
from convoys.models import bead_prefix
from convoys.services import beads, demo
from convoys.services.errors import ServiceError
from convoys.services.tokens import create_token

log = logging.getLogger("convoys.swarm")
FOLLOW_UP = "Follow-up: "  # found while doing a bead; follow-ups find nothing more
REPORT_EVERY = 60.0  # seconds between "what the workers did" lines


class Stopped(BaseException):
    """A stop signal was seen (a BaseException, so no `except Exception` swallows it)."""


_stopping = threading.Event()


def _stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM or Ctrl-C: the swarm stops at its next pause, never inside a request or a
    transaction (an exception raised there left a connection mid-commit)."""
    _stopping.set()


class Unworkable(Exception):
    """The server refused what the swarm asked for one bead: it skips the bead and goes on."""


def _pause(seconds: float) -> None:
    """Wait `seconds` (a stop seen now or during it ends the swarm after it)."""
    if seconds:
        time.sleep(seconds)  # a signal's handler returns; the sleep goes on (PEP 475)
    if _stopping.is_set():
        raise Stopped()


class Command(BaseCommand):
    help = "Run a simulated swarm of workers against the JSON API (demo)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000")
        parser.add_argument("--user", default="demo")
        parser.add_argument("--min-work", type=float, default=8.0)
        parser.add_argument("--max-work", type=float, default=24.0)
        parser.add_argument("--token", default="")
        parser.add_argument("--keep-open", type=int, default=demo.KEEP_OPEN)
        parser.add_argument("--replenish-every", type=float, default=10.0)
        parser.add_argument(
            "--poll", type=float, default=1.0, help="seconds between looks for work (default 1)"
        )
        parser.add_argument(
            "--discover-rate",
            type=float,
            default=0.1,
            help="chance that a worker files a follow-up (discovered work) as it closes a bead",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.verbose = False
        self.done = {"picked up": 0, "closed": 0, "found": 0, "launched": 0}  # this minute
        self.total = dict(self.done)

    def handle(
        self,
        *args: Any,
        url: str,
        user: str,
        min_work: float,
        max_work: float,
        token: str,
        **options: Any,
    ) -> None:
        self.verbose = options.get("verbosity", 1) >= 2
        _stopping.clear()
        previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.work(url, user, min_work, max_work, token, **options)
        except (KeyboardInterrupt, Stopped):  # Ctrl-C, or SIGTERM (from `serve`, systemd, …)
            self.report(self.total, "stopped after")
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def count(self, what: str, line: str | None = None, always: bool = False) -> None:
        """Count what a worker did; its own line only with -v 2 (or `always`)."""
        self.done[what] += 1
        self.total[what] += 1
        if line and (always or self.verbose):
            self.stdout.write(line)

    def report(self, counts: dict[str, int], prefix: str) -> None:
        """One line of what the workers did: "3 beads picked up, 2 closed, 1 convoy launched"."""
        words = [several(counts["picked up"], "bead") + " picked up", f"{counts['closed']} closed"]
        if counts["found"]:
            words.append(several(counts["found"], "follow-up") + " found")
        if counts["launched"]:
            words.append(several(counts["launched"], "convoy") + " launched")
        self.stdout.write(f"swarm: {prefix} {', '.join(words)}")

    def work(
        self,
        url: str,
        user: str,
        min_work: float,
        max_work: float,
        token: str,
        keep_open: int,
        replenish_every: float,
        discover_rate: float,
        poll: float = 1.0,
        **options: Any,
    ) -> None:
        if not token:
            account = get_user_model().objects.filter(username=user).first()
            if account is None:
                self.stderr.write(f"swarm: user '{user}' not found (run `manage.py demo`)")
                return
            token = create_token(account, "swarm")
        self.base, self.token = url.rstrip("/") + "/api", token
        rng = random.Random()
        due: dict[str, float] = {}
        replenish_at = time.monotonic()
        report_at = time.monotonic() + REPORT_EVERY
        waiting = False
        skipped: dict[str, str] = {}  # bead id -> why it was skipped (said once)
        self.stdout.write(f"swarm: working against {self.base}")
        while True:
            if keep_open and time.monotonic() >= replenish_at:
                replenish_at = time.monotonic() + replenish_every
                self.replenish(keep_open, rng)
            if time.monotonic() >= report_at:
                report_at = time.monotonic() + REPORT_EVERY
                if any(self.done.values()):
                    self.report(self.done, "in the last minute:")
                self.done = dict.fromkeys(self.done, 0)
            try:
                hooked = self.call("GET", "/beads?status=hooked&limit=500")
                working = self.call("GET", "/beads?status=in_progress&limit=500")
            except (urllib.error.URLError, OSError, Unworkable) as exc:
                if not waiting:  # once per outage, not every 2 s
                    self.stdout.write(f"swarm: waiting for the server ({exc})")
                waiting = True
                _pause(2)
                continue
            if waiting:
                self.stdout.write("swarm: the server answers again")
                waiting = False
            now = time.monotonic()
            for bead in hooked + working:
                _pause(0)  # between two beads' calls, never inside one
                try:
                    self.step(bead, due, now, rng, min_work, max_work, discover_rate)
                except Unworkable as exc:  # a record it cannot work: skip it, go on
                    if skipped.get(bead["id"]) != str(exc):  # one line, not one per poll
                        skipped[bead["id"]] = str(exc)
                        self.stdout.write(f"swarm: skipped {bead['id']}: {exc}")
            _pause(poll)

    def step(
        self,
        bead: dict[str, Any],
        due: dict[str, float],
        now: float,
        rng: random.Random,
        min_work: float,
        max_work: float,
        discover_rate: float,
    ) -> None:
        """One bead's turn: picked up, a heartbeat, in progress, or closed when its time came."""
        if bead["id"] not in due:
            due[bead["id"]] = now + rng.uniform(min_work, max_work)
            self.count("picked up", f"swarm: {bead['assignee']} picked up {bead['id']}")
        if not bead["assignee"]:
            raise Unworkable(f"{bead['status']} with nobody assigned (fix it in the admin)")
        self.call("POST", "/heartbeat", {"worker": bead["assignee"]})
        if bead["status"] == "hooked" and rng.random() < 0.5:
            self.call("PATCH", f"/beads/{bead['id']}", {"status": "in_progress"})
        elif now >= due[bead["id"]]:
            if rng.random() < discover_rate and not bead["title"].startswith(FOLLOW_UP):
                self.discover(bead)
            self.call("POST", f"/beads/{bead['id']}/close", {"reason": "Done by swarm"})
            self.count("closed", f"swarm: {bead['assignee']} closed {bead['id']}")
            due.pop(bead["id"], None)

    def discover(self, bead: dict[str, Any]) -> None:
        worker = bead["assignee"]
        try:
            with transaction.atomic():
                found = beads.create_bead(
                    FOLLOW_UP + bead["title"], prefix=bead_prefix(bead["id"]), actor=worker
                )
                beads.add_dependency(found.id, bead["id"], "discovered-from", actor=worker)
            self.count("found", f"swarm: {worker} found {found.id} while doing {bead['id']}", True)
        except ServiceError as exc:  # nothing was filed
            self.stdout.write(f"swarm: could not file work found in {bead['id']}: {exc}")
        finally:
            close_old_connections()

    def replenish(self, keep_open: int, rng: random.Random) -> None:
        try:
            for convoy_id, title in demo.replenish(keep_open, rng):
                self.count("launched", f"swarm: launched {convoy_id}: {title}", True)
        except Exception:  # the demo goes on with what is open
            log.exception("swarm: could not launch a fresh demo epic")
        finally:
            close_old_connections()

    def call(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        data = json.dumps(payload).encode() if payload is not None else None
        request = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code in (400, 404):  # closed or reassigned meanwhile
                return []
            try:
                detail = json.loads(exc.read() or b"{}").get("detail", "")
            except (ValueError, AttributeError):
                detail = ""
            raise Unworkable(f"{method} {path}: {exc.code} {detail or exc.reason}".rstrip())
