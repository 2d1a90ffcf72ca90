"""`beads sync` pass times: a generated bd JSONL source of N beads (as bench/import.py makes
them), synced once into a fresh database, then passes timed: the source unchanged, and the
source with --changed records rewritten (a new title each run, every fifth one closed), each
the median over --runs. Prints both side by side with the process's peak RSS, and once the
unchanged pass of a process that has not read the source yet (no line known).

    .venv/bin/python bench/sync.py [--beads 100000] [--changed 100] [--runs 5]
"""

import argparse
import importlib.util
import json
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, setup, timed  # noqa: E402


def generator():
    """bench/import.py's generate (its module name is a keyword: loaded from its path)."""
    spec = importlib.util.spec_from_file_location(
        "bench_import", Path(__file__).with_name("import.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate


def rewrite(path, lines, changed, run):
    """The source with `changed` records spread over the file given a new title."""
    step = max(len(lines) // changed, 1)
    with open(path, "w") as out:
        for index, line in enumerate(lines):
            if index % step == 0 and index // step < changed:
                record = json.loads(line)
                record["title"] = f"{record['title']} (run {run})"
                if index // step % 5 == 0 and record["status"] != "closed":
                    record["status"] = "closed"
                    record["closed_at"] = record["updated_at"]
                line = json.dumps(record) + "\n"
            out.write(line)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--beads", type=int, default=100_000)
    parser.add_argument("--changed", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    setup()
    from convoys.services import sync

    folder = Path(tempfile.mkdtemp(prefix="convoyweb-sync-"))
    path = folder / "town.jsonl"
    generator()(path, args.beads)
    lines = path.read_text().splitlines(keepends=True)
    source = sync.FileSource(path)
    first, report = timed(sync.sync, source)
    print(f"first pass: {report.created:,} beads created in {first:.1f} s")
    sync._known_lines.clear()  # as a process that has not read this source yet
    cold, _ = timed(sync.sync, source)
    print(f"unchanged pass in a new process (every line parsed and checked): {cold:.2f} s")
    unchanged, changed = [], []
    for run in range(args.runs):
        seconds, report = timed(sync.sync, source)
        assert report.changed == 0, report
        unchanged.append(seconds)
        rewrite(path, lines, args.changed, run)
        seconds, report = timed(sync.sync, source)
        assert report.updated == args.changed, report
        changed.append(seconds)
        path.write_text("".join(lines))
        sync.sync(source)  # back to the generated source for the next unchanged pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{args.beads:,} beads ({path.stat().st_size / 1e6:.0f} MB): median unchanged pass "
        f"{median(unchanged):.2f} s | median pass with {args.changed} changed records "
        f"{median(changed):.2f} s | peak RSS {peak:.0f} MB"
    )
    print(f"  unchanged runs: {', '.join(f'{s:.2f}' for s in unchanged)}")
    print(f"  changed runs:   {', '.join(f'{s:.2f}' for s in changed)}")


if __name__ == "__main__":
    main()
