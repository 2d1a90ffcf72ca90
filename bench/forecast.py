"""How often a forecast made halfway through a real epic held: the real exports' closed epics
replayed through the product's forecast (`convoys.core.forecast`).

For each closed epic with at least --min-children closed children (parent-child edges): at
the moment half its children had closed, the forecast takes the lead times (created to
closed) of the children closed so far as its samples (by the product's `forecast.pool`: with
fewer than three, the store's most recent ones, as a convoy takes its rigs'), the children
left as its work, and the
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


def lead_times(records):
    """[(created, closed)] of every closed bead of the store but its epics, by close."""
    times = []
    for record in records:
        created, closed = moment(record.get("created_at")), moment(record.get("closed_at"))
        if record.get("issue_type") != "epic" and created and closed and closed >= created:
            times.append((created, closed))
    return sorted(times, key=lambda t: t[1])


def epics(records, least):
    """(epic id, [(created, closed)] of its closed children) of each closed epic."""
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


def replay(times, town):
    """(p50 hit, p90 hit, own samples, actual / forecast time left) of the forecast made
    halfway; `town`: the store's lead times, its rigs' recent ones in the product's pool."""
    half = len(times) // 2
    done = times[:half]
    now = done[-1][1]
    start = min(created for created, _ in times)
    own = [(closed - created).total_seconds() for created, closed in done]
    children = set(times)

    def wider():
        before = [t for t in town if t[1] <= now and t not in children]
        return [(closed - created).total_seconds() for created, closed in before[-forecast.WIDER :]]

    seconds, is_own = forecast.pool(own, wider)
    elapsed = max((now - start).total_seconds(), 1.0)
    width = max(1, round(sum(own) / elapsed))
    left = len(times) - half
    steps = forecast.steps_left(1, left, width)
    found = forecast.forecast(seconds, steps, now)
    end = times[-1][1]
    if found is None:
        return None
    predicted = max((found.p50 - now).total_seconds(), 1.0)
    return end <= found.p50, end <= found.p90, is_own, (end - now).total_seconds() / predicted


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
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        town = lead_times(records)
        for epic_id, times in epics(records, args.min_children):
            result = replay(times, town)
            if result is not None:
                rows.append((path.name, epic_id, len(times), *result))
    if not rows:
        sys.exit("no closed epic with enough closed children")
    p50_hits = sum(1 for r in rows if r[3]) / len(rows)
    p90_hits = sum(1 for r in rows if r[4]) / len(rows)
    ratio = statistics.median(r[6] for r in rows)
    own = sum(1 for r in rows if r[5])
    print(f"{len(rows)} closed epics with at least {args.min_children} closed children")
    print(f"  {own} forecast from their own children's times, {len(rows) - own} from the store's")
    print(f"{'forecast made halfway':<34} {'held':>8}")
    print(f"{'50th percentile':<34} {p50_hits:>7.0%}")
    print(f"{'90th percentile':<34} {p90_hits:>7.0%}   goal >= {GOAL:.0%}")
    print(f"median actual / forecast time left: {ratio:.2f}x")


if __name__ == "__main__":
    main()
