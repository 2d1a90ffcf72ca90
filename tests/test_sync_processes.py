"""The whole loop with a real task cluster (issue 18 item 4): the cluster's ticker syncs the
town's bd JSONL, the town's dispatcher command works each bead by rewriting it closed there,
and a launched convoy lands with no manual step; a cluster killed mid-run and restarted loses
nothing and dispatches nothing twice."""

import signal
import sys

import pytest
from django.db.models import Count

from convoys.models import Bead, Convoy, Dispatch
from convoys.services import staging, sync
from convoys.services.launch import launch_staged

from .test_processes import _real_cluster, start_cluster, stop, wait_for  # noqa: F401
from .test_sync import FIXTURE

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def town_of(tmp_path, size):
    """A chain of `size` beads in a bd JSONL file, each blocked by the one before."""
    path = tmp_path / "town.jsonl"
    lines = []
    for i in range(size):
        deps = [{"issue_id": f"gt-w{i}", "depends_on_id": f"gt-w{i - 1}", "type": "blocks"}]
        lines.append(
            f'{{"id":"gt-w{i}","title":"Work {i}","status":"open","priority":2,'
            f'"issue_type":"task","created_at":"2026-11-30T09:00:00Z",'
            f'"dependencies":{deps if i else []}}}'.replace("'", '"')
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_launched_convoy_lands_through_the_town_across_a_cluster_kill(routes, tmp_path, settings):
    size = 6
    town = town_of(tmp_path, size)
    worker = FIXTURE.with_name("sync_worker.py")
    env = {
        "CONVOY_SYNC_SOURCES": str(town),
        "CONVOY_SYNC_INTERVAL": "0.5",
        "CONVOY_DISPATCHER": "command",
        "CONVOY_DISPATCH_COMMAND": f"{sys.executable} {worker} {town} {{bead}}",
    }
    settings.CONVOY_DISPATCHER = env["CONVOY_DISPATCHER"]  # the launch dispatches from here
    settings.CONVOY_DISPATCH_COMMAND = env["CONVOY_DISPATCH_COMMAND"]
    sync.sync(sync.FileSource(town))
    ids = [f"gt-w{i}" for i in range(size)]
    plan = staging.stage(ids, actor="test")
    launch_staged(plan.convoy_id, force=True)

    def closed():
        return Bead.objects.filter(pk__in=ids, status="closed").count()

    first = start_cluster(**env)
    try:
        assert wait_for(lambda: closed() >= 2, timeout=90), "the town's closes were not synced"
    finally:
        stop(first, signal.SIGKILL, group=True)
    second = start_cluster(**env)
    try:
        assert wait_for(
            lambda: Convoy.objects.get(pk=plan.convoy_id).status == "closed", timeout=120
        ), f"landed {closed()} of {size}"
    finally:
        stop(second)
    assert closed() == size
    twice = Dispatch.objects.filter(ok=True).values("bead_id").annotate(n=Count("id"))
    assert sorted((row["bead_id"], row["n"]) for row in twice) == [(i, 1) for i in ids]
