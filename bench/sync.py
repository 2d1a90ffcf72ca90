"""`beads sync` measured: pass times, memory, and the lag from a close in bd to the
next dispatch. Each part runs in a process of its own, on a fresh database.

- times: a generated bd JSONL source of --beads beads (as bench/import.py makes them), synced
  once, then passes timed: the source unchanged (in this process, and as in another one:
  what this process keeps of its last pass dropped), and the source with --changed records
  rewritten (a new title each run, every fifth one closed), each the median over --runs.
- memory: at 1x and --scale x the size, the source synced once (creating the beads), then a
  new process runs two unchanged passes and a pass with --changed records; its peak RSS
  above its own RSS before the first pass is what the passes took. Flat means the 5x figure is about the 1x one.
- lag: a town of --filler generated beads plus a chain of --closes + 1 beads, launched; a real
  task cluster (`manage.py cluster`) with CONVOY_SYNC_SOURCES set to the town and
  CONVOY_SYNC_INTERVAL=1. The bench closes the chain's beads one at a time in the town's file
  (a random 0-1 s apart, so closes fall anywhere between two ticks) and measures from the
  file's rename to the next bead's dispatch row: p50, p99 and max (goal p99 < 1.5 s), and
  the two parts of it (to the pass that wrote the bead.closed event, and from there to the
  dispatch). --busy N runs N processes that only burn CPU meanwhile (a loaded machine);
  --verbose prints each lag and the cluster's pass times, and keeps its log.

    .venv/bin/python bench/bdsync.py [--beads 100000] [--changed 100] [--runs 5] [--scale 5]
        [--closes 60] [--filler 1000] [--busy 0] [--parts times,memory,lag] [--verbose]
"""

import argparse
import importlib.util
import json
import logging
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, median, percentile, setup, timed  # noqa: E402


