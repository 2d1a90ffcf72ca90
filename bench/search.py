"""Search on 100,000 beads: how long /api/search's query takes (ranked, a page, and the count),
on SQLite and, when DATABASE_URL names a PostgreSQL server, on PostgreSQL (a new database on
that server, dropped afterwards). The beads go in through bulk.py's multi-row INSERT (COPY on
PostgreSQL), as an import does, so the index is built by the triggers the import fires; that
load is timed too, beside the same load into a database without the triggers.

Prints, per database, the median of --runs for each query. Goal: under 100 ms each.

    .venv/bin/python bench/search.py [--beads 100000] [--runs 20]
"""

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, setup  # noqa: E402

WORDS = (
    "track signal depot station engine wagon ticket platform bridge tunnel sleeper rail "
    "junction freight express timetable boiler whistle crossing gauge switch carriage "
    "lantern coal water brake coupling siding yard roundhouse turntable ballast culvert "
    "viaduct cutting embankment points semaphore token staff guard porter"
).split()
# Descriptions draw from a larger vocabulary, its words as often as a language's (Zipf): the
# railway words above are its commonest, so each is in many descriptions.
SYLLABLES = "ka lo mi nu pe ra si tu vo ze".split()
VOCABULARY = WORDS + [a + b + c for a in SYLLABLES for b in SYLLABLES for c in SYLLABLES]
ZIPF = [1 / (rank + 1) for rank in range(len(VOCABULARY))]
LABELS = [f"area:{w}" for w in WORDS[:20]] + ["urgent", "blocked-upstream", "needs-review"]
QUERIES = [
    ("an exact id", "gt-s04242"),
    ("an id prefix", "gt-s0424"),
    ("a short id prefix", "gt-s0"),
    ("a title word", "viaduct"),
    ("two words", "boiler whistle"),
    ("a word prefix", "semaph"),
    ("a rarer word", "kaloze"),
    ("a label", "needs-review"),
    ("an assignee", "polecats/nux7"),
    ("a word in no bead", "zeppelin"),
    ("a convoy id prefix", "hq-cv-s01"),
]


def build(count, seed=5, prefix="gt-s", convoys=True):
    from django.utils import timezone

    from convoys.infra import bulk
    from convoys.models import Bead, Convoy

    rng = random.Random(seed)
    now = timezone.now()
    rows = [
        {
            "id": f"{prefix}{i:05d}",
            "title": " ".join(rng.sample(WORDS, 4)).capitalize(),
            "description": " ".join(rng.choices(VOCABULARY, ZIPF, k=rng.randint(10, 40))),
            "labels": rng.sample(LABELS, rng.randint(0, 3)),
            "assignee": f"gastown/polecats/nux{rng.randint(0, 49)}" if rng.random() < 0.4 else "",
            "status": rng.choice(["open", "closed", "hooked", "in_progress"]),
            "created_at": now,
            "updated_at": now,
        }
        for i in range(count)
    ]
    started = time.perf_counter()
    bulk.insert(Bead, rows)
    loaded = time.perf_counter() - started
    if not convoys:
        return loaded
    made = [
        {
            "id": f"hq-cv-s{i:04d}",
            "title": " ".join(rng.sample(WORDS, 3)),
            "created_at": now,
            "updated_at": now,
        }
        for i in range(count // 100)
    ]
    bulk.insert(Convoy, made)
    return loaded


def without_triggers():
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            for event in ("insert", "update", "delete"):
                cursor.execute(f"DROP TRIGGER convoys_bead_search_{event}")
        else:
            cursor.execute("DROP TRIGGER convoys_bead_search_change ON convoys_bead")


def child(url, count, runs):
    setup(url)
    from django.db import connection

    from convoys.read import search

    loaded = build(count)
    print(f"{connection.vendor}: {count:,} beads loaded with the index in {loaded:.1f} s")
    for what, q in QUERIES:
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            found = search.search(q, limit=10)
            times.append((time.perf_counter() - started) * 1000)
        print(f"  {what:22} {q!r:18} {median(times):7.1f} ms  ({found.total:,} matches)")
    # What the triggers cost a load: the same 20,000 more beads with and without them.
    more = 20_000
    kept = build(more, seed=9, prefix="gt-t", convoys=False)
    without_triggers()
    bare = build(more, seed=9, prefix="gt-u", convoys=False)
    print(
        f"  load of {more:,} more beads: {kept:.2f} s with the index, {bare:.2f} s without "
        f"({kept / bare:.1f}x)"
    )


def fresh_postgres(url):
    import psycopg

    name = f"convoyweb_bench_search_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    return name, urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def drop_postgres(url, name):
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--beads", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child or None, args.beads, args.runs)
        return
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "BENCH_DATABASE_URL")}
    command = [sys.executable, __file__, "--beads", str(args.beads), "--runs", str(args.runs)]
    subprocess.run([*command, "--child", ""], env=env, check=True)
    server = os.environ.get("DATABASE_URL", "")
    if server.startswith("postgres"):
        name, url = fresh_postgres(server)
        try:
            subprocess.run([*command, "--child", url], env=env, check=True)
        finally:
            drop_postgres(server, name)


if __name__ == "__main__":
    main()
