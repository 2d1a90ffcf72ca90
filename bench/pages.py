"""Page cost: server time and query count for the dashboard (200 convoys / 20,000 beads) and
for convoy pages of 1,000 and 5,000 beads and a bead page with 140,000 dependencies, median of several runs, plus the DAG SVG size.
The first convoy-page view computes the layout; later views reuse it (status-only changes
never re-layout), so both are shown.

Then, side by side in the same run, what a live update costs against a full render: one bead
of a convoy changes after the page was drawn and the page asks for its fragments (X-Live,
X-Live-Since: the seq it shows); every fragment of the page (no X-Live-Since) for reference;
measured in alternating rounds. Goal: a live update costs at most a fifth of the full render
(one that reads every bead: a first view or a hard reload); a reload that carries the kept
snapshot is printed beside.

    .venv/bin/python bench/pages.py [--runs 5] [--live-only]
    .venv/bin/python bench/pages.py --profile dashboard|convoy|convoy-live|dashboard-live

`--profile` builds the same data and prints cProfile's top functions for one page (or its
live update) instead of timing everything.
"""

import argparse
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import generated_epic, median, setup, timed, tracking_convoy  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--profile", choices=["dashboard", "dashboard-live", "convoy", "convoy-live"]
    )
    parser.add_argument("--live-only", action="store_true", help="only live update vs full")
    args = parser.parse_args()
    setup()
    from django.core.cache import cache
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client, hub = build()

    def measure(url, cold=False, headers=None):
        times, queries, size = [], 0, 0
        for _ in range(args.runs):
            if cold:
                cache.clear()
            with CaptureQueriesContext(connection) as ctx:
                elapsed, response = timed(client.get, url, headers=headers or {})
            assert response.status_code == 200, (url, response.status_code)
            times.append(elapsed)
            queries = len(ctx.captured_queries)
            content = response.content.decode()
            if '<svg class="dag"' in content:
                size = content.index("</svg>", content.index('<svg class="dag"')) - content.index(
                    '<svg class="dag"'
                )
        return median(times), queries, size

    if args.profile:
        profile(client, args.profile)
        return
    if args.live_only:
        live_vs_full(client, args.runs)
        return
    print(f"{'page':<44} {'median':>8} {'queries':>8} {'svg KB':>7}")
    rows = [
        ("dashboard, 200 convoys / 20,000 beads", "/", False),
        ("convoy page, 1,000 beads (first view)", "/convoys/hq-cv-p1000/", True),
        ("convoy page, 1,000 beads (layout cached)", "/convoys/hq-cv-p1000/", False),
        ("convoy page, 5,000 beads (first view)", "/convoys/hq-cv-p5000/", True),
        ("convoy page, 5,000 beads (layout cached)", "/convoys/hq-cv-p5000/", False),
        ("convoy page, 5,000 beads, all waves", "/convoys/hq-cv-p5000/?expand=1", False),
        ("bead page, 140,000 dependencies", f"/beads/{hub}/", False),
        ("bead page, 140,000 dependencies, last page", f"/beads/{hub}/?deps=700", False),
    ]
    results = {}
    for label, url, cold in rows:
        t, q, s = measure(url, cold)
        results[label] = t
        print(f"{label:<44} {t * 1000:>6.0f}ms {q:>8} {s / 1024:>6.0f}")
    print(
        f"5,000 / 1,000 beads time ratio (cached): "
        f"{results[rows[4][0]] / results[rows[2][0]]:.1f}x; target: every page under 300 ms"
    )
    live_vs_full(client, args.runs)


def build():
    """The pages' data (200 convoys of 100 beads, convoys of 1,000 and 5,000 beads, a bead
    with 140,000 dependencies) and a logged-in superuser's test client: (client, hub id)."""
    from django.contrib.auth.models import User
    from django.test import Client
    from django.utils import timezone

    from convoys.infra import bulk
    from convoys.models import Dependency
    from convoys.read import projection
    from convoys.services import rigs

    rigs.upsert_route("gt-", "gastown")
    rng = random.Random(5)
    now = timezone.now()

    def make(prefix, count, chain_back=3):
        return generated_epic(prefix, count, rng, now, chain_back)

    def convoy(cid, ids):
        tracking_convoy(cid, f"Convoy {cid}", ids, now)

    for c in range(200):
        convoy(f"hq-cv-d{c:04d}", make(f"gt-d{c:03d}x", 100))
    convoy("hq-cv-p1000", make("gt-p1k", 1000))
    convoy("hq-cv-p5000", make("gt-p5k", 5000))
    # One bead with 140,000 dependencies (once a 13 MB page drawn in 7.6 s).
    hub = make("gt-hub", 1, chain_back=0)[0]
    bulk.insert(
        Dependency,
        [
            {"issue_id": hub, "depends_on_id": f"gt-far{i:06d}", "type": "blocks"}
            for i in range(140_000)
        ],
    )
    projection.rebuild()  # the rows went in by bulk insert, past the log: derive the read model
    user = User.objects.create_superuser("bench", "bench@localhost", "pw-pw-pw-123")
    client = Client()
    client.force_login(user)
    return client, hub


