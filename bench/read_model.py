"""The read model kept with the event log, against deriving the same facts on every read.

Read side: the dashboard's summaries of 200 convoys / 20,000 beads read from the kept rows
(`summaries.convoy_summaries`) against the same facts derived from the rows alone (what a
page did before: the readiness rule, failed marks, cooldowns and blockers over every tracked
bead), and the dashboard page over HTTP.
Write side: what keeping it costs a close and the dispatches it feeds, in convoys of 1,000
and 20,000 beads, with the projection kept and with it switched off (`events.KEEPERS`
emptied), in alternating rounds.

    .venv/bin/python bench/read_model.py [--runs 7]
"""

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import generated_epic, median, setup, timed, tracking_convoy  # noqa: E402


def build():
    from django.utils import timezone

    from convoys.read import projection
    from convoys.services import rigs

    rigs.upsert_route("gt-", "gastown")
    rng = random.Random(7)
    now = timezone.now()
    for c in range(200):
        ids = generated_epic(f"gt-d{c:03d}x", 100, rng, now)
        tracking_convoy(f"hq-cv-d{c:04d}", f"Convoy {c}", ids, now)
    for size in (1000, 20000):
        ids = generated_epic(f"gt-w{size}x", size, rng, now)
        tracking_convoy(f"hq-cv-w{size}", f"{size} beads", ids, now)
    projection.rebuild()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    setup()
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from convoys.log import events
    from convoys.models import Bead, Convoy, TrackedBead
    from convoys.read import projection, summaries
    from convoys.rules.readiness import blocked_by
    from convoys.services import beads, feeding

    started, _ = timed(build)
    print(f"built 200 convoys / 20,000 beads and convoys of 1,000 and 20,000 in {started:.1f} s")
    dashboard = list(Convoy.objects.filter(pk__startswith="hq-cv-d"))
    ids = [c.pk for c in dashboard]

    def derived():  # the same rules over the tracked beads as sets, the way pages read before
        now = timezone.now()
        tracked = TrackedBead.objects.filter(convoy_id__in=ids).values("bead_id")
        projection._derive(Bead.objects.filter(pk__in=tracked), None, now)
        return projection.derive_convoys(ids, now)

    kept, fresh, kept_q, fresh_q = [], [], 0, 0
    for _ in range(args.runs):
        with CaptureQueriesContext(connection) as ctx:
            kept.append(timed(summaries.convoy_summaries, dashboard)[0])
        kept_q = len(ctx.captured_queries)
        with CaptureQueriesContext(connection) as ctx:
            fresh.append(timed(derived)[0])
        fresh_q = len(ctx.captured_queries)
    print("\nread: summaries of 200 convoys / 20,000 beads (median of %d)" % args.runs)
    print(f"  kept read model     {median(kept) * 1000:8.1f} ms  {kept_q:3d} queries")
    print(f"  derived from rows   {median(fresh) * 1000:8.1f} ms  {fresh_q:3d} queries")
    print(f"  ratio               {median(fresh) / median(kept):8.1f}x")

    user = User.objects.create_superuser("bench", "bench@localhost", "pw-pw-pw-123")
    client = Client()
    client.force_login(user)
    pages = [timed(client.get, "/")[0] for _ in range(args.runs)]
    print(f"  dashboard page (HTTP, full render) {median(pages) * 1000:.1f} ms")

    print(
        "\nwrite: a close and the dispatches it feeds (median of %d; kept / not kept)" % args.runs
    )
    keepers = list(events.KEEPERS)
    for size in (1000, 20000):
        convoy = Convoy.objects.get(pk=f"hq-cv-w{size}")
        tracked = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
        open_ = list(
            Bead.objects.filter(pk__in=tracked, status__in=("hooked", "in_progress"))
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        blocked = blocked_by(open_)  # a close of work still blocked is refused
        open_ = [b for b in open_ if b not in blocked]
        on, off = [], []
        for round_ in range(args.runs * 2):
            keeping = round_ % 2 == 0
            events.KEEPERS[:] = keepers if keeping else []
            bead_id = open_.pop()

            def close_and_feed(bead_id=bead_id, convoy=convoy):
                beads.close_bead(bead_id, actor="bench")
                feeding.feed_convoy(convoy, "event")

            (on if keeping else off).append(timed(close_and_feed)[0])
        events.KEEPERS[:] = keepers
        ratio = median(on) / median(off)
        print(
            f"  {size:6,d} beads: kept {median(on) * 1000:7.1f} ms   "
            f"not kept {median(off) * 1000:7.1f} ms   ratio {ratio:.2f}x"
        )
    projection.rebuild()  # the rounds without it left the model behind


if __name__ == "__main__":
    main()
