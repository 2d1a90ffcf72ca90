"""The convoy page in Chromium at 1,000, 5,000 and 20,000 beads: load-event time (navigation
start to the load event, median of several runs, sizes alternating in each round), the time
to the first byte (the server's part), DOM elements and the HTML's size. Goal:
the 20,000-bead page loads in at most 1.5x the time of the 1,000-bead page, with fewer than
10,000 DOM elements at any size (the overview above `sizes.OVERVIEW_AT` tracked beads).

The epics are shaped like bench/pages.py's (each bead blocked by those 7, 14 and 21 before it,
each with probability 1/2; statuses drawn at random). One daphne process serves a throw-away
SQLite database; Playwright drives /usr/bin/chromium with the tests' flags.

    .venv/bin/python bench/browser.py [--runs 5] [--sizes 1000,5000,20000] [--all] [--busy]

`--all` also measures `?all=1` (everything drawn, the page before the overview) for the sizes
up to 5,000. Each page is drawn once before the measured runs (its layout is then cached).
`--busy` starts one open bead of the convoy before each measured load (an event).
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, generated_convoys, median, setup, superuser_client  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMING = """() => {
  const t = performance.getEntriesByType("navigation")[0];
  return { load: t.loadEventEnd, ttfb: t.responseStart, bytes: t.decodedBodySize,
           dom: document.getElementsByTagName("*").length };
}"""


def build(sizes):
    """Convoys hq-cv-b<size> of generated epics; a superuser's session cookie."""
    from convoys.read import projection

    generated_convoys("b", sizes, seed=5)
    projection.rebuild()  # bulk-inserted past the log: derive the read model
    client = superuser_client()
    return client.cookies["sessionid"].value


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", default="1000,5000,20000")
    parser.add_argument("--all", action="store_true", help="also ?all=1 up to 5,000 beads")
    parser.add_argument(
        "--busy",
        action="store_true",
        help="before each measured load, one open bead of that convoy starts (an event)",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    url = setup()
    started = time.perf_counter()
    session = build(sizes)
    print(f"built {', '.join(map(str, sizes))} beads in {time.perf_counter() - started:.1f} s")
    port = free_port()
    env = dict(os.environ, DATABASE_URL=url, DEBUG="0", PYTHONUNBUFFERED="1")
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    log = open(Path(url.removeprefix("sqlite:///")).with_suffix(".web.log"), "w")  # noqa: SIM115
    web = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
        + ["convoyweb.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        run(port, session, sizes, args)
    finally:
        web.send_signal(signal.SIGTERM)
        try:
            web.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(web.pid, signal.SIGKILL)
            web.wait()


def run(port, session, sizes, args):
    from playwright.sync_api import sync_playwright

    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    urls = [(f"{size:,} beads", f"/convoys/hq-cv-b{size}/") for size in sizes]
    if args.all:
        urls += [
            (f"{size:,} beads ?all=1", f"/convoys/hq-cv-b{size}/?all=1")
            for size in sizes
            if size <= 5000
        ]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.add_cookies([{"name": "sessionid", "value": session, "url": base}])
        page = context.new_page()
        for _, path in urls:  # warm-up: the layout is computed and cached once per graph
            page.goto(base + path, timeout=300_000)
        found = {label: [] for label, _ in urls}
        # Playwright's sync API runs an event loop in this thread: the bench's own writes
        # are plain synchronous ORM calls all the same.
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"
        starts = {path: _open_beads(path) for _, path in urls} if args.busy else {}
        for _ in range(args.runs):
            for label, path in urls:
                if args.busy:  # the convoy moves between two loads: its page is derived again
                    _start(starts[path].pop())
                page.goto(base + path, wait_until="load", timeout=300_000)
                found[label].append(page.evaluate(TIMING))
        browser.close()
    print(f"{'page':<24} {'load':>8} {'server':>8} {'DOM':>8} {'HTML KB':>8}")
    loads = {}
    for label, _ in urls:
        rows = found[label]
        loads[label] = median(r["load"] for r in rows)
        print(
            f"{label:<24} {loads[label]:>6.0f}ms {median(r['ttfb'] for r in rows):>6.0f}ms "
            f"{max(r['dom'] for r in rows):>8,} {max(r['bytes'] for r in rows) / 1024:>8.0f}"
        )
    first = urls[0][0]
    for label, _ in urls[1 : len(sizes)]:
        print(f"{label} / {first}: load {loads[label] / loads[first]:.2f}x (goal <= 1.5x)")
    print("goal: fewer than 10,000 DOM elements at any size")


def _open_beads(path):
    from convoys.models import Bead, TrackedBead

    convoy_id = path.strip("/").split("/")[1].split("?")[0]
    tracked = TrackedBead.objects.filter(convoy_id=convoy_id).values("bead_id")
    return list(
        Bead.objects.filter(pk__in=tracked, status="open", assignee="").values_list("pk", flat=True)
    )


def _start(bead_id):
    from convoys.services import beads

    beads.update_bead(bead_id, status="in_progress", assignee="bench", actor="bench")


if __name__ == "__main__":
    main()
