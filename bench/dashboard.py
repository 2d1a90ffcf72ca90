"""The dashboard of 200 convoys / 20,000 beads: a full render and a live update after one bead
changed (`X-Live`, `X-Live-Since`), medians over several rounds, with their query counts.
With --compare PATH the same measure runs against a second checkout (each tree in its own
process and database, taking turns), printed side by side with the ratio.

    .venv/bin/python bench/dashboard.py [--runs 9] [--compare ../other-checkout]
"""

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(runs):
    sys.path.insert(0, str(HERE))
    from _common import generated_epic, median, setup, timed, tracking_convoy

    setup()
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from convoys.log.events import last_seq
    from convoys.models import Bead, TrackedBead
    from convoys.read import projection
    from convoys.services import beads, rigs

    rigs.upsert_route("gt-", "gastown")
    rng, now = random.Random(7), timezone.now()
    for c in range(200):
        ids = generated_epic(f"gt-d{c:03d}x", 100, rng, now)
        tracking_convoy(f"hq-cv-d{c:04d}", f"Convoy {c}", ids, now)
    projection.rebuild()
    client = Client()
    client.force_login(User.objects.create_superuser("bench", "b@localhost", "pw-pw-pw-123"))
    client.get("/")
    tracked = TrackedBead.objects.values("bead_id")
    open_ids = list(
        Bead.objects.filter(pk__in=tracked, status="open").values_list("pk", flat=True)[: runs * 2]
    )
    full, live, queries = [], [], {}
    for bead_id in open_ids[:runs]:
        with CaptureQueriesContext(connection) as ctx:
            full.append(timed(client.get, "/")[0])
        queries["full"] = len(ctx.captured_queries)
        seq = last_seq()
        beads.update_bead(bead_id, title=f"renamed {bead_id}", actor="bench")
        headers = {"X-Live": "1", "X-Live-Since": str(seq)}
        with CaptureQueriesContext(connection) as ctx:
            live.append(timed(client.get, "/", headers=headers)[0])
        queries["live"] = len(ctx.captured_queries)
    return {
        "full": median(full) * 1000,
        "live": median(live) * 1000,
        "full_queries": queries["full"],
        "live_queries": queries["live"],
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--compare", type=Path, help="a second checkout, measured in turn")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one tree's run
    options = parser.parse_args()
    if options.json:
        print(json.dumps(measure(options.runs)))
        return
    trees = [HERE.parent] + ([options.compare.resolve()] if options.compare else [])
    found = {tree: [] for tree in trees}
    for _ in range(2):  # two turns each, alternating: a noisy machine hits both alike
        for tree in trees:
            out = subprocess.run(
                [
                    sys.executable,
                    str(tree / "bench" / "dashboard.py"),
                    "--json",
                    "--runs",
                    str(options.runs),
                ],
                cwd=tree,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            found[tree].append(json.loads(out.strip().splitlines()[-1]))
    print(f"dashboard, 200 convoys / 20,000 beads (median of {options.runs}, two turns)")
    for key, what in (("full", "full render"), ("live", "live update, one bead changed")):
        cells = []
        for tree in trees:
            ms = sorted(r[key] for r in found[tree])
            cells.append(
                f"{' / '.join(f'{m:.0f}' for m in ms)} ms ({found[tree][0][key + '_queries']} q)"
            )
        line = f"  {what:<32} this tree {cells[0]}"
        if options.compare:
            ratio = sum(r[key] for r in found[trees[1]]) / sum(r[key] for r in found[trees[0]])
            line += f"   compared {cells[1]}   {ratio:.1f}x"
        print(line)


if __name__ == "__main__":
    main()
