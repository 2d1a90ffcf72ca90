"""Town capacity under faults, with real task clusters on one database:
two clusters, launches and container slings racing never put more beads in flight than the
cap, and kill -9 of a cluster mid-dispatch leaks no slot."""

import signal
import sys

import pytest

from convoys.models import Bead, Convoy, Dispatch
from convoys.rules import capacity
from convoys.services import beads as bead_service
from convoys.services import controls, convoys, staging

from .support.factories import bead, most_in_flight
from .support.processes import python, start_cluster, stop, survivors
from .support.waiting import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("real_cluster"),
]

CAP = 3


# Each child launches its convoy, then slings it (container expansion) until it lands.
LAUNCH_THEN_SLING = """
    import io, time
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from convoys.models import Convoy
    call_command("convoy", "launch", "{cid}", "--force", stdout=io.StringIO())
    deadline = time.monotonic() + 200
    while Convoy.objects.get(pk="{cid}").status != "closed" and time.monotonic() < deadline:
        try:
            call_command("sling", "{cid}", "--json", stdout=io.StringIO())
        except CommandError:
            pass  # nothing ready to sling right now
        time.sleep(0.05)
"""


def test_two_clusters_launches_and_slings_never_exceed_the_cap(routes):
    controls.set_cap(CAP, actor="test")  # a run-time override: every process reads it
    plans = [
        staging.stage([bead(f"gt-{lane}{i:02d}").id for i in range(10)], actor="test")
        for lane in "abc"
    ]
    clusters = [start_cluster(), start_cluster()]
    children = [python(LAUNCH_THEN_SLING.replace("{cid}", p.convoy_id)) for p in plans]
    closed = set()
    try:

        def close_hooked():
            assert capacity.in_flight() <= CAP
            for bead_id in Bead.objects.filter(status="hooked").values_list("id", flat=True):
                if bead_id not in closed:
                    bead_service.close_bead(bead_id)
                    closed.add(bead_id)
            return len(closed) == 30

        done = wait_for(close_hooked, timeout=240, step=0.05)
        outputs = [child.communicate(timeout=240) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        for cluster in clusters:
            stop(cluster)
    assert done, f"closed {len(closed)}/30"
    assert all(child.returncode == 0 for child in children), [o[1][-2000:] for o in outputs]
    assert set(Convoy.objects.values_list("status", flat=True)) == {"closed"}
    assert most_in_flight() == CAP  # reached, never passed
    paths = set(Dispatch.objects.values_list("path", flat=True))
    assert "launch" in paths and paths - {"launch"}, paths  # slings or close feeders too


def test_kill_9_mid_dispatch_with_a_cap_leaks_no_slot(routes, tmp_path):
    """A cap of 1: a leaked slot would stop the town for good. The killed cluster's claim
    holds the slot until its worker is found dead; then the second cluster rescues the bead
    and every bead is dispatched, worked and closed."""
    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(1.5)\n")
    env = {
        "CONVOY_MAX_IN_FLIGHT": "1",
        "CONVOY_DISPATCHER": "command",
        "CONVOY_DISPATCH_COMMAND": f"{sys.executable} {script} {{bead}}",
        "CONVOY_WORKER_TIMEOUT": "3",
        "CONVOY_DISPATCH_TIMEOUT": "5",
    }
    ids = [bead(f"gt-k{i}").id for i in range(4)]
    convoy = convoys.create("Kill", ids)
    first = start_cluster(**env)  # its stranded scan feeds the convoy
    assert wait_for(lambda: Dispatch.objects.filter(ok__isnull=True).exists(), timeout=30)
    stop(first, signal.SIGKILL, group=True)
    assert wait_for(lambda: not survivors(first), timeout=10), survivors(first)
    killed = Dispatch.objects.get()
    assert killed.ok is None  # killed mid-dispatch: the claim committed, the run never ended
    assert capacity.in_flight() == 1  # the slot stays taken while its worker may be alive
    second = start_cluster(**env)
    try:

        def progress():
            # a worker that really got its bead reports in and finishes it
            for attempt in Dispatch.objects.filter(ok=True):
                work = Bead.objects.get(pk=attempt.bead_id)
                if work.status == "hooked" and work.assignee == attempt.worker:
                    bead_service.heartbeat(attempt.worker)
                    bead_service.close_bead(attempt.bead_id)
            return Convoy.objects.get(pk=convoy.pk).status == "closed"

        landed = wait_for(progress, timeout=90, step=0.2)
    finally:
        stop(second)
    assert landed, list(Bead.objects.values_list("id", "status", "assignee"))
    assert Dispatch.objects.filter(bead_id=killed.bead_id, ok=True).count() == 1  # rescued
    assert Dispatch.objects.filter(ok=True).count() == len(ids)
    assert capacity.in_flight() == 0
