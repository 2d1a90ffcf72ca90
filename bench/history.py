"""The convoy's story over time, server time at 1,000 and 5,000 beads with a
realistic event log (every bead created, the convoy launched, beads dispatched and closed in
dependency order, some in progress: ~3 events a bead):

- the timeline by wave alone (`timeline.gantt`, the frontier wave), and the whole convoy page
  that draws it (GET), and its live update after one close;
- a time-slider step (GET /convoys/<id>/history/?step=N) in the middle and at the end of the
  log;
- the visit report (POST /convoys/<id>/visit/) after 50 events.

Medians of --runs, 5,000 / 1,000 ratios side by side. Goal: the timeline and a slider step
under 300 ms at 5,000 beads.

    .venv/bin/python bench/history.py [--runs 5]
"""

import argparse
import random
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, setup, timed  # noqa: E402


def build(size, rng, seq):
    """A convoy of `size` beads with its event log from `seq` + 1; returns (convoy id, last
    seq)."""
    from django.utils import timezone

    from convoys.infra import bulk
    from convoys.models import Bead, Convoy, Dependency, Event, TrackedBead

    prefix = f"gt-s{size}x"
    start = timezone.now() - timedelta(days=2)
    ids = [f"{prefix}{i:05d}" for i in range(size)]
    blockers = {b: [] for b in ids}
    deps = []
    for i, bead_id in enumerate(ids):
        for back in (7, 14, 21):
            if i - back >= 0 and rng.random() < 0.5:
                blockers[bead_id].append(ids[i - back])
                deps.append({"issue_id": bead_id, "depends_on_id": ids[i - back], "type": "blocks"})
    cid = f"hq-cv-s{size}"
    events, status = [], {}
    clock = [start]

    def event(kind, bead_id="", **data):
        nonlocal seq
        seq += 1
        clock[0] += timedelta(seconds=rng.uniform(0.5, 8))
        events.append(
            {
                "seq": seq,
                "kind": kind,
                "bead_id": bead_id,
                "convoy_id": cid if not bead_id or kind == "bead.dispatched" else "",
                "actor": "bench",
                "data": data,
                "created_at": clock[0],
            }
        )

    for bead_id in ids:
        event("bead.created", bead_id, status="open", assignee="", title="t")
    event("convoy.launched")
    # Work in dependency order: 60% closed, then some in progress, the rest open.
    for n, bead_id in enumerate(ids):
        if n < size * 0.6 and all(status.get(b) == "closed" for b in blockers[bead_id]):
            event("bead.dispatched", bead_id, status="hooked", assignee="gastown/polecats/nux")
            event("bead.closed", bead_id, status="closed", assignee="gastown/polecats/nux")
            status[bead_id] = "closed"
        elif n < size * 0.7 and all(status.get(b) == "closed" for b in blockers[bead_id]):
            event("bead.dispatched", bead_id, status="hooked", assignee="gastown/polecats/nux")
            status[bead_id] = "hooked"
    now = clock[0]
    bulk.insert(
        Bead,
        [
            {
                "id": b,
                "title": f"Bead {b}",
                "status": status.get(b, "open"),
                "issue_type": "task",
                "priority": 2,
                "created_at": start,
                "updated_at": now,
                "closed_at": now if status.get(b) == "closed" else None,
                "rig_id": "gastown",
                "assignee": "gastown/polecats/nux" if status.get(b) == "hooked" else "",
            }
            for b in ids
        ],
    )
    bulk.insert(Dependency, deps)
    Convoy.objects.create(
        id=cid, title=f"Story {size}", status="open", created_at=start, updated_at=now
    )
    bulk.insert(
        TrackedBead, [{"convoy_id": cid, "bead_id": b, "position": i} for i, b in enumerate(ids)]
    )
    bulk.insert(Event, events)
    return cid, seq


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    setup()
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from convoys.log.events import last_seq
    from convoys.models import Convoy, EventCounter, Worker
    from convoys.read import convoy_page, snapshots, timeline
    from convoys.services import beads, rigs

    rigs.upsert_route("gt-", "gastown")
    Worker.objects.create(
        name="gastown/polecats/nux", rig="gastown", last_seen=timezone.now() + timedelta(days=1)
    )
    rng = random.Random(14)
    seq = last_seq()
    convoys = {}
    for size in (1000, 5000):
        convoys[size], seq = build(size, rng, seq)
    EventCounter.objects.update_or_create(name="events", defaults={"value": seq})
    user = User.objects.create_superuser("bench", "bench@localhost", "pw-pw-pw-123")
    client = Client()
    client.force_login(user)

    def measure(fn):
        times, queries = [], 0
        for _ in range(args.runs):
            with CaptureQueriesContext(connection) as ctx:
                elapsed, _ = timed(fn)
            times.append(elapsed * 1000)
            queries = len(ctx.captured_queries)
        return median(times), queries

    def get(url, **headers):
        def run():
            response = client.get(url, headers=headers)
            assert response.status_code == 200, (url, response.status_code)
            return response

        return run

    results = {}
    for size, cid in convoys.items():
        convoy = Convoy.objects.get(pk=cid)
        url = f"/convoys/{cid}/"
        client.get(url)  # the layout, computed once per graph and cached
        now = timezone.now()
        snapshot = snapshots.load(convoy, now)
        page = convoy_page.convoy_page(convoy, {}, user, now, snapshot)
        steps = len(timeline.seqs(timeline.stream(convoy)))
        row = {}
        row["timeline alone"] = measure(
            lambda c=convoy, p=page, s=snapshot, t=now: timeline.gantt(c, p, s, {}, t)
        )
        row["convoy page (with it)"] = measure(get(url))
        row["slider step, middle"] = measure(get(f"/convoys/{cid}/history/?step={steps // 2}"))
        row["slider step, end"] = measure(get(f"/convoys/{cid}/history/?step={steps}"))
        drawn = last_seq()
        open_bead = next(b for b, r in snapshot.beads.items() if r.status == "open")
        beads.update_bead(open_bead, priority=1, actor="bench")
        row["live update after a change"] = measure(get(url, X_Live="1", X_Live_Since=str(drawn)))
        for n in range(50):
            beads.update_bead(open_bead, priority=n % 4, actor="bench")

        def visit(cid=cid):
            client.post(f"/convoys/{cid}/visit/", {"seq": "1"})
            response = client.post(f"/convoys/{cid}/visit/", {"seq": str(last_seq())})
            assert response.status_code == 200

        row["visit report (2 posts)"] = measure(visit)
        drawn_rows = timeline.gantt(convoy, page, snapshot, {}, now)
        results[size] = (row, steps, f"{len(drawn_rows.rows)} of wave {drawn_rows.wave}")
    print(f"{'':32} {'1,000 beads':>18} {'5,000 beads':>18} {'ratio':>7}")
    print(f"{'events in the stream':32} {results[1000][1]:>18,} {results[5000][1]:>18,}")
    print(f"{'timeline rows (frontier wave)':32} {results[1000][2]:>18} {results[5000][2]:>18}")
    for name in results[1000][0]:
        small, big = results[1000][0][name], results[5000][0][name]
        print(
            f"{name:32} {small[0]:>9.1f} ms ({small[1]:>2} q) {big[0]:>9.1f} ms ({big[1]:>2} q)"
            f" {big[0] / small[0]:>6.1f}x"
        )


if __name__ == "__main__":
    main()
