"""`manage.py serve [--port 8000] [--host 127.0.0.1] [--swarm]`: the web server (daphne) and
the task cluster together, logs interleaved and labelled; Ctrl-C or SIGTERM stops both
cleanly (SIGTERM to each main process only, so in-flight tasks finish and are not re-run)."""

import os
import signal
import subprocess
import sys
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand

STOP_TIMEOUT = 90


class Command(BaseCommand):
    help = "Run daphne and the task cluster together (the embedded default)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument(
            "--swarm", action="store_true", help="also run the simulated worker swarm (demo)"
        )

    def handle(self, *args, host, port, swarm, **options):
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
                    "--proxy-headers",
                    "convoyweb.asgi:application",
                ],
            ),
            ("tasks", [*manage, "cluster"]),
        ]
        if swarm:
            commands.append(("swarm", [*manage, "swarm", "--url", f"http://{host}:{port}"]))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        children, lock = [], threading.Lock()
        for label, argv in commands:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                text=True,
                bufsize=1,
                start_new_session=True,
            )
            children.append((label, proc))
            threading.Thread(target=self._pump, args=(label, proc, lock), daemon=True).start()
        self.stdout.write(
            self.style.SUCCESS(f"convoyweb is running at http://{host}:{port}/  (Ctrl-C to stop)")
        )
        stopping = threading.Event()

        def stop(signum, frame):
            stopping.set()

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        while not stopping.is_set():
            if any(proc.poll() is not None for _, proc in children):
                break
            stopping.wait(0.5)
        self.stdout.write("stopping: waiting for in-flight work to finish…")
        for _label, proc in reversed(children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the main process only: KillMode=mixed
        deadline = time.monotonic() + STOP_TIMEOUT
        for label, proc in children:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"[{label}] did not stop in {STOP_TIMEOUT}s; killing it")
                os.killpg(proc.pid, signal.SIGKILL)
        codes = {label: proc.returncode for label, proc in children}
        self.stdout.write(f"stopped ({', '.join(f'{k}: {v}' for k, v in codes.items())})")

    def _pump(self, label, proc, lock):
        for line in proc.stdout:
            with lock:
                self.stdout.write(f"[{label:<5}] {line.rstrip()}")
