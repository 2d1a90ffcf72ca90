"""Shared helpers for the benchmark scripts: a throw-away database and simple statistics."""

import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup(database_url=None):
    """Point Django at a fresh database (a temp SQLite file unless BENCH_DATABASE_URL is set)."""
    url = database_url or os.environ.get("BENCH_DATABASE_URL")
    if not url:
        folder = tempfile.mkdtemp(prefix="convoyweb-bench-")
        url = f"sqlite:///{folder}/bench.sqlite3"
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "convoyweb.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return url


def reset():
    from convoys.models import Bead, Convoy, Dispatch, Event, Lease, Route, TrackedBead

    for model in (TrackedBead, Convoy, Bead, Event, Dispatch, Lease, Route):
        model.objects.all().delete()


def timed(fn, *args, **kwargs):
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - started, result


def median(values):
    return statistics.median(values)


def percentile(values, pct):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


STATUSES = ["open", "closed", "closed", "hooked", "in_progress"]


def generated_epic(prefix, count, rng, now, chain_back=3):
    """Bulk-insert `count` beads <prefix>00000… of mixed statuses, each blocked by up to
    `chain_back` earlier beads 7, 14, 21 back (about half of them): the pages' and the browser
    bench's epics. Returns their ids."""
    from convoys.infra import bulk
    from convoys.models import Bead, Dependency

    beads, deps = [], []
    for i in range(count):
        bead_id = f"{prefix}{i:05d}"
        status = rng.choice(STATUSES)
        beads.append(
            {
                "id": bead_id,
                "title": f"Bead {i}",
                "status": status,
                "issue_type": "task",
                "priority": 2,
                "created_at": now,
                "updated_at": now,
                "closed_at": now if status == "closed" else None,
                "rig_id": "gastown",
                "assignee": "gastown/polecats/nux" if status in ("hooked", "in_progress") else "",
            }
        )
        for back in range(1, chain_back + 1):
            if i - back * 7 >= 0 and rng.random() < 0.5:
                deps.append(
                    {
                        "issue_id": bead_id,
                        "depends_on_id": f"{prefix}{i - back * 7:05d}",
                        "type": "blocks",
                    }
                )
    bulk.insert(Bead, beads)
    bulk.insert(Dependency, deps)
    return [b["id"] for b in beads]


def tracking_convoy(convoy_id, title, ids, now):
    """An open convoy tracking `ids` in order (bulk-inserted)."""
    from convoys.infra import bulk
    from convoys.models import Convoy, TrackedBead

    Convoy.objects.create(id=convoy_id, title=title, status="open", created_at=now, updated_at=now)
    bulk.insert(
        TrackedBead,
        [{"convoy_id": convoy_id, "bead_id": b, "position": i} for i, b in enumerate(ids)],
    )


def generated_convoys(prefix, sizes, seed):
    """For each size, a convoy `hq-cv-<prefix><size>` tracking a generated epic of that many
    beads; returns {size: the epic's bead ids}. The read model is not rebuilt here."""
    from django.utils import timezone

    from convoys.services import rigs

    rigs.upsert_route("gt-", "gastown")
    rng = random.Random(seed)
    now = timezone.now()
    made = {}
    for size in sizes:
        made[size] = generated_epic(f"gt-{prefix}{size}x", size, rng, now)
        tracking_convoy(f"hq-cv-{prefix}{size}", f"{size} beads", made[size], now)
    return made


def superuser_client():
    """A test client logged in as a new superuser `bench`."""
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_superuser("bench", "bench@localhost", "pw-pw-pw-123"))
    return client
