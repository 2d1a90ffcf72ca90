"""The demo as `./run.sh` runs it (a web process, a task cluster, the swarm of simulated
workers), its dashboard sampled for three minutes: a convoy whose work moves is never called
stranded. Its ready work is fed at once (every bead a close made ready) and pages wait one
feed interval before calling ready work stranded."""

import io
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from django.core.management import call_command

from convoys.models import Event

from .support.pages import dashboard_badges
from .support.paths import ROOT
from .support.processes import child_env, free_port, log_file, spawn, wait_port
from .support.users import signed_in

SAMPLE_SECONDS = float(os.environ.get("CONVOY_TEST_SAMPLE_SECONDS", 180))
EVERY = 2.0


def _swarm(env, port):
    out = log_file("swarm")
    argv = [sys.executable, str(ROOT / "manage.py"), "swarm", "--url", f"http://127.0.0.1:{port}"]
    argv += ["--min-work", "1", "--max-work", "4"]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    out.close()
    proc.log_path = out.name
    return proc


def assert_no_debug_pages(port):
    """Static files are served and an unknown page is the product's 404, not Django's."""
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(base + "/static/convoys/app.css", timeout=10) as answer:
        assert answer.status == 200 and b".cause" in answer.read()
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(base + "/no-such-page/", timeout=10)
    body = missing.value.read().decode()
    assert missing.value.code == 404
    assert "DEBUG = True" not in body and "DATABASE_URL" not in body and "Traceback" not in body


@pytest.mark.slow
def test_the_demo_dashboard_never_calls_a_moving_convoy_stranded(transactional_db):
    call_command("demo", stdout=io.StringIO())
    port = free_port()
    # The run.sh defaults: no debug pages, a 5 s feed interval, a 30 s scan.
    env = child_env(DEBUG="0")
    procs = [spawn("web", env, port), spawn("cluster", env)]
    try:
        wait_port(port)
        assert_no_debug_pages(port)
        procs.append(_swarm(env, port))
        client = signed_in("manager", "view_convoy", "view_bead")
        closes_before = Event.objects.filter(kind="bead.closed").count()
        flagged, samples = [], 0
        ends = time.monotonic() + SAMPLE_SECONDS
        while time.monotonic() < ends:
            badges = dashboard_badges(client)
            samples += 1
            flagged += [(samples, cid) for cid, words in badges.items() if words == "stranded"]
            time.sleep(EVERY)
        closes = Event.objects.filter(kind="bead.closed").count() - closes_before
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert samples >= SAMPLE_SECONDS / (EVERY * 2)
    assert closes >= 10, "the swarm closed too little work for the samples to mean anything"
    assert flagged == [], f"{len(flagged)} of {samples} samples called a convoy stranded"
