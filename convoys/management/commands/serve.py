"""`manage.py serve [--port 8000] [--host 127.0.0.1] [--swarm]`: the web server (daphne) and
the task cluster together, logs interleaved and labelled.

Ctrl-C, or SIGTERM/SIGINT to this process or to its whole process group, stops everything
within the task timeout (CONVOY_TASK_TIMEOUT). Each child runs in a session of its own and
gets one SIGTERM from here, the swarm first and the web server last; the cluster lets running
tasks finish and hands queued ones back. On Linux a child also gets SIGTERM if this process is
killed outright."""

import os
import signal
import subprocess
import sys
import threading
import time
from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from ... import processes


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
                    "daphne",
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
                    "convoyweb.asgi:application",
                ],
            ),
            ("tasks", [*manage, "cluster"]),
        ]
        if swarm:
            commands.append(("swarm", [*manage, "swarm", "--url", f"http://{host}:{port}"]))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        me = os.getpid()
        children = [
            (
                label,
                subprocess.Popen(
                    argv,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=env,
                    text=True,
                    bufsize=1,
                    start_new_session=True,
                    # no other thread runs yet, so this is safe before exec
                    preexec_fn=lambda: processes.die_with_parent(me, signal.SIGTERM),
                ),
            )
            for label, argv in commands
        ]
        lock = threading.Lock()
        for label, proc in children:
            threading.Thread(target=self._pump, args=(label, proc, lock), daemon=True).start()
        self.stdout.write(
            self.style.SUCCESS(f"convoyweb is running at http://{host}:{port}/  (Ctrl-C to stop)")
        )
        stopping = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: stopping.set())
        died = None
        while not stopping.wait(0.5):
            died = next((label for label, proc in children if proc.poll() is not None), None)
            if died:
                break
        timeout = settings.CONVOY_TASK_TIMEOUT
        deadline = time.monotonic() + timeout - 1
        self.stdout.write("stopping: running tasks finish, queued ones go back to the queue")
        # one at a time, clients first: the swarm, then the cluster, then the web server
        for label, proc in reversed(children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"[{label}] did not stop within {timeout}s; killing it")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        codes = ", ".join(f"{label}: {proc.returncode}" for label, proc in children)
        if died:
            raise CommandError(f"{died} exited unexpectedly; stopped the others ({codes})")
        self.stdout.write(f"stopped ({codes})")

    def _pump(self, label: str, proc: subprocess.Popen[str], lock: threading.Lock) -> None:
        for line in proc.stdout or ():
            with lock:
                self.stdout.write(f"[{label:<5}] {line.rstrip()}")
