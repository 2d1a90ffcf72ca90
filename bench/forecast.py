"""How often a forecast made halfway through a real epic held: the real exports' closed epics
replayed through the product's forecast (`convoys.core.forecast`).

For each closed epic with at least --min-children closed children (parent-child edges): at
the moment half its children had closed, the forecast takes the lead times (created to
closed) of the children closed so far as its samples, the children left as its work, and the
width the epic showed so far (its children's time in progress over the time elapsed, at
least 1). Its 90th percentile is a hit when the epic's last child closed no later. Goal: at
least 85% hits. Also prints the 50th percentile's hits (about half, for a fair forecast) and
the median of actual / forecast time left. Reads ../shared/data/beads in place; no database.

    .venv/bin/python bench/forecast.py [--min-children 4]
"""

import argparse
import json
import statistics
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from convoys.core import forecast  # noqa: E402

EXPORTS = ROOT.parent / "shared" / "data" / "beads"
GOAL = 0.85


def moment(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def epics(path, least):
    """(epic id, [(created, closed)] of its closed children) of each closed epic."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_id = {r["id"]: r for r in records}
    children = defaultdict(list)
    for record in records:
        for dep in record.get("dependencies") or []:
            if dep.get("type") == "parent-child":
                children[dep.get("depends_on_id")].append(record["id"])
    for record in records:
        if record.get("issue_type") != "epic" or record.get("status") != "closed":
            continue
        times = []
        for kid in children[record["id"]]:
            child = by_id.get(kid, {})
            created, closed = moment(child.get("created_at")), moment(child.get("closed_at"))
            if created and closed and closed >= created:
                times.append((created, closed))
        if len(times) >= least:
            yield record["id"], sorted(times, key=lambda t: t[1])


def replay(times):
    """(p50 hit, p90 hit, actual / forecast time left) of the forecast made halfway."""
    half = len(times) // 2
    done = times[:half]
    now = done[-1][1]
    start = min(created for created, _ in times)
    seconds = [(closed - created).total_seconds() for created, closed in done]
    elapsed = max((now - start).total_seconds(), 1.0)
    width = max(1, round(sum(seconds) / elapsed))
    left = len(times) - half
    steps = forecast.steps_left(1, left, width)
    found = forecast.forecast(seconds, steps, now)
    end = times[-1][1]
    if found is None:
        return None
    predicted = max((found.p50 - now).total_seconds(), 1.0)
    return end <= found.p50, end <= found.p90, (end - now).total_seconds() / predicted


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--min-children", type=int, default=4)
    args = parser.parse_args()
    if not EXPORTS.exists():
        sys.exit(f"{EXPORTS} is absent (../shared next to the clone)")
    rows = []
    for path in sorted(EXPORTS.glob("*issues.jsonl")):
        if "@" in path.name:  # an older snapshot of the same store
            continue
        for epic_id, times in epics(path, args.min_children):
            result = replay(times)
            if result is not None:
                rows.append((path.name, epic_id, len(times), *result))
    if not rows:
        sys.exit("no closed epic with enough closed children")
    p50_hits = sum(1 for r in rows if r[3]) / len(rows)
    p90_hits = sum(1 for r in rows if r[4]) / len(rows)
    ratio = statistics.median(r[5] for r in rows)
    print(f"{len(rows)} closed epics with at least {args.min_children} closed children")
    print(f"{'forecast made halfway':<34} {'held':>8}")
    print(f"{'50th percentile':<34} {p50_hits:>7.0%}")
    print(f"{'90th percentile':<34} {p90_hits:>7.0%}   goal >= {GOAL:.0%}")
    print(f"median actual / forecast time left: {ratio:.2f}x")


if __name__ == "__main__":
    main()
