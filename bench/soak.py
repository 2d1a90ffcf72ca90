"""SQLite write soak: HTTP changes (~20/s) + the task cluster (feeder, 1 s catch-up, 2 s
stranded scan) + a second writer doing admin-style saves, for --seconds (default 120).
Counts "database is locked" in every process's output and HTTP errors: both must be 0.

    .venv/bin/python bench/soak.py [--seconds 120] [--control]
--control runs it twice side by side: as configured (IMMEDIATE transactions), then with
SQLite's DEFERRED transactions, which should show the lock errors the soak is there to catch.
"""

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, setup  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--rate", type=float, default=20)
    parser.add_argument("--control", action="store_true", help="also run with DEFERRED")
    args = parser.parse_args()
    if args.control:
        for mode in ("IMMEDIATE", "DEFERRED"):
            argv = [sys.executable, __file__, "--seconds", str(args.seconds)]
            argv += ["--rate", str(args.rate)]
            env = {**os.environ, "SQLITE_TRANSACTION_MODE": mode}
            result = subprocess.run(argv, env=env, capture_output=True, text=True)
            print(f"{mode:>9}: {result.stdout.strip().splitlines()[-1]}")
        return
    url = setup()
    from django.contrib.auth.models import User

    from convoys.models import Bead
    from convoys.services import beads, convoys, rigs
    from convoys.services.tokens import create_token

    rigs.upsert_route("gt-", "gastown")
    user = User.objects.create_superuser("soak", "soak@localhost", "pw-pw-pw-123")
    token = create_token(user, "soak")
    ids = [beads.create_bead(f"Soak {i}", bead_id=f"gt-k{i:04d}").id for i in range(400)]
    for lane in range(8):
        convoys.create(f"Soak {lane}", ids[lane::8])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    logs = Path(tempfile.mkdtemp(prefix="soak-"))
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "CONVOY_FEED_INTERVAL": "1",
        "CONVOY_STRANDED_INTERVAL": "2",
    }
    procs = [
        subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=open(logs / name, "w"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for name, cmd in (
            (
                "web.log",
                [sys.executable, "-m", "daphne", "-p", str(port), "convoyweb.asgi:application"],
            ),
            ("cluster.log", [sys.executable, str(ROOT / "manage.py"), "cluster"]),
        )
    ]
    time.sleep(4)
    errors, requests, saves = [], [0], [0]
    stop = threading.Event()

    def call(method, path, body=None):
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api{path}",
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                requests[0] += 1
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            requests[0] += 1
            if exc.code >= 500:
                errors.append(f"{exc.code} {path}")
            return None

    def admin_writer():
        rng = random.Random(2)
        while not stop.is_set():
            bead_id = rng.choice(ids)
            try:
                beads.update_bead(bead_id, priority=rng.randint(0, 4), actor="admin")
                saves[0] += 1
            except Exception as exc:  # noqa: BLE001
                errors.append(f"admin save: {exc}")
            time.sleep(0.2)

    writer = threading.Thread(target=admin_writer, daemon=True)
    writer.start()
    rng = random.Random(1)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        hooked = call("GET", "/beads?status=hooked&limit=50") or []
        for row in hooked[:3]:
            call("POST", f"/beads/{row['id']}/close", {"reason": "soak"})
        target = rng.choice(ids)
        call("PATCH", f"/beads/{target}", {"priority": rng.randint(0, 4)})
        time.sleep(1 / args.rate)
    stop.set()
    writer.join(5)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(60)
    locked = sum(p.read_text().count("database is locked") for p in logs.glob("*.log"))
    locked += sum("locked" in e for e in errors)
    closed = Bead.objects.filter(status="closed").count()
    print(
        f"{args.seconds:.0f} s soak on SQLite: {requests[0]} HTTP requests, {saves[0]} admin "
        f"saves, {closed} beads closed and fed; 'database is locked': {locked}; other errors:"
        f" {len(errors) - sum('locked' in e for e in errors)} (logs in {logs})"
    )


if __name__ == "__main__":
    main()
