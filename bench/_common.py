"""Shared helpers for the benchmark scripts: a throw-away database and simple statistics."""

import os
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
