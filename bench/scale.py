"""One versus two task clusters: closes handled per second and close -> dispatch latency.

Eight convoys of independent beads; a simulated worker closes every hooked bead at once, and
each close makes the feeder dispatch the convoy's next bead. Same data, same run, one then
two `manage.py cluster` processes. Meant for PostgreSQL + Redis:

    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/convoy_bench \\
    REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python bench/scale.py
(also runs on the SQLite default, where writers serialise).
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, percentile, reset, setup  # noqa: E402


def trial(url, clusters, convoys_n, per_convoy):
    from convoys.models import Bead, Event
    from convoys.services import beads, convoys, rigs

    reset()
    rigs.upsert_route("gt-", "gastown")
    first_ids = []
    for c in range(convoys_n):
        ids = [
            beads.create_bead(f"Bead {c}.{i}", bead_id=f"gt-s{c:02d}x{i:03d}").id
            for i in range(per_convoy)
        ]
        convoys.create(f"Scale {c}", ids)
        first_ids.append(ids[0])
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "CONVOY_STRANDED_INTERVAL": "3600",
        "CONVOY_FEED_INTERVAL": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "cluster"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(clusters)
    ]
    time.sleep(4)
    from convoys.services import dispatch

    for bead_id in first_ids:  # start each convoy
        dispatch.dispatch(Bead.objects.get(pk=bead_id), path="manual")
    total = convoys_n * per_convoy
    closed_at, started = {}, time.perf_counter()
    latencies = []
    try:
        while len(closed_at) < total and time.perf_counter() - started < 300:
            for bead_id in Bead.objects.filter(status="hooked").values_list("id", flat=True):
                if bead_id not in closed_at:
                    beads.close_bead(bead_id)
                    closed_at[bead_id] = time.perf_counter()
            time.sleep(0.005)
        elapsed = time.perf_counter() - started
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)
    dispatched = dict(
        Event.objects.filter(kind="bead.dispatched").values_list("bead_id", "created_at")
    )
    closes = dict(Event.objects.filter(kind="bead.closed").values_list("bead_id", "created_at"))
    by_convoy = {}
    for bead_id in sorted(dispatched):
        by_convoy.setdefault(bead_id.split("x")[0], []).append(bead_id)
    for ids in by_convoy.values():
        for prev, nxt in zip(ids, ids[1:], strict=False):
            if prev in closes and nxt in dispatched:
                latencies.append((dispatched[nxt] - closes[prev]).total_seconds())
    return len(closed_at) / elapsed, percentile(latencies, 50), percentile(latencies, 99)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--convoys", type=int, default=8)
    parser.add_argument("--beads", type=int, default=40)
    args = parser.parse_args()
    url = setup()
    results = {n: trial(url, n, args.convoys, args.beads) for n in (1, 2)}
    for n, (rate, p50, p99) in results.items():
        print(
            f"{n} cluster(s): {rate:.1f} closes/s, close -> next dispatch p50 {p50 * 1000:.0f} "
            f"ms, p99 {p99 * 1000:.0f} ms"
        )
    print(
        f"two / one clusters throughput ratio: {results[2][0] / results[1][0]:.2f}x "
        f"({'PostgreSQL + Redis' if url.startswith('postgres') else 'SQLite'})"
    )


if __name__ == "__main__":
    main()
