"""kill -9 of the process that launches a convoy, mid-launch, and of the task cluster mid-feed:
afterwards every bead ends
dispatched exactly once or ready (docs/dispatch.md). Runs on SQLite and, with DATABASE_URL
set, on PostgreSQL."""

import signal
import sys

import pytest
from django.db.models import Count

from convoys.models import Bead, Dispatch
from convoys.services import beads, convoys, staging

from .factories import bead, blocks
from .test_processes import _real_cluster, python, start_cluster, stop, wait_for  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def recording_dispatch(tmp_path):
    """A dispatch command that notes `bead worker` as it starts, then takes a while."""
    ran = tmp_path / "ran.txt"
    script = tmp_path / "slow.py"
    script.write_text(
        "import sys, time\n"
        f"with open({str(ran)!r}, 'a') as f: f.write(sys.argv[1] + ' ' + sys.argv[2] + '\\n')\n"
        "time.sleep(0.3)\n"
    )
    env = {
        "CONVOY_DISPATCHER": "command",
        "CONVOY_DISPATCH_COMMAND": f"{sys.executable} {script} {{bead}} {{worker}}",
        "CONVOY_DISPATCH_TIMEOUT": "1",
        "CONVOY_RETRY_COOLDOWN": "0",
    }
    return ran, env


def ran_lines(ran):
    return ran.read_text().split("\n")[:-1] if ran.exists() else []


def workers_report(ran):
    """Workers whose command really ran report in, as a real worker would."""
    for line in ran_lines(ran):
        bead_id, worker = line.split(" ")
        if Bead.objects.filter(pk=bead_id, assignee=worker).exists():
            beads.heartbeat(worker)


def test_kill_9_mid_launch_ends_each_bead_dispatched_once_or_ready(routes, tmp_path):
    ran, env = recording_dispatch(tmp_path)
    ids = [bead(f"gt-c{i:02d}").id for i in range(12)]
    plan = staging.stage(ids, actor="test")
    launcher = python(
        f"""
        from convoys.services.launch import launch_staged
        launch_staged({plan.convoy_id!r}, force=True)
        """,
        **env,
    )
    try:
        assert wait_for(lambda: len(ran_lines(ran)) >= 3, timeout=20)
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    settle_and_check(ids, ran, env)


def settle_and_check(ids, ran, env):
    """A fresh cluster settles what the killed process left: each bead's command ran once."""
    assert Dispatch.objects.filter(ok__isnull=True).exists()  # it died with claims in flight
    workers_report(ran)
    cluster = start_cluster(**env)
    try:

        def settled():
            workers_report(ran)
            hooked = Bead.objects.filter(pk__in=ids, status="hooked").count()
            return hooked == len(ids) and not Dispatch.objects.filter(ok__isnull=True).exists()

        done = wait_for(settled, timeout=40, step=0.3)
    finally:
        stop(cluster)
    assert done, (ran_lines(ran), list(Dispatch.objects.values_list("bead_id", "ok", "error")))
    runs = [line.split(" ")[0] for line in ran_lines(ran)]
    assert sorted(runs) == sorted(set(runs))  # no bead's command ran twice
    started = Dispatch.objects.filter(ok=True).values("bead_id").annotate(n=Count("id"))
    assert {row["n"] for row in started} == {1}
    assert {row["bead_id"] for row in started} == set(ids)


def test_kill_9_of_the_cluster_mid_feed_ends_each_bead_dispatched_once(routes, tmp_path):
    ran, env = recording_dispatch(tmp_path)
    bead("gt-root")
    ids = [bead(f"gt-f{i:02d}").id for i in range(12)]
    for bead_id in ids:
        blocks("gt-root", bead_id)
    convoys.create("Feed", ["gt-root", *ids], max_in_flight=12)
    Bead.objects.filter(pk="gt-root").update(status="closed")
    first = start_cluster(**env, CONVOY_WORKERS="1")
    beads.update_bead("gt-root", status="open")
    beads.close_bead("gt-root")
    try:
        assert wait_for(lambda: len(ran_lines(ran)) >= 3, timeout=30)
    finally:
        stop(first, signal.SIGKILL, group=True)
    settle_and_check(ids, ran, env)
