"""What "why is this not moving?" costs: `causes.for_convoy` on convoys of 1,000 and 5,000
beads (a third done, some in flight, chains of blockers, a parked rig, failed dispatches, a
max in flight), read alone and handed the convoy page's snapshot, beside the whole convoy page
that shows it; medians of alternating rounds, queries, and the causes' share of the page.

    .venv/bin/python bench/causes.py [--runs 5]
"""

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, setup, timed  # noqa: E402


def build(sizes):
    from django.contrib.auth.models import User
    from django.test import Client
    from django.utils import timezone

    from convoys.infra import bulk
    from convoys.models import Bead, Convoy, Dependency, Dispatch, TrackedBead
    from convoys.services import rigs

    rigs.upsert_route("gt-", "gastown")
    rigs.upsert_route("pk-", "parkrig")
    rigs.set_rig_state("parkrig", "parked", actor="bench")
    rng = random.Random(7)
    now = timezone.now()
    convoys = {}
    for size in sizes:
        beads, deps, dispatches = [], [], []
        for i in range(size):
            status = rng.choice(["open", "open", "closed", "hooked", "in_progress"])
            bead_id = f"{'pk' if i % 50 == 0 else 'gt'}-c{size}x{i:05d}"
            beads.append(
                {
                    "id": bead_id,
                    "title": f"Bead {i}",
                    "status": status,
                    "issue_type": "task" if i % 97 else "decision",
                    "priority": rng.choice([1, 2, 2, 3]),
                    "created_at": now,
                    "updated_at": now,
                    "closed_at": now if status == "closed" else None,
                    "rig_id": "parkrig" if i % 50 == 0 else "gastown",
                    "assignee": f"gastown/polecats/w{i}"
                    if status in ("hooked", "in_progress")
                    else "",
                    "dispatch_failures": 3 if i % 89 == 0 else 0,
                }
            )
            if i >= 7 and rng.random() < 0.5:
                deps.append(
                    {"issue_id": bead_id, "depends_on_id": beads[i - 7]["id"], "type": "blocks"}
                )
            if i % 31 == 0:
                dispatches.append(
                    {"bead_id": bead_id, "path": "event", "ok": False, "created_at": now}
                )
        bulk.insert(Bead, beads)
        bulk.insert(Dependency, deps)
        bulk.insert(Dispatch, dispatches)
        cid = f"hq-cv-c{size}"
        Convoy.objects.create(
            id=cid, title=cid, status="open", created_at=now, updated_at=now, max_in_flight=400
        )
        bulk.insert(
            TrackedBead,
            [{"convoy_id": cid, "bead_id": b["id"], "position": n} for n, b in enumerate(beads)],
        )
        convoys[size] = Convoy.objects.get(pk=cid)
    User.objects.create_superuser("bench", password="bench-bench-1")
    client = Client()
    client.force_login(User.objects.get(username="bench"))
    return client, convoys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    setup()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from convoys.read import snapshots
    from convoys.rules import causes

    client, convoys = build((1000, 5000))
    print(f"{'convoy':<14}{'causes alone':>14}{'with snapshot':>15}{'page':>10}{'share':>8}")
    for size, convoy in convoys.items():
        client.get(f"/convoys/{convoy.pk}/")  # warm: layout cached
        alone, handed, page = [], [], []
        for _ in range(args.runs):
            alone.append(timed(causes.for_convoy, convoy)[0])
            snap = snapshots.load(convoy, timezone.now())
            handed.append(timed(causes.for_convoy, convoy, None, snap)[0])
            page.append(timed(client.get, f"/convoys/{convoy.pk}/")[0])
        with CaptureQueriesContext(connection) as fresh:
            found = causes.for_convoy(convoy)
        snap = snapshots.load(convoy, timezone.now())
        with CaptureQueriesContext(connection) as given:
            causes.for_convoy(convoy, known=snap)
        share = median(handed) / median(page)
        print(
            f"{size:>5} beads   {median(alone) * 1000:>9.0f} ms {median(handed) * 1000:>10.0f} ms"
            f"{median(page) * 1000:>8.0f} ms{share:>7.0%}"
        )
        print(
            f"              queries: alone {len(fresh)}, with snapshot {len(given)}; "
            f"{causes.summary(found)}"
        )


if __name__ == "__main__":
    main()
