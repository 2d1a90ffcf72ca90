"""Town capacity under load: a cap of 4, 8 convoys of 50 one-second beads,
worked by the demo swarm through the JSON API, on PostgreSQL + Redis.

Starts daphne, one task cluster and `manage.py swarm --min-work 1 --max-work 1 --poll 0.25`
against a fresh database. First a baseline with the same number of slots and no town cap
(4 convoys of max_in_flight 1, 25 beads each: each close feeds its own convoy, as before the
cap), then the cap (set at run time with the override): every convoy is launched (the
launches take the first 4 slots, the rest queue), the town is sampled every 100 ms until
every convoy has landed, and it prints for each run, with the ratios:

- utilisation: in flight / cap, sampled while beads wait for capacity (goal >= 95%), and the
  same from the event log (time-weighted, from the first dispatch to the last);
- slot freed -> next dispatch latency, p50 / p99 (goal p99 < 200 ms): each close (or failed
  dispatch) frees a slot, and the next dispatch fills the oldest freed slot;
- fairness: the largest gap between two dispatches of one convoy, beside the round-robin
  ideal (convoys x bead time / cap).

    .venv/bin/python bench/capacity.py [--cap 4 --convoys 8 --beads 50 --work 1]

BENCH_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/convoy_bench_capacity, dropped
and created afresh) and REDIS_URL (default redis://127.0.0.1:6379/5); it says so and exits
when either is unreachable.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, median, percentile, reset  # noqa: E402

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/convoy_bench_capacity"
DEFAULT_REDIS = "redis://127.0.0.1:6379/5"


def reachable(url, default_port):
    parsed = urlparse(url)
    try:
        socket.create_connection(
            (parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=2
        ).close()
        return True
    except OSError:
        return False


def fresh_database(url):
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin = parsed._replace(path="/template1").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(argv, env, log):
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(procs):
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def build(convoys_n, per_convoy, tag):
    """Staged convoys of independent beads, one rig."""
    from convoys.services import beads, rigs, staging

    rigs.upsert_route("gt-", "gastown")
    plans = []
    for c in range(convoys_n):
        ids = [
            beads.create_bead(f"Bead {c}.{i}", bead_id=f"gt-{tag}{c}x{i:03d}").id
            for i in range(per_convoy)
        ]
        plans.append(staging.stage(ids, title=f"Capacity {c}").convoy_id)
    return plans


def replay(cap):
    """From the event log: (utilisation time-weighted over first..last dispatch, slot-freed
    -> dispatch latencies, {convoy: largest gap between two of its dispatches})."""
    from convoys.models import Dispatch, Event

    events = list(
        Event.objects.filter(kind__in=("bead.dispatched", "bead.closed", "dispatch.failed"))
        .order_by("seq")
        .values_list("kind", "bead_id", "created_at")
    )
    dispatches = [at for kind, _, at in events if kind == "bead.dispatched"]
    first, last = dispatches[0], dispatches[-1]
    in_flight, freed, latencies = set(), [], []
    busy_time, prev_at = 0.0, first
    for kind, bead_id, at in events:
        if first <= at <= last:
            busy_time += len(in_flight) * (at - prev_at).total_seconds()
            prev_at = at
        if kind == "bead.dispatched":
            if freed:
                latencies.append((at - freed.pop(0)).total_seconds())
            in_flight.add(bead_id)
        elif bead_id in in_flight:
            in_flight.discard(bead_id)
            freed.append(at)
    span = (last - first).total_seconds()
    gaps = {}
    for convoy_id, at in Dispatch.objects.order_by("created_at").values_list(
        "convoy_id", "created_at"
    ):
        gaps.setdefault(convoy_id, []).append(at)
    largest = {
        c: max(((b - a).total_seconds() for a, b in zip(ts, ts[1:], strict=False)), default=0)
        for c, ts in gaps.items()
    }
    busy = busy_time / (span * cap) if span else 0.0
    return busy, latencies, largest, (first, last)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--convoys", type=int, default=8)
    parser.add_argument("--beads", type=int, default=50)
    parser.add_argument("--work", type=float, default=1.0, help="seconds a bead takes")
    parser.add_argument("--poll", type=float, default=0.25, help="the swarm's polling (s)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument(
        "--baseline", type=int, default=25, help="beads per convoy of the uncapped run (0: none)"
    )
    args = parser.parse_args()
    url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB)
    redis_url = os.environ.get("REDIS_URL", DEFAULT_REDIS)
    if not url.startswith("postgres") or not reachable(url, 5432):
        print(f"skipped: needs PostgreSQL (BENCH_DATABASE_URL={url} is not reachable)")
        return
    if not reachable(redis_url, 6379):
        print(f"skipped: needs Redis (REDIS_URL={redis_url} is not reachable)")
        return
    fresh_database(url)
    os.environ.update(
        DATABASE_URL=url, REDIS_URL=redis_url, DJANGO_SETTINGS_MODULE="convoyweb.settings"
    )
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django_q.brokers import get_broker

    get_broker().purge_queue()  # nothing left over from an earlier run on this Redis
    from convoys.services.tokens import create_token

    token = create_token(User.objects.create_superuser("bench", "b@localhost", "x"), "bench")
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / "bench-capacity.log", "w")  # noqa: SIM115
    python = sys.executable
    daphne = [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    swarm = [
        python,
        str(ROOT / "manage.py"),
        "swarm",
        f"--url=http://127.0.0.1:{port}",
        f"--token={token}",
        f"--min-work={args.work}",
        f"--max-work={args.work}",
        f"--poll={args.poll}",
        "--keep-open=0",
        "--discover-rate=0",
    ]
    procs = [
        spawn([*daphne, "convoyweb.asgi:application"], env, log),
        spawn([python, str(ROOT / "manage.py"), "cluster"], env, log),
        spawn(swarm, env, log),
    ]
    try:
        log_path = Path(log.name)
        deadline = time.monotonic() + 60
        while "ticker started" not in log_path.read_text() or not reachable(
            f"http://127.0.0.1:{port}", port
        ):
            if time.monotonic() > deadline:
                raise SystemExit(f"the cluster or daphne did not start: see {log_path}")
            time.sleep(0.2)
        baseline = None
        if args.baseline:
            # The same slots without a town cap: `cap` convoys of max_in_flight 1, each close
            # feeding its own convoy (the per-convoy path every feeder used before the cap).
            baseline = trial(args, 0, args.cap, args.baseline, limit=1)
        capped = trial(args, args.cap, args.convoys, args.beads)
    finally:
        stop(procs)
        log.close()
    report(args, capped, baseline)


def trial(args, cap, convoys_n, per_convoy, limit=None):
    """One run on the processes started by main(); the cap is set at run time (the
    override every process reads at its next event)."""
    from django.utils import timezone

    from convoys.models import Convoy, Cursor, HandledEvent
    from convoys.rules import capacity
    from convoys.services import controls, convoys
    from convoys.services.launch import launch_staged

    reset()
    Cursor.objects.all().delete()
    HandledEvent.objects.all().delete()
    controls.set_cap(cap, actor="bench")
    plans = build(convoys_n, per_convoy, "c" if cap else "b")
    for convoy_id in plans if limit else ():
        convoys.update_fields(convoy_id, max_in_flight=limit, actor="bench")
    from django.db import connection

    with connection.cursor() as cursor:
        # Planner statistics, as autovacuum keeps them on a live database: on a database
        # created a second ago PostgreSQL believes the tables empty, and the queue's query
        # takes a nested loop over every tracked row (36 ms instead of 1 ms here).
        cursor.execute("ANALYZE")
    time.sleep(2)  # the swarm finds nothing to do, then polls every --poll s
    samples, started = [], time.perf_counter()
    for convoy_id in plans:
        launch_staged(convoy_id, force=True)
    slots = cap or convoys_n * limit
    while time.perf_counter() - started < args.timeout:
        samples.append((timezone.now(), capacity.in_flight()))  # one query
        if not Convoy.objects.exclude(status="closed").exists():
            break
        time.sleep(0.1)
    elapsed = time.perf_counter() - started
    landed = Convoy.objects.filter(status="closed").count()
    utilisation, latencies, gaps, (first, last) = replay(slots)
    return {
        "cap": cap,
        "slots": slots,
        "convoys": convoys_n,
        "beads": per_convoy,
        "landed": landed,
        "elapsed": elapsed,
        "sampled": [n / slots for at, n in samples if first <= at <= last],
        "utilisation": utilisation,
        "latencies": latencies,
        "gaps": gaps,
    }


def report(args, capped, baseline):
    def line(run, what):
        total = run["convoys"] * run["beads"]
        sampled, lat = run["sampled"], run["latencies"]
        print(
            f"{what}: {run['landed']}/{run['convoys']} convoys x {run['beads']} beads landed in "
            f"{run['elapsed']:.0f} s ({total / run['elapsed']:.1f} beads/s)\n"
            f"  utilisation while queued: {sum(sampled) / max(len(sampled), 1):.1%} "
            f"(in flight / {run['slots']} sampled 10/s, {len(sampled)} samples); "
            f"{run['utilisation']:.1%} time-weighted from the event log\n"
            f"  slot freed -> next dispatch: p50 {median(lat) * 1000:.0f} ms, p99 "
            f"{percentile(lat, 99) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms "
            f"({len(lat)} refills)"
        )

    print(
        f"PostgreSQL + Redis, demo swarm (beads of {args.work:g} s, polling every "
        f"{args.poll:g} s), one cluster"
    )
    if baseline:
        line(baseline, f"no town cap, {baseline['slots']} convoys of max_in_flight 1 (baseline)")
    line(capped, f"town cap {capped['cap']}")
    gaps = capped["gaps"]
    worst = max(gaps, key=gaps.get)
    per_bead = capped["elapsed"] * capped["cap"] / (capped["convoys"] * capped["beads"])
    print(
        f"  fairness: largest gap between two dispatches of one convoy {gaps[worst]:.1f} s "
        f"({worst}), median of the convoys' largest gaps {median(list(gaps.values())):.1f} s; "
        f"round-robin: each convoy every {capped['convoys'] * per_bead / capped['cap']:.1f} s "
        f"(convoys x {per_bead:.2f} s a bead / cap)"
    )
    if baseline:
        a, b = capped["latencies"], baseline["latencies"]
        print(
            f"town cap / baseline: p50 {median(a) / median(b):.2f}x, p99 "
            f"{percentile(a, 99) / percentile(b, 99):.2f}x, utilisation "
            f"{capped['utilisation'] / baseline['utilisation']:.2f}x; goals: utilisation "
            ">= 95%, p99 < 200 ms"
        )


if __name__ == "__main__":
    main()
