"""How long a newcomer waits: a fresh clone of this tree to the first page of `./run.sh`, and a
restart of it (the install skipped, the demo already loaded). Prints both with the goal beside.

    python bench/setup.py [--restarts 3]

The fresh run installs from the lock into a new .venv: packages already in uv's cache on this
machine are not downloaded again (a machine that never installed them pays the download too).
"""

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_page(tree: Path, port: int, log: Path) -> float:
    """Seconds from `./run.sh` to a 200 from /login/; then stops it."""
    env = {**os.environ, "PORT": str(port), "CONVOY_SWARM": "0"}
    started = time.perf_counter()
    with log.open("a") as out:
        proc = subprocess.Popen(
            ["./run.sh"],
            cwd=tree,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"./run.sh exited with {proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=1) as r:
                    if r.status == 200:
                        return time.perf_counter() - started
            except OSError:
                time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=3)
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="convoyweb-bench-setup-"))
    try:
        tree = folder / "convoyweb"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(tree)], check=True)
        log = folder / "run.log"
        port = free_port()
        fresh = first_page(tree, port, log)
        restarts = [first_page(tree, port, log) for _ in range(options.restarts)]
        print(f"{'step':<34}{'seconds':>9}{'goal':>7}")
        print(f"{'fresh clone -> first page':<34}{fresh:>9.1f}{30:>7}")
        print(f"{'restart -> first page (median)':<34}{statistics.median(restarts):>9.1f}{5:>7}")
        print(f"restarts: {', '.join(f'{t:.1f}' for t in restarts)}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
