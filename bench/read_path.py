"""A convoy page's read path: does its cost grow with the convoy, and with the process asked?

Convoys of 1,000 and 20,000 beads (the shape of `generated_epic`: a third open, a fifth closed,
the rest at work) with 10 silent workers each (hooked beads whose workers last reported an
hour ago: the case that used to stop a page from carrying anything). Per convoy, median of
--runs rounds, alternating:
- first view / hard reload (`Cache-Control: no-cache`);
- a live update after one bead changed, asked of another web process (this process's own
  page memory emptied first: what a round-robin proxy does to a live page);
- the same live update asked of the process that drew the page.
Printed side by side with the ratio 20,000 : 1,000 and other : same process.
Goals: 20k ≤ 1.5× 1k for each request; other process ≤ 1.5× same process.

    .venv/bin/python bench/read_path.py [--runs 5] [--sizes 1000,20000]
"""

import argparse
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import generated_convoys, median, setup, superuser_client, timed  # noqa: E402

SILENT = 10


def build(sizes):
    from django.utils import timezone

    from convoys.models import Bead, Worker
    from convoys.read import projection

    now = timezone.now()
    for size, ids in generated_convoys("r", sizes, seed=11).items():
        hooked = list(
            Bead.objects.filter(pk__in=ids, status="hooked").values_list("pk", flat=True)[:SILENT]
        )
        for n, bead_id in enumerate(hooked):
            name = f"gastown/polecats/silent{size}-{n}"
            Worker.objects.create(name=name, rig="gastown", last_seen=now - timedelta(hours=1))
            Bead.objects.filter(pk=bead_id).update(assignee=name)
    projection.rebuild()
    client = superuser_client()
    return client


def forget():
    """What a web process that did not draw the page lacks: its own page memory (this tree
    keeps none; older trees, measured with this script for comparison, kept snapshots)."""
    from convoys.read import snapshots

    cache = getattr(snapshots, "_cache", None)
    if cache is not None:
        with snapshots._lock:
            cache.clear()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", default="1000,20000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    setup()
    from convoys.log.events import last_seq
    from convoys.models import Bead, TrackedBead
    from convoys.services import beads

    elapsed, client = timed(build, sizes)
    print(f"built convoys of {', '.join(map(str, sizes))} beads in {elapsed:.1f} s")

    def get(url, headers):
        took, response = timed(client.get, url, headers=headers)
        assert response.status_code == 200, (url, response.status_code)
        return took

    results = {size: {"hard": [], "other": [], "same": []} for size in sizes}
    opened = {}
    for size in sizes:
        tracked = TrackedBead.objects.filter(convoy_id=f"hq-cv-r{size}").values("bead_id")
        opened[size] = list(
            Bead.objects.filter(pk__in=tracked, status="open").values_list("pk", flat=True)
        )
        get(f"/convoys/hq-cv-r{size}/", {})  # lays out the graph once
    for _ in range(args.runs):
        for size in sizes:
            url = f"/convoys/hq-cv-r{size}/"
            times = results[size]
            times["hard"].append(get(url, {"Cache-Control": "no-cache"}))
            for where in ("other", "same"):
                get(url, {"Cache-Control": "no-cache"})
                seq = last_seq()
                bead_id = opened[size].pop()
                beads.update_bead(bead_id, status="in_progress", assignee="bench", actor="bench")
                if where == "other":
                    forget()
                headers = {"X-Live": "1", "X-Live-Since": str(seq)}
                times[where].append(get(url, headers))
    small, large = sizes[0], sizes[-1]
    print(f"\nmedian of {args.runs}, ms")
    print(f"{'request':<44} {small:>8} {large:>8} {'ratio':>7}")
    labels = {
        "hard": "first view / hard reload",
        "other": "live update, another web process",
        "same": "live update, same process",
    }
    for key, label in labels.items():
        a, b = median(results[small][key]), median(results[large][key])
        print(f"{label:<44} {a * 1000:>8.1f} {b * 1000:>8.1f} {b / a:>6.1f}x")
    for size in sizes:
        other, same = median(results[size]["other"]), median(results[size]["same"])
        print(f"live update at {size}: another process / same process {other / same:.1f}x")
    print("goals: 20k <= 1.5x 1k for each request; another process <= 1.5x the same process")


if __name__ == "__main__":
    main()
