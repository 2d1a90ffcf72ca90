"""Forge webhook deliveries a second: signed GitHub `pull_request` deliveries posted one after
the other to /hooks/github through Django's test client (the whole middleware stack, the
HMAC checked, the JSON read, the delivery kept), half of them naming a known bead (merged:
its Merge row, a `bead.merged` event and the feeder's task queued after the commit), half
naming none. Each round posts --deliveries fresh ones (new delivery ids, new beads); then the
first tenth of them again, every one a duplicate. Median of --runs rounds.
As in a served town, the connection is closed after each request (CONN_MAX_AGE is 0; a
server's request_finished does it, the test client does not) while another connection holds
the database open (the relay's, the task cluster's); without one, each close of the last
connection checkpoints SQLite's WAL (`--alone` measures that).
Goal: at least 200 deliveries a second on SQLite. The known beads are tracked by no convoy;
with --tracked each ten of them are the submitted beads of a convoy under `mr`, so every merge
refreshes its convoy and every tenth lands one (its notice, its webhooks' rows).

    .venv/bin/python bench/forge_hooks.py [--runs 3] [--deliveries 500] [--tracked]
"""

import argparse
import hashlib
import hmac
import json
import os
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, percentile, setup, timed  # noqa: E402

SECRET = "bench-secret"
GOAL = 200.0


def payload(n, bead_id):
    branch = f"polecat/nux/{bead_id}" if bead_id else f"feature/spin-{n}"
    return {
        "action": "closed",
        "number": n,
        "pull_request": {
            "html_url": f"https://github.com/gastown/rig/pull/{n}",
            "number": n,
            "state": "closed",
            "title": f"Change {n}",
            "body": "Spins the widget, as the bead asks.\n\n" + "Some words. " * 40,
            "merged": True,
            "merge_commit_sha": hashlib.sha1(str(n).encode()).hexdigest(),
            "head": {"ref": branch, "sha": "6dcb09b5b57875f334f61aebed695e2e4193db5e"},
            "base": {"ref": "main", "sha": "9049f1265b7d61be4a8904a9a27120d2064dab3b"},
        },
        "repository": {"full_name": "gastown/rig"},
        "sender": {"login": "mayor"},
    }


def signed(n, bead_id):
    body = json.dumps(payload(n, bead_id)).encode()
    digest = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "X-GitHub-Event": "pull_request",
        "X-GitHub-Delivery": f"bench-{n}",
        "X-Hub-Signature-256": f"sha256={digest}",
    }
    return body, headers


def build(beads, tracked=False):
    from django.utils import timezone

    from convoys.infra import bulk
    from convoys.models import Bead
    from convoys.services import convoys, rigs

    rigs.upsert_route("gt-", "gastown")
    now = timezone.now()
    rows = [
        {
            "id": f"gt-hook{i:05d}",
            "title": f"Bead {i}",
            "status": "closed",
            "issue_type": "task",
            "priority": 2,
            "created_at": now,
            "updated_at": now,
            "closed_at": now,
            "rig_id": "gastown",
        }
        for i in range(beads)
    ]
    bulk.insert(Bead, rows)
    if tracked:
        ids = [row["id"] for row in rows]
        for start in range(0, len(ids), 10):
            convoys.create(f"Convoy {start}", ids[start : start + 10], merge="mr")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--deliveries", type=int, default=500)
    parser.add_argument("--alone", action="store_true", help="no other connection open")
    parser.add_argument(
        "--tracked", action="store_true", help="the known beads in convoys under mr, ten each"
    )
    args = parser.parse_args()
    os.environ["CONVOY_GITHUB_SECRET"] = SECRET
    url = setup()
    from django.db import close_old_connections
    from django.test import Client

    from convoys.models import ForgeDelivery, Merge

    count = args.deliveries
    elapsed, _ = timed(build, args.runs * count // 2, args.tracked)
    where = "in convoys under mr" if args.tracked else "in no convoy"
    print(f"built {args.runs * count // 2:,} closed beads {where} in {elapsed:.1f} s (SQLite)")
    client = Client()
    neighbour = None if args.alone else sqlite3.connect(url.removeprefix("sqlite:///"))
    if neighbour is not None:
        neighbour.execute("SELECT count(*) FROM convoys_bead").fetchone()

    def served(body, headers):
        response = client.post(
            "/hooks/github", body, content_type="application/json", headers=headers
        )
        close_old_connections()  # what a server's request_finished does
        return response

    def post(body, headers):
        took, response = timed(served, body, headers)
        return took, response.status_code

    rates, replays, latencies = [], [], {200: [], 202: []}
    for run in range(args.runs):
        first = run * count
        known = iter(range(run * count // 2, (run + 1) * count // 2))
        requests = [
            signed(n, f"gt-hook{next(known):05d}" if n % 2 == 0 else "")
            for n in range(first, first + count)
        ]
        took, answers = timed(lambda requests=requests: [post(b, h) for b, h in requests])
        statuses = sorted({status for _, status in answers})
        assert statuses == [200, 202], statuses
        rates.append(count / took)
        for t, status in answers:
            latencies[status].append(t)
        again = requests[: count // 10]
        took, answers = timed(lambda again=again: [post(b, h) for b, h in again])
        assert {status for _, status in answers} == {200}
        replays.append(len(again) / took)
        print(f"  round {run + 1}: {rates[-1]:6.0f} deliveries/s, duplicates {replays[-1]:6.0f}/s")
    merged = Merge.objects.filter(state="merged").count()
    assert merged == args.runs * count // 2, merged
    assert ForgeDelivery.objects.count() == args.runs * count
    alone = "no other connection open" if args.alone else "another connection open"
    print(
        f"\n{count} signed deliveries a round, half naming a known bead {where}, {alone} "
        f"(median of {args.runs})"
    )
    print(f"  deliveries/s        {median(rates):8.0f}   goal >= {GOAL:.0f}")
    print(f"  duplicates/s        {median(replays):8.0f}")
    for status, what in ((200, "a known bead merged"), (202, "no known bead")):
        times = latencies[status]
        print(
            f"  {what:20s}  p50 {percentile(times, 50) * 1000:5.2f} ms, "
            f"p99 {percentile(times, 99) * 1000:5.2f} ms, {len(times) / sum(times):5.0f}/s alone"
        )


if __name__ == "__main__":
    main()
