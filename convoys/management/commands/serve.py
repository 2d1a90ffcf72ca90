"""`manage.py serve [--port 8000] [--host 127.0.0.1] [--swarm]`: the web server (daphne) and
the task cluster together, logs interleaved and labelled.

Ctrl-C, or SIGTERM/SIGINT to this process or to its whole process group, stops everything
within the task timeout (CONVOY_TASK_TIMEOUT). Each child runs in a session of its own and
gets one SIGTERM from here, the swarm first and the web server last; the cluster lets running
tasks finish and hands queued ones back. On Linux a child also gets SIGTERM if this process is
killed outright. A child that exits on its own (a crash, kill -9, the swarm giving up) is
started again after a wait that grows with each exit in a row, and its log says so; the
others keep running. A task cluster that runs but has stopped ticking (`ticker.stalled_since`:
no feed tick for three feed intervals, from any cluster on the database) is stopped (SIGTERM,
SIGKILL after the task timeout) and so started again."""

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections
from django.utils import timezone

from convoys.core.formatting import several
from convoys.infra import processes
from convoys.log.events import last_seq
from convoys.read import pages
from convoys.services import ticker

log = logging.getLogger("convoys.serve")

RESTART_MAX = 30.0  # seconds: the longest wait before a crashed child is started again
RESTART_STABLE = 60.0  # seconds a child must run for its next crash to wait 1 s again


class Command(BaseCommand):
    help = "Run daphne and the task cluster together (the embedded default)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument(
            "--swarm", action="store_true", help="also run the simulated worker swarm (demo)"
        )

    def handle(self, *args: Any, host: str, port: int, swarm: bool, **options: Any) -> None:
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        commands = [
            (
                "web",
                [
                    sys.executable,
                    "-m",
                    "convoyweb.webserver",  # daphne, with a 414/431 for over-long lines
                    "-b",
                    host,
                    "-p",
                    str(port),
                    # X-Forwarded-For names the client only behind a proxy that sets it; trusted
                    # otherwise, anyone could pose as a new address per login attempt.
                    *(
                        ["--proxy-headers"]
                        if getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
                        else []
                    ),
                    # with JSON logs the access line is the request middleware's (convoyweb/logs.py)
                    *(["-v", "0"] if settings.LOG_FORMAT == "json" else []),
                    "convoyweb.asgi:application",
                ],
            ),
            ("tasks", [*manage, "cluster"]),
        ]
        if swarm:
            commands.append(("swarm", [*manage, "swarm", "--url", f"http://{host}:{port}"]))
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.lock = threading.Lock()
        children = [(label, self._start(label, argv)) for label, argv in commands]
        self._tell(f"convoyweb is running at http://{host}:{port}/  (Ctrl-C to stop)")
        stopping = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: stopping.set())
        self._supervise(children, dict(commands), stopping)
        timeout = settings.CONVOY_TASK_TIMEOUT
        deadline = time.monotonic() + timeout - 1
        self._tell("stopping: running tasks finish, queued ones go back to the queue")
        # one at a time, clients first: the swarm, then the cluster, then the web server
        for label, proc in reversed(children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                self._say(label, f"did not stop within {timeout}s; killing it")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        codes = ", ".join(f"{label}: {proc.returncode}" for label, proc in children)
        self._tell(f"stopped ({codes})")

    def _start(self, label: str, argv: list[str]) -> subprocess.Popen[str]:
        me = os.getpid()
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**self.env, "CONVOY_PROCESS": label},  # the `process` of its JSON log lines
            text=True,
            bufsize=1,
            start_new_session=True,
            # the child runs nothing else between fork and exec
            preexec_fn=lambda: processes.die_with_parent(me, signal.SIGTERM),
        )
        threading.Thread(target=self._pump, args=(label, proc, self.lock), daemon=True).start()
        return proc

    def _supervise(
        self,
        children: list[tuple[str, subprocess.Popen[str]]],
        commands: dict[str, list[str]],
        stopping: threading.Event,
    ) -> None:
        """Until stopped: a child that exits is started again after a wait that doubles with
        each exit in a row (1 s up to RESTART_MAX; a child that ran RESTART_STABLE seconds
        starts from 1 s again); the others keep running."""
        waits = dict.fromkeys(commands, 0.0)
        started = dict.fromkeys(commands, time.monotonic())
        status = Status(self)
        due: dict[str, float] = {}
        checked = time.monotonic()
        stopped_at: float | None = None  # when a stalled cluster was sent SIGTERM
        while not stopping.wait(0.5):
            now = time.monotonic()
            status.maybe_report(now)
            tasks = dict(children).get("tasks")
            if tasks is not None and tasks.poll() is None and "tasks" not in due:
                if stopped_at is not None:
                    if now - stopped_at > settings.CONVOY_TASK_TIMEOUT:
                        self._say("tasks", "did not stop; killing it")
                        os.killpg(tasks.pid, signal.SIGKILL)
                elif now - checked >= settings.CONVOY_FEED_INTERVAL:
                    checked = now
                    if now - started["tasks"] > 2 * ticker.stall_after() and self._stalled():
                        self._say("tasks", "has stopped ticking; stopping it to start it again")
                        tasks.send_signal(signal.SIGTERM)
                        stopped_at = now
            for index, (label, proc) in enumerate(children):
                if label in due:
                    if now >= due[label]:
                        del due[label]
                        children[index] = (label, self._start(label, commands[label]))
                        started[label] = now
                        if label == "tasks":
                            stopped_at = None
                    continue
                if proc.poll() is None:
                    continue
                stable = now - started[label] >= RESTART_STABLE
                waits[label] = 1.0 if stable else min(max(waits[label] * 2, 1.0), RESTART_MAX)
                due[label] = now + waits[label]
                status.restarted(proc.returncode)
                self._record_restart(label, proc.returncode, waits[label])
                self._say(
                    label,
                    f"exited with code {proc.returncode}; "
                    f"starting it again in {waits[label]:.0f} s (the others keep running)",
                )

    def _record_restart(self, label: str, code: int | None, wait: float) -> None:
        """The restart in the event log, for the dashboard; not when the database is away."""
        try:
            ticker.record_restart(label, code, wait)
        except Exception:
            log.warning("could not record the restart of %s", label)
        finally:
            close_old_connections()

    def _stalled(self) -> bool:
        """The cluster rule, read from the database; False when it cannot be read (the
        database is away: restarting the cluster would not help)."""
        try:
            return ticker.stalled_since()[0]
        except Exception:
            return False
        finally:
            close_old_connections()

    def _say(self, label: str, text: str) -> None:
        if settings.LOG_FORMAT == "json":
            log.warning(text, extra={"process_name": label})
            return
        with self.lock:
            self.stderr.write(f"[{label:<5}] {text}")

    def _tell(self, text: str) -> None:
        """serve's own news: a text line, or with LOG_FORMAT=json a JSON one."""
        if settings.LOG_FORMAT == "json":
            log.info(text)
        else:
            self.stdout.write(text)

    def _pump(self, label: str, proc: subprocess.Popen[str], lock: threading.Lock) -> None:
        as_json = settings.LOG_FORMAT == "json"
        for line in proc.stdout or ():
            text = line.rstrip()
            if as_json and not text.startswith("{"):  # a print, not a log line: made one
                log.info(text, extra={"process_name": label})
                continue
            with lock:
                self.stdout.write(text if as_json else f"[{label:<5}] {text}")


