"""A database outage (a private PostgreSQL stopped under a running daphne): the API answers
JSON 503 in its error shape and pages a short 503 page, well under the pool's 30 s; a write
changes nothing; once the database is back, requests succeed without a restart."""

import glob
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from .conftest import IN_CI, child_env, free_port, manage, spawn, wait_port

pytestmark = pytest.mark.slow
BINARIES = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))


def as_postgres(*argv):
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=60)


@pytest.fixture
def private_postgres():
    if not BINARIES:
        if IN_CI:
            pytest.fail("CI needs PostgreSQL's binaries (/usr/lib/postgresql/*/bin)")
        pytest.skip("no PostgreSQL binaries in /usr/lib/postgresql/*/bin")
    bindir = os.path.dirname(BINARIES[-1])
    root = tempfile.mkdtemp(prefix="convoy-pg-")
    os.chmod(root, 0o777)
    data, port = os.path.join(root, "data"), free_port()
    result = as_postgres(f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres")
    assert result.returncode == 0, result.stderr
    ctl = [f"{bindir}/pg_ctl", "-D", data, "-l", os.path.join(root, "log"), "-w"]
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1"

    def start():
        assert as_postgres(*ctl, "-o", opts, "start").returncode == 0

    def stop():
        assert as_postgres(*ctl, "-m", "fast", "stop").returncode == 0

    start()
    yield f"postgres://postgres@127.0.0.1:{port}/postgres", start, stop
    as_postgres(*ctl, "-m", "immediate", "stop")
    shutil.rmtree(root, ignore_errors=True)


def call(url, token=None, data=None, method="GET"):
    request = urllib.request.Request(url, data=data, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read(), response.headers, time.monotonic() - started
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers, time.monotonic() - started


SETUP = """
from django.contrib.auth.models import User
from convoys.services import beads, rigs
from convoys.services.tokens import create_token
rigs.upsert_route("gt-", "gastown/mayor/rig")
beads.create_bead("Outage", bead_id="gt-out", actor="test")
print(create_token(User.objects.create_superuser("ops", "ops@localhost", "pw"), "t"))
"""


def test_an_outage_answers_503_fast_and_recovers(private_postgres):
    url, start, stop = private_postgres
    env = child_env(DATABASE_URL=url, DATABASE_CONNECT_TIMEOUT="3", REDIS_URL="")
    env.pop("REDIS_URL")
    assert manage("migrate", "--noinput", "-v0", env=env).returncode == 0
    made = manage("shell", "-c", SETUP, env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    port = free_port()
    web = spawn("web", env, port)
    try:
        wait_port(port)
        base = f"http://127.0.0.1:{port}"
        assert call(f"{base}/api/beads/gt-out", token)[0] == 200
        stop()
        status, body, headers, took = call(f"{base}/api/beads/gt-out", token)
        assert status == 503 and took < 15, (status, body, took)
        assert "database unavailable" in json.loads(body)["detail"]
        assert headers["Content-Type"] == "application/json"
        close = call(f"{base}/api/beads/gt-out/close", token, b'{"reason": "x"}', "POST")
        assert close[0] == 503 and close[3] < 15, close[:2]
        start()
        status, body, _, _ = call(f"{base}/api/beads/gt-out", token)
        assert status == 200, body
        assert json.loads(body)["status"] == "open"  # the write during the outage: nothing
    finally:
        web.terminate()
        web.wait(timeout=30)
