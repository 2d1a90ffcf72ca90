"""Import speed and memory: a generated bd JSONL of N beads with 3 dependencies each.

Timestamps look like real bd exports': local offsets and 6 to 9 fractional digits. Each run
imports into a fresh SQLite database in a child process, so peak RSS is that run's alone: the
writing process's and its read-ahead parser's (files of 1 MB and more are parsed in a forked
child; the two share their start-up pages, so their sum overstates what they hold together).

Prints beads/s and peak memory (median of --runs) at two file sizes side by side (memory that
does not grow with the file shows as a ratio near 1), and for the large file the same import
with the read-ahead turned off, runs alternating, as the control.

    .venv/bin/python bench/import.py [--beads 100000] [--small 20000] [--runs 3]
        [--postgres postgres://postgres@127.0.0.1:5432/postgres]
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, median  # noqa: E402

CHILD = """
import os, sys, time, resource
sys.path.insert(0, {root!r})
sys.path.insert(0, {bench!r})
from _common import setup
setup()
from convoys.services import jsonl
if {in_process!r}:
    jsonl.READ_AHEAD_MIN_BYTES = float("inf")
started = time.perf_counter()
report = jsonl.import_file({path!r})
elapsed = time.perf_counter() - started
writer = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
reader = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # read-ahead child
print(report.beads, report.dependencies, elapsed, writer, reader)
"""


START = datetime(2026, 1, 5, 9, 0, tzinfo=timezone(timedelta(hours=-8)))


def stamp(rng, at):
    """An RFC 3339 timestamp as bd writes them: local offset, 6 to 9 fractional digits."""
    digits = rng.choice((6, 6, 6, 7, 8, 9))
    fraction = f"{rng.randrange(10**digits):0{digits}d}"
    text = at.isoformat(timespec="seconds")  # 2026-01-05T09:00:00-08:00
    return f"{text[:19]}.{fraction}{text[19:]}"


def generate(path, count, seed=1):
    rng = random.Random(seed)
    with open(path, "w") as out:
        for i in range(count):
            created = START + timedelta(seconds=37 * i)
            deps = []
            for target in rng.sample(range(max(i, 1)), k=min(3, i)) if i else []:
                deps.append(
                    {
                        "issue_id": f"gt-{i:06d}",
                        "depends_on_id": f"gt-{target:06d}",
                        "type": rng.choice(("blocks", "parent-child", "related")),
                        "created_at": stamp(rng, created),
                        "created_by": "mayor",
                    }
                )
            record = {
                "id": f"gt-{i:06d}",
                "title": f"Generated bead {i}",
                "status": rng.choice(("open", "closed", "hooked")),
                "priority": rng.randint(0, 4),
                "issue_type": "task",
                "created_at": stamp(rng, created),
                "updated_at": stamp(rng, created + timedelta(hours=3)),
                "dependencies": deps,
            }
            if record["status"] == "closed":
                record["closed_at"] = stamp(rng, created + timedelta(hours=3))
            out.write(json.dumps(record) + "\n")


POSTGRES = None  # --postgres URL: each run gets a new database on that server


@contextmanager
def fresh_database():
    """A throw-away database: SQLite in a temp folder (bench/_common.py) or, with
    --postgres, a new PostgreSQL database dropped afterwards."""
    if not POSTGRES:
        yield None
        return
    import psycopg

    name = f"convoyweb_bench_import_{os.getpid()}"
    with psycopg.connect(POSTGRES, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield urlunsplit(urlsplit(POSTGRES)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def run_once(path, in_process=False):
    code = CHILD.format(
        root=str(ROOT), bench=str(Path(__file__).parent), path=str(path), in_process=in_process
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "BENCH_DATABASE_URL")}
    with fresh_database() as url:
        if url:
            env["BENCH_DATABASE_URL"] = url
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
    beads, deps, elapsed, writer, reader = done.stdout.split()[-5:]
    return int(beads), int(deps), float(elapsed), float(writer), float(reader)


def summary(runs):
    return (
        median([r[0] / r[2] for r in runs]),
        median([r[3] for r in runs]),
        median([r[4] for r in runs]),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--beads", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--postgres", metavar="URL", help="a PostgreSQL server to import into")
    args = parser.parse_args()
    global POSTGRES
    POSTGRES = args.postgres
    folder = Path(tempfile.mkdtemp(prefix="convoyweb-import-"))
    results = {}
    for count in (args.small, args.beads):
        path = folder / f"beads-{count}.jsonl"
        generate(path, count)
        runs, control = [], []
        for _ in range(args.runs):
            runs.append(run_once(path))
            if count == args.beads:
                control.append(run_once(path, in_process=True))
        results[count] = summary(runs) + (path.stat().st_size / 1e6,)
        rate, writer, reader, size = results[count]
        print(
            f"{count:>7} beads, {runs[0][1]:>7} deps, {size:.1f} MB file: "
            f"median {rate:,.0f} beads/s, peak RSS writer {writer:.0f} MB + reader {reader:.0f} MB"
            f" (runs: {', '.join(f'{r[2]:.2f}s' for r in runs)})"
        )
        if control:
            plain, plain_rss, _ = summary(control)
            print(
                f"{count:>7} beads without read-ahead (control): median {plain:,.0f} beads/s, "
                f"peak RSS {plain_rss:.0f} MB (runs: {', '.join(f'{r[2]:.2f}s' for r in control)});"
                f" read-ahead is {rate / plain:.2f}x"
            )
    small, big = results[args.small], results[args.beads]
    print(
        f"file size ratio {big[3] / small[3]:.1f}x, peak memory ratio writer {big[1] / small[1]:.2f}x"
        f" reader {big[2] / small[2]:.2f}x, speed ratio {big[0] / small[0]:.2f}x;"
        f" target >= 20,000 beads/s on SQLite ({'PostgreSQL' if POSTGRES else 'SQLite'} here)"
    )


if __name__ == "__main__":
    main()