class Status:
    """serve's line every CONVOY_STATUS_EVERY seconds: what the town did since the last one
    (`pages.town_minute`) and how many children were started again."""

    def __init__(self, command: Command) -> None:
        self.command = command
        self.restarts = 0  # children started again since the last line
        self.crashes = 0  # of which exited with an error (not a clean 0)
        self.due = time.monotonic() + settings.CONVOY_STATUS_EVERY
        self.since = timezone.now()
        self.seq = self._last_seq()

    def _last_seq(self) -> int | None:
        try:
            return last_seq()
        except Exception:  # the database is away: the first line waits for it
            return None
        finally:
            close_old_connections()

    def restarted(self, code: int | None) -> None:
        self.restarts += 1
        self.crashes += code != 0

    def maybe_report(self, now: float) -> None:
        if now < self.due:
            return
        self.due = now + settings.CONVOY_STATUS_EVERY
        if self.seq is None:
            self.seq, self.since = self._last_seq(), timezone.now()
            return
        moment = timezone.now()
        try:
            minute = pages.town_minute(self.seq, self.since)
        except Exception as exc:  # the database is away: say so, try again next time
            self.command._tell(f"status: cannot read the database ({type(exc).__name__})")
            return
        finally:
            close_old_connections()
        self.seq, self.since = minute.seq, moment
        errors = minute.failed + self.crashes
        details = []
        if errors:
            details.append(several(minute.failed, "failed dispatch", "failed dispatches"))
            details.append(several(self.crashes, "crash", "crashes"))
        if self.restarts:
            details.append(f"{several(self.restarts, 'child', 'children')} started again")
        every = f"{settings.CONVOY_STATUS_EVERY:g} s"
        self.command._tell(
            f"status: {several(minute.moving, 'convoy')} moving, {minute.landed} landed, "
            f"{minute.in_flight} in flight, {several(errors, 'error')} in the last {every}"
            + (f" ({', '.join(details)})" if details else "")
        )
        self.restarts = self.crashes = 0
