"""Close-commit -> next-dispatch latency with a real task cluster, on a chain convoy.

Starts `manage.py cluster` against a fresh database, closes the chain's beads one by one and
measures from each close's commit to the moment the next bead is hooked. Prints p50 and p99
beside the original's 5 s event poll interval. Runs on SQLite by default; with
BENCH_DATABASE_URL=postgres://… and REDIS_URL=redis://… it measures that stack.

    .venv/bin/python bench/feed_latency.py [--beads 40]
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, median, percentile, setup  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--beads", type=int, default=40)
    args = parser.parse_args()
    url = setup()
    from convoys.models import Bead
    from convoys.services import beads, rigs, staging
    from convoys.services.launch import launch_staged

    rigs.upsert_route("gt-", "gastown")
    ids = [beads.create_bead(f"Step {i}", bead_id=f"gt-l{i:04d}").id for i in range(args.beads)]
    for a, b in zip(ids, ids[1:], strict=False):
        beads.add_dependency(b, a, "blocks")
    plan = staging.stage(ids)
    launch_staged(plan.convoy_id, force=True)
    env = {**os.environ, "DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    cluster = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "cluster"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    time.sleep(3)
    latencies = []
    try:
        for current, following in zip(ids, ids[1:], strict=False):
            beads.close_bead(current)
            started = time.perf_counter()
            while Bead.objects.filter(pk=following, status="hooked").count() == 0:
                if time.perf_counter() - started > 30:
                    raise SystemExit(f"{following} not dispatched within 30 s")
                time.sleep(0.002)
            latencies.append(time.perf_counter() - started)
    finally:
        cluster.send_signal(signal.SIGTERM)
        cluster.wait(30)
    stack = "PostgreSQL + Redis" if url.startswith("postgres") else "SQLite + ORM broker"
    p50, p99 = median(latencies), percentile(latencies, 99)
    print(
        f"{stack}: {len(latencies)} closes, close -> next dispatch p50 {p50 * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms"
    )
    print(
        f"the original polls events every 5 s: p50 is {5 / p50:.0f}x faster; "
        "target p99 < 500 ms (SQLite), < 200 ms (Redis)"
    )


if __name__ == "__main__":
    main()