def generator() -> Callable[..., Any]:
    """bench/import.py's generate (its module name is a keyword: loaded from its path)."""
    spec = importlib.util.spec_from_file_location(
        "bench_import", Path(__file__).with_name("import.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    generate: Callable[..., Any] = module.generate
    return generate


def rewrite(original: Path, path: Path, count: int, changed: int, run: int) -> None:
    """`path` becomes `original` with `changed` records spread over it given a new title
    (every fifth one closed), written line by line (nothing held) and renamed into place."""
    step = max(count // changed, 1)
    with open(original) as source, open(f"{path}.new", "w") as out:
        for index, line in enumerate(source):
            if index % step == 0 and index // step < changed:
                record = json.loads(line)
                record["title"] = f"{record['title']} (run {run})"
                if index // step % 5 == 0 and record["status"] != "closed":
                    record["status"] = "closed"
                    record["closed_at"] = record["updated_at"]
                line = json.dumps(record) + "\n"
            out.write(line)
    os.replace(f"{path}.new", path)


def restore(original: Path, path: Path) -> None:
    """`path` becomes a copy of `original` (renamed into place)."""
    shutil.copyfile(original, f"{path}.new")
    os.replace(f"{path}.new", path)


def quiet() -> None:
    """No INFO lines (django-q's "Enqueued" for every close), once Django set up logging."""
    logging.disable(logging.INFO)


def rss_mb() -> float:
    """This process's peak RSS in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def part_times(args: argparse.Namespace, folder: Path) -> None:
    """The pass times (see the module's docstring)."""
    setup()
    quiet()
    from convoys.services import bdsync
    from convoys.services.bdsync import memo

    path, original = folder / "town.jsonl", folder / "generated.jsonl"
    generator()(original, args.beads)
    restore(original, path)
    source = bdsync.FileSource(path)
    first, report = timed(bdsync.sync, source)
    print(f"first pass: {report.created:,} beads created in {first:.1f} s")
    unchanged, changed, elsewhere = [], [], []
    for run in range(args.runs):
        seconds, report = timed(bdsync.sync, source)
        assert report.changed == 0, report
        unchanged.append(seconds)
        memo.MEMOS.clear()  # as in another process: only what is stored
        seconds, report = timed(bdsync.sync, source)
        assert report.changed == 0, report
        elsewhere.append(seconds)
        rewrite(original, path, args.beads, args.changed, run)
        seconds, report = timed(bdsync.sync, source)
        assert report.updated == args.changed, report
        changed.append(seconds)
        restore(original, path)
        bdsync.sync(source)  # back to the generated source for the next unchanged pass
    print(
        f"{args.beads:,} beads ({path.stat().st_size / 1e6:.0f} MB): median unchanged pass "
        f"{median(unchanged):.2f} s (goal < 1 s) | median pass with {args.changed} changed "
        f"records {median(changed):.2f} s (goal < 2 s)"
    )
    print(f"  unchanged runs: {', '.join(f'{s:.2f}' for s in unchanged)}")
    print(
        f"  unchanged, in another process (nothing of this one's kept): median "
        f"{median(elsewhere):.2f} s, runs {', '.join(f'{s:.2f}' for s in elsewhere)}"
    )
    print(f"  changed runs:   {', '.join(f'{s:.2f}' for s in changed)}")


def part_memory_passes(args: argparse.Namespace, folder: Path) -> None:
    """In a process of its own: the passes whose memory is measured."""
    setup(os.environ["BENCH_SYNC_DATABASE"])
    quiet()
    from convoys.services import bdsync

    path, original = folder / "town.jsonl", folder / "generated.jsonl"
    source = bdsync.FileSource(path)
    before = rss_mb()
    passes = {}
    passes["unchanged"], _ = timed(bdsync.sync, source)
    passes["unchanged again"], _ = timed(bdsync.sync, source)
    rewrite(original, path, args.beads, args.changed, 0)
    passes[f"{args.changed} changed"], _ = timed(bdsync.sync, source)
    restore(original, path)
    bdsync.sync(source)
    print(json.dumps({"before": before, "peak": rss_mb(), "passes": passes}))


def part_memory(args: argparse.Namespace, folder: Path) -> None:
    """The memory of the passes at 1x and --scale x (each in processes of its own)."""
    results = {}
    for scale in (1, args.scale):
        beads = args.beads * scale
        where = Path(tempfile.mkdtemp(prefix="convoyweb-sync-memory-"))
        url = f"sqlite:///{where}/bench.sqlite3"
        generator()(where / "generated.jsonl", beads)
        restore(where / "generated.jsonl", where / "town.jsonl")
        started = time.perf_counter()
        child(["--part", "memory-create", "--beads", str(beads)], where, url)
        created = time.perf_counter() - started
        out = child(
            ["--part", "memory-passes", "--beads", str(beads), "--changed", str(args.changed)],
            where,
            url,
        )
        results[scale] = json.loads(out.splitlines()[-1])
        took = results[scale]["peak"] - results[scale]["before"]
        times = ", ".join(f"{k} {v:.2f} s" for k, v in results[scale]["passes"].items())
        print(
            f"{scale}x ({beads:,} beads, created in {created:.0f} s): passes took "
            f"{took:.0f} MB above the process's {results[scale]['before']:.0f} MB ({times})"
        )
        shutil.rmtree(where, ignore_errors=True)
    small, big = (results[s]["peak"] - results[s]["before"] for s in (1, args.scale))
    print(f"memory of the passes, {args.scale}x vs 1x: {big / max(small, 1):.2f}x (flat: ~1x)")


def part_memory_create(args: argparse.Namespace, folder: Path) -> None:
    """In a process of its own: the first pass, creating the beads."""
    setup(os.environ["BENCH_SYNC_DATABASE"])
    quiet()
    from convoys.services import bdsync

    bdsync.sync(bdsync.FileSource(folder / "town.jsonl"))


def child(argv: list[str], folder: Path, url: str) -> str:
    """Run this script with `argv` on the database `url`; its standard output."""
    env = {**os.environ, "BENCH_SYNC_DATABASE": url, "BENCH_SYNC_FOLDER": str(folder)}
    done = subprocess.run(
        [sys.executable, __file__, *argv], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SystemExit(f"{argv}: exited {done.returncode}\n{done.stderr[-3000:]}")
    return done.stdout


def close_in(path: Path, bead_id: str) -> float:
    """Rewrite the town's record of `bead_id` closed, as a worker would; returns the moment
    the new file is in place."""
    with open(path) as source, open(f"{path}.new", "w") as out:
        for line in source:
            if bead_id in line:
                record = json.loads(line)
                if record["id"] == bead_id:
                    record.update(status="closed", closed_at="2026-12-01T10:00:00Z")
                    line = json.dumps(record) + "\n"
            out.write(line)
    os.replace(f"{path}.new", path)
    return time.time()


def part_lag(args: argparse.Namespace, folder: Path) -> None:
    """The lag from a close written to the source to the next dispatch, under a cluster."""
    url = setup()
    quiet()
    from convoys.models import Dispatch, Event, SyncSource
    from convoys.services import bdsync, rigs, staging
    from convoys.services.launch import launch_staged

    rigs.upsert_route("gt-", "gastown")
    town = folder / "town.jsonl"
    generator()(town, args.filler)
    chain = [f"gt-chain{i:04d}" for i in range(args.closes + 1)]
    with open(town, "a") as out:
        for index, bead_id in enumerate(chain):
            deps = [{"issue_id": bead_id, "depends_on_id": chain[index - 1], "type": "blocks"}]
            record = {
                "id": bead_id,
                "title": f"Step {index}",
                "status": "open",
                "priority": 2,
                "issue_type": "task",
                "created_at": "2026-12-01T09:00:00Z",
                "dependencies": deps if index else [],
            }
            out.write(json.dumps(record) + "\n")
    bdsync.sync(bdsync.FileSource(town))
    launch_staged(staging.stage(chain).convoy_id, force=True)
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "PYTHONUNBUFFERED": "1",
        "CONVOY_SYNC_SOURCES": str(town),
        "CONVOY_SYNC_INTERVAL": "1",
        **({"LOG_LEVEL": "DEBUG"} if args.verbose else {}),
    }
    log = open(folder / "cluster.log", "w")  # noqa: SIM115 (the child writes it)
    cluster = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "cluster"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    # Processes that only burn CPU (--busy): the passes and the dispatch on a loaded machine.
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    rng = random.Random(1)
    lags, seen = [], []
    try:
        started = time.time()
        while not SyncSource.objects.filter(last_pass_at__gt=_aware(started)).exists():
            if time.time() - started > 60:
                raise SystemExit("the cluster made no sync pass within 60 s")
            time.sleep(0.05)
        for current, following in zip(chain, chain[1:], strict=False):
            time.sleep(rng.uniform(0, 1))
            written = close_in(town, current)
            while True:
                at = (
                    Dispatch.objects.filter(bead_id=following, ok=True)
                    .values_list("created_at", flat=True)
                    .first()
                )
                if at is not None:
                    break
                if time.time() - written > 30:
                    raise SystemExit(f"{following} not dispatched within 30 s")
                time.sleep(0.005)
            lags.append(at.timestamp() - written)
            closed = (
                Event.objects.filter(bead_id=current, kind="bead.closed")
                .values_list("created_at", flat=True)
                .first()
            )
            seen.append(closed.timestamp() - written if closed else float("nan"))
    finally:
        for burner in busy:
            burner.kill()
            burner.wait()
        cluster.terminate()
        cluster.wait(60)
        log.close()
    print(
        f"close written to the source -> next dispatch, CONVOY_SYNC_INTERVAL=1, a town of "
        f"{args.filler + len(chain):,} beads, {len(lags)} closes"
        f"{f', {args.busy} CPU burners' if args.busy else ''}: p50 {median(lags):.2f} s, "
        f"p99 {percentile(lags, 99):.2f} s (goal < 1.5 s), max {max(lags):.2f} s"
    )
    # The lag in two: the close written -> the pass that saw it wrote its bead.closed event,
    # and that event -> the next bead's dispatch.
    then = [lag - s for lag, s in zip(lags, seen, strict=True)]
    print(
        f"  of which close -> seen by a pass: p50 {median(seen):.2f} s, p99 "
        f"{percentile(seen, 99):.2f} s | seen -> dispatched: p50 {median(then):.2f} s, "
        f"p99 {percentile(then, 99):.2f} s"
    )
    if args.verbose:
        print("  lags (close->seen+seen->dispatched):")
        print("  " + " ".join(f"{s:.2f}+{t:.2f}" for s, t in zip(seen, then, strict=True)))
        passes = [
            float(m[1])
            for m in re.finditer(r"seconds=([0-9.]+)", (folder / "cluster.log").read_text())
        ]
        if passes:
            print(
                f"  the cluster's {len(passes)} passes: p50 {median(passes):.3f} s, p99 "
                f"{percentile(passes, 99):.3f} s, max {max(passes):.3f} s"
            )
        print(f"  the cluster's log: {folder / 'cluster.log'}")


def _aware(seconds: float) -> datetime:
    """A Unix time as an aware datetime (UTC)."""
    return datetime.fromtimestamp(seconds, UTC)


PARTS = {
    "times": part_times,
    "memory": part_memory,
    "memory-create": part_memory_create,
    "memory-passes": part_memory_passes,
    "lag": part_lag,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--beads", type=int, default=100_000)
    parser.add_argument("--changed", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--scale", type=int, default=5)
    parser.add_argument("--closes", type=int, default=60)
    parser.add_argument("--filler", type=int, default=1000)
    parser.add_argument("--parts", default="times,memory,lag")
    parser.add_argument("--verbose", action="store_true", help="each lag, in two parts")
    parser.add_argument("--busy", type=int, default=0, help="CPU-burning processes (lag)")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # one part, in this process
    args = parser.parse_args()
    if args.part:
        folder = Path(os.environ.get("BENCH_SYNC_FOLDER") or tempfile.mkdtemp())
        PARTS[args.part](args, folder)
        return
    argv = []
    for name in ("beads", "changed", "runs", "scale", "closes", "filler", "busy"):
        argv += [f"--{name}", str(getattr(args, name))]
    argv += ["--verbose"] if args.verbose else []
    for part in args.parts.split(","):
        folder = tempfile.mkdtemp(prefix=f"convoyweb-sync-{part}-")
        env = {**os.environ, "BENCH_SYNC_FOLDER": folder}
        subprocess.run([sys.executable, __file__, *argv, "--part", part], env=env, check=True)
        if not args.verbose:  # kept to be read (the cluster's log)
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
