"""kill -9 mid-launch (the web process) and mid-feed (the task cluster): every bead ends
dispatched exactly once or ready, and nothing waits for the worker timeout. The dispatch
command logs each bead it is run for; the test stands for the workers those runs start, which
report in (a heartbeat), as a real worker does. Both databases: CI runs this module in its
SQLite and its PostgreSQL pass."""

import json
import signal
import sys
import threading
import urllib.request
from collections import Counter

import pytest
from django.contrib.auth.models import User

from convoys.models import Bead, Convoy, Dispatch
from convoys.rules import causes
from convoys.services import beads, convoys, staging, tokens

from .support.factories import bead, blocks
from .support.processes import (
    child_env,
    free_port,
    spawn,
    start_cluster,
    stop,
    survivors,
    wait_port,
)
from .support.users import PASSWORD
from .support.waiting import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("real_cluster"),
]


def logging_dispatch(tmp_path, seconds):
    """Settings for a dispatch command that writes its bead's id to a file, then works."""
    ran = tmp_path / "ran.txt"
    script = tmp_path / "dispatch.py"
    script.write_text(
        "import sys, time\n"
        f"open({str(ran)!r}, 'a').write(sys.argv[1] + '\\n')\n"
        f"time.sleep({seconds})\n"
    )
    env = {
        "CONVOY_DISPATCHER": "command",
        "CONVOY_DISPATCH_COMMAND": f"{sys.executable} {script} {{bead}}",
        "CONVOY_DISPATCH_TIMEOUT": "2",
        "CONVOY_CLAIM_GRACE": "2",
        "CONVOY_WORKER_TIMEOUT": "600",  # the rescue of silent workers plays no part here
    }
    return env, ran


def runs(ran):
    return Counter(ran.read_text().split()) if ran.exists() else Counter()


def report_in(ran):
    """The workers whose dispatch command ran report in (once each is enough)."""
    for bead_id in runs(ran):
        worker = Bead.objects.filter(pk=bead_id).values_list("assignee", flat=True).first()
        if worker:
            beads.heartbeat(worker)


def settled(ids, ran):
    """Every bead dispatched (an attempt answered or confirmed), none left without an outcome."""
    report_in(ran)
    unanswered = Dispatch.objects.filter(ok__isnull=True, resolution="").exists()
    held = Bead.objects.filter(pk__in=ids, status="hooked").count()
    return not unanswered and held == len(ids)


def assert_exactly_once(ids, ran):
    assert runs(ran) == Counter(ids), runs(ran)  # every command ran once
    answered = Dispatch.objects.filter(bead_id__in=ids, ok=True)
    assert Counter(answered.values_list("bead_id", flat=True)) == Counter(ids)
    for attempt in Dispatch.objects.filter(bead_id__in=ids).exclude(ok=True):
        assert attempt.resolution == "abandoned", (attempt.bead_id, attempt.resolution)


def test_kill_9_of_the_web_process_mid_launch(routes, tmp_path):
    env, ran = logging_dispatch(tmp_path, 0.3)
    ids = [bead(f"gt-l{i:02d}").id for i in range(16)]
    plan = staging.stage(ids, actor="test")
    user = User.objects.create_superuser("launcher", "l@localhost", PASSWORD)
    token = tokens.create_token(user, "test")
    port = free_port()
    web = spawn("web", child_env(**env), port)
    cluster = None
    try:
        wait_port(port)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/launch",
            data=json.dumps({"ids": [plan.convoy_id], "force": True}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )

        def send():
            try:
                urllib.request.urlopen(request, timeout=30).read()
            except OSError:
                pass  # the process answering it is killed

        threading.Thread(target=send, daemon=True).start()
        assert wait_for(lambda: sum(runs(ran).values()) >= 3, timeout=30)
        web.send_signal(signal.SIGKILL)
        web.wait(timeout=10)
        killed_with = sum(runs(ran).values())
        assert killed_with < len(ids)  # the launch was cut short
        # Wave 1 was claimed as one; what never reached the dispatcher is not shown working:
        assert Bead.objects.filter(pk__in=ids, status="hooked").count() == len(ids)
        never_sent = sorted(set(ids) - set(runs(ran)))
        assert causes.for_bead(never_sent[-1])["kind"] == "unknown-outcome"
        cluster = start_cluster(**env)
        assert wait_for(lambda: settled(ids, ran), timeout=60, step=0.2)
    finally:
        for proc in (web, cluster):
            if proc is not None:
                stop(proc)
    assert_exactly_once(ids, ran)
    assert Dispatch.objects.filter(resolution="abandoned").count() >= len(ids) - killed_with - 1
    assert Convoy.objects.get(pk=plan.convoy_id).status == "open"


def test_kill_9_of_the_cluster_mid_feed(routes, tmp_path):
    env, ran = logging_dispatch(tmp_path, 0.3)
    bead("gt-root")
    ids = [bead(f"gt-f{i:02d}").id for i in range(12)]
    for bead_id in ids:
        blocks("gt-root", bead_id)
    convoy = convoys.create("Killed mid-feed", ["gt-root", *ids], max_in_flight=12)
    # No stranded scan to lean on: what the killed feed did not reach is fed by its close,
    # taken over once the task timeout has passed.
    env["CONVOY_STRANDED_INTERVAL"] = "600"
    first = start_cluster(**env, CONVOY_WORKERS="1")
    second = None
    try:
        beads.close_bead("gt-root")  # its feed dispatches the twelve, one after another
        assert wait_for(lambda: sum(runs(ran).values()) >= 3, timeout=30)
        stop(first, signal.SIGKILL, group=True)
        assert wait_for(lambda: not survivors(first), timeout=10), survivors(first)
        assert sum(runs(ran).values()) < len(ids)  # the feed was cut short
        second = start_cluster(**env)
        assert wait_for(lambda: settled(ids, ran), timeout=60, step=0.2)
    finally:
        for proc in (first, second):
            if proc is not None:
                stop(proc)
    assert_exactly_once(ids, ran)
    assert Convoy.objects.get(pk=convoy.pk).status == "open"