def profile(client, which):
    """cProfile of one request (after a warm-up), top functions by cumulative and own time."""
    import cProfile
    import pstats

    from convoys.log.events import last_seq
    from convoys.models import Bead, TrackedBead
    from convoys.services import beads

    url, convoy_id = {
        "dashboard": ("/", "hq-cv-d0100"),
        "convoy": ("/convoys/hq-cv-p1000/", "hq-cv-p1000"),
    }[which.removesuffix("-live")]
    headers = {}
    if which.endswith("-live"):
        page = client.get(url).content.decode()
        seq = last_seq()
        tracked = TrackedBead.objects.filter(convoy_id=convoy_id).values("bead_id")
        changed = Bead.objects.filter(pk__in=tracked, status="open").order_by("id").first()
        beads.update_bead(changed.pk, status="in_progress", assignee="bench", actor="bench")
        headers = {"X-Live": "1", "X-Live-Since": str(seq)}
        layout = re.search(r'data-layout="([0-9a-f]+)"', page)
        if layout:
            headers["X-Live-Layout"] = layout.group(1)
    client.get(url, headers=headers)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(3):
        client.get(url, headers=headers)
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(25)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        client.get(url, headers=headers)
    print("queries of one request, slowest first (ms):")
    for query in sorted(ctx.captured_queries, key=lambda q: -float(q["time"])):
        print(f"{float(query['time']) * 1000:8.1f}  {query['sql'][:230]}")


WARM = 3  # rounds of live_vs_full not counted


def live_vs_full(client, runs):
    """A live update against a full render of the same page, in rounds: draw the page (the
    full render reading every bead, as a first view or a hard reload does: timed), change one
    open bead of the convoy (a new one each round), ask for what changed since the page's seq
    (the live update, timed), for every fragment (no X-Live-Since), and reload the page. Medians over the
    rounds: they are measured alternately, so the machine's noise falls on all of them alike;
    the first WARM rounds are not counted."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from convoys.log.events import last_seq
    from convoys.models import Bead, TrackedBead
    from convoys.services import beads

    def timed_get(url, headers=None):
        with CaptureQueriesContext(connection) as ctx:
            elapsed, response = timed(client.get, url, headers=headers or {})
        assert response.status_code == 200, (url, response.status_code)
        return elapsed, len(ctx.captured_queries), response

    print()
    print(f"{'live update vs full render':<44} {'median':>8} {'queries':>8} {'ratio':>7}")
    for label, url, convoy_id in [
        ("dashboard, 200 convoys / 20,000 beads", "/", "hq-cv-d0100"),
        ("convoy page, 1,000 beads", "/convoys/hq-cv-p1000/", "hq-cv-p1000"),
    ]:
        tracked = TrackedBead.objects.filter(convoy_id=convoy_id).values("bead_id")
        open_beads = list(
            Bead.objects.filter(pk__in=tracked, status="open")
            .order_by("id")
            .values_list("pk", flat=True)
        )
        full, live, every, kept = [], [], [], []
        # The first rounds are not counted: a process compiles each query shape once
        # (convoys/compiled.py: per number of ids) and lays out each graph once.
        for round_ in range(max(runs, 5) + WARM):
            if round_ == WARM:
                full, live, every, kept = [], [], [], []
            seq = last_seq()
            full.append(timed_get(url, {"Cache-Control": "no-cache"}))  # reads every bead
            page = full[-1][2].content.decode()
            layout = re.search(r'data-layout="([0-9a-f]+)"', page)
            beads.update_bead(
                open_beads[round_], status="in_progress", assignee="bench", actor="bench"
            )
            headers = {"X-Live": "1", "X-Live-Since": str(seq)}
            if layout:
                headers["X-Live-Layout"] = layout.group(1)
            live.append(timed_get(url, headers))
            every.append(timed_get(url, {"X-Live": "1"}))
            kept.append(timed_get(url))
        full_t, live_t, all_t, kept_t = (
            median([r[0] for r in rows]) for rows in (full, live, every, kept)
        )
        answer = live[-1][2].json()["fragments"]
        print(f"{label + ': full render':<44} {full_t * 1000:>6.1f}ms {full[-1][1]:>8}")
        print(
            f"{'  live update, ' + str(len(answer)) + ' fragments':<44} "
            f"{live_t * 1000:>6.1f}ms {live[-1][1]:>8} {full_t / live_t:>6.1f}x"
        )
        print(
            f"{'  every fragment (no X-Live-Since)':<44} "
            f"{all_t * 1000:>6.1f}ms {every[-1][1]:>8} {full_t / all_t:>6.1f}x"
        )
        print(
            f"{'  reload (the kept snapshot carried)':<44} "
            f"{kept_t * 1000:>6.1f}ms {kept[-1][1]:>8} {full_t / kept_t:>6.1f}x"
            f"   (live update {kept_t / live_t:.1f}x cheaper)"
        )
    print(
        "goal: a live update costs at most 1/5 of the full render (ratio >= 5x); the full "
        "render reads every bead (first view, hard reload)"
    )


if __name__ == "__main__":
    main()
