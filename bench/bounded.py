"""What one request may cost: time and size of the answers a big convoy makes, each beside the
limit it must stay within, and the web process's memory after a view-only user's worst
sequence of requests.

One process plays the web process (Django's test client, a view-only user). Data: an epic of
50,000 beads imported from JSONL (each task blocked by up to two recent ones) and a convoy
tracking them, with a third of them closed, plus a 20,000-bead convoy of the same shape.
Printed per request: median time of --runs, the answer's size, and its limit. Then, for
--rounds rounds, the viewer hard-reloads every big page and API answer while a bead of each
convoy closes between rounds: RSS before, at its peak and after, beside the bound (the first
round's peak + GROWTH_MB: nothing is kept between requests, so later rounds do not grow).

    .venv/bin/python bench/bounded.py [--size 50000] [--runs 3] [--rounds 6]
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, setup, timed  # noqa: E402
from stage import epic_file  # noqa: E402

MB = 2**20
LIMIT_BYTES = 1 * MB  # every page and API answer of a convoy, whatever its size
STAGE_SECONDS_PER_10K = 2.0  # staging is linear: this per 10,000 beads
GROWTH_MB = 64  # what later rounds may add to the first round's peak (allocator slack)


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=50000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    setup()
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    from convoys.models import Bead
    from convoys.read import projection
    from convoys.services import beads, jsonl, rigs, staging

    rigs.upsert_route("gt-", "gastown")
    folder = Path(tempfile.mkdtemp(prefix="convoyweb-bounded-"))
    path = folder / "epic.jsonl"
    epic_file(path, args.size)
    jsonl.import_file(path)
    ids = [f"gt-t{i:06d}" for i in range(args.size)]
    big = staging.stage(["gt-epic"], "Big epic").convoy_id
    small = staging.stage(ids[: args.size * 2 // 5], "Smaller").convoy_id
    Bead.objects.filter(pk__in=ids[: args.size // 3]).update(status="closed")
    projection.rebuild()
    viewer = User.objects.create_user("viewer", password="x")
    viewer.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    stager = User.objects.create_superuser("stager", password="x")
    client, admin = Client(), Client()
    client.force_login(viewer)
    admin.force_login(stager)
    hard = {"Cache-Control": "no-cache"}

    requests = [
        ("convoy page, hard reload", lambda: client.get(f"/convoys/{big}/", headers=hard)),
        ("convoy page ?all=1", lambda: client.get(f"/convoys/{big}/?all=1", headers=hard)),
        ("convoy page ?expand=1", lambda: client.get(f"/convoys/{big}/?expand=1", headers=hard)),
        ("API convoy detail", lambda: client.get(f"/api/convoys/{big}")),
        (
            "API convoy detail, last window",
            lambda: client.get(f"/api/convoys/{big}?offset={args.size - 10}"),
        ),
        (
            "smaller convoy page, hard reload",
            lambda: client.get(f"/convoys/{small}/", headers=hard),
        ),
        ("stage page ?epic=", lambda: client.get("/stage/?epic=gt-epic")),
    ]
    print(f"{args.size:,} beads; limit per answer {LIMIT_BYTES / MB:.0f} MB")
    print(f"{'request':<34} {'median':>8} {'size':>9} {'limit':>9}")
    for label, request in requests:
        times, size = [], 0
        for _ in range(args.runs):
            elapsed, response = timed(request)
            assert response.status_code == 200, (label, response.status_code)
            times.append(elapsed)
            size = len(response.content)
        flag = "" if size <= LIMIT_BYTES else "  OVER"
        print(
            f"{label:<34} {median(times) * 1000:>6.0f}ms {size / MB:>7.2f}MB {LIMIT_BYTES / MB:>7.0f}MB{flag}"
        )

    for count in sorted({min(20000, args.size), args.size}):
        body = json.dumps({"ids": ids[:count]})
        times = []
        for _ in range(args.runs):
            elapsed, response = timed(
                admin.post, "/api/stage", body, content_type="application/json"
            )
            assert response.status_code == 200, response.content[:200]
            times.append(elapsed)
        limit = STAGE_SECONDS_PER_10K * count / 10000
        print(
            f"{'POST /api/stage, ' + f'{count:,} ids':<34} {median(times) * 1000:>6.0f}ms "
            f"{len(response.content) / MB:>7.2f}MB {limit:>7.1f}s"
        )

    budget = GROWTH_MB * MB
    start = peak = rss()
    first = None
    open_ids = iter(ids[args.size // 3 :])
    for number in range(args.rounds):
        for _label, request in requests[:6]:
            request()
            peak = max(peak, rss())
        beads.close_bead(next(open_ids), reason="bench")  # in both convoys
        if number == 0:
            first = peak
    end = rss()
    bound = first + budget
    print(
        f"RSS over {args.rounds} rounds: start {start / MB:.0f} MB, first round's peak "
        f"{first / MB:.0f} MB, peak {peak / MB:.0f} MB, end {end / MB:.0f} MB; "
        f"bound (first round's peak + {GROWTH_MB} MB) "
        f"{bound / MB:.0f} MB{'  OVER' if peak > bound else ''}"
    )


if __name__ == "__main__":
    main()
