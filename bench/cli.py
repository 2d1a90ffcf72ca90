"""What one command-line call costs: agents run `beads close`, `beads heartbeat`, `sling` and
the rest as a new process each time, so start-up is most of what they wait for.

Prints, side by side in one run, bare Python, `django.setup()` and each command agents call
most (median wall time of --runs calls), then the heaviest imports of one call
(`python -X importtime`). With --compare PATH the same calls run against a second checkout
(its own .venv when it has one) on a copy of the same database, alternating, with the ratio.

    python bench/cli.py [--runs 10] [--compare ../other-checkout]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUP = "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'convoyweb.settings'); django.setup()"


def python_of(tree: Path) -> str:
    venv = tree / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def calls(n: int) -> list[tuple[str, list[str]]]:
    """(label, arguments after `python`); `n` makes each close and sling name a fresh bead."""
    return [
        ("bare python", ["-c", "pass"]),
        ("django.setup()", ["-c", SETUP]),
        ("beads show", ["manage.py", "beads", "show", "cli-a"]),
        ("beads ready", ["manage.py", "beads", "ready", "--limit", "20"]),
        ("beads update", ["manage.py", "beads", "update", "cli-a", "--priority", str(n % 4)]),
        ("beads heartbeat", ["manage.py", "beads", "heartbeat", "cli/worker"]),
        ("beads close", ["manage.py", "beads", "close", f"cli-c{n}", "--reason", "bench"]),
        ("sling", ["manage.py", "sling", f"cli-s{n}", "cli", "--no-convoy"]),
        ("convoy status", ["manage.py", "convoy", "status"]),
    ]


def run(tree: Path, args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [python_of(tree), *args], cwd=tree, env=env, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{' '.join(args)} failed in {tree}: {done.stderr.strip()[-300:]}")
    return elapsed


def prepare(tree: Path, env: dict[str, str], runs: int) -> None:
    """A database with a rig, a convoy of a few beads, and one bead per close and sling."""
    manage = [python_of(tree), "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], cwd=tree, env=env, check=True)
    subprocess.run([*manage, "rigs", "route", "cli-", "cli"], cwd=tree, env=env, check=True)
    ids = ["cli-a", *(f"cli-c{n}" for n in range(runs)), *(f"cli-s{n}" for n in range(runs))]
    for bead in ids:
        subprocess.run(
            [*manage, "beads", "create", f"bench {bead}", "--id", bead],
            cwd=tree,
            env=env,
            check=True,
            capture_output=True,
        )
    subprocess.run(
        [*manage, "convoy", "create", "cli bench", "cli-a", "cli-c0"],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
    )


def heaviest_imports(tree: Path, env: dict[str, str], top: int = 10) -> list[tuple[float, str]]:
    done = subprocess.run(
        [python_of(tree), "-X", "importtime", "manage.py", "beads", "show", "cli-a"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    found: dict[str, float] = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if cumulative.strip().isdigit() and name.startswith(" ") and not name.startswith("  "):
            found[name.strip()] = int(cumulative) / 1000
    return sorted(((ms, name) for name, ms in found.items()), reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--compare", type=Path, help="a second checkout, timed alternately")
    options = parser.parse_args()
    trees = [ROOT] + ([options.compare.resolve()] if options.compare else [])
    folder = Path(tempfile.mkdtemp(prefix="convoyweb-bench-cli-"))
    envs = []
    try:
        for index, tree in enumerate(trees):
            env = {
                **os.environ,
                "DATABASE_URL": f"sqlite:///{folder}/cli{index}.sqlite3",
                "DJANGO_SETTINGS_MODULE": "convoyweb.settings",
                "CONVOY_DISPATCH_COMMAND": "",
            }
            # As on a user's machine: Python caches each module's bytecode after the first call.
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            prepare(tree, env, options.runs)
            envs.append(env)
        times: dict[tuple[int, str], list[float]] = {}
        for n in range(options.runs):
            for label, args in calls(n):
                for index, tree in enumerate(trees):
                    times.setdefault((index, label), []).append(run(tree, args, envs[index]))
        heads = ["this tree"] + (["compared", "ratio"] if options.compare else [])
        print(f"median wall time of {options.runs} calls each, SQLite, milliseconds")
        print(f"{'call':<18}" + "".join(f"{h:>12}" for h in heads))
        for label, _ in calls(0):
            ours = statistics.median(times[(0, label)]) * 1000
            row = f"{label:<18}{ours:>12.0f}"
            if options.compare:
                theirs = statistics.median(times[(1, label)]) * 1000
                row += f"{theirs:>12.0f}{theirs / ours:>11.2f}x"
            print(row)
        for index, tree in enumerate(trees):
            print(
                f"\nheaviest imports of `beads show` in {tree} (cumulative ms, python -X importtime)"
            )
            for ms, name in heaviest_imports(tree, envs[index]):
                print(f"  {ms:8.1f}  {name}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
