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

from .support.paths import IN_CI
from .support.processes import child_env, free_port, manage, spawn, wait_port

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


def call(url, token=None, data=None, method="GET", cookie=None):
    request = urllib.request.Request(url, data=data, method=method)
    if cookie:
        request.add_header("Cookie", f"sessionid={cookie}")
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
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
ops = User.objects.create_superuser("ops", "ops@localhost", "pw")
session = SessionStore()
session.update({SESSION_KEY: str(ops.pk), HASH_SESSION_KEY: ops.get_session_auth_hash(),
                BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend"})
session.create()
print(session.session_key, create_token(ops, "t"))
"""


def test_an_outage_answers_503_fast_and_recovers(private_postgres):
    url, start, stop = private_postgres
    env = child_env(DATABASE_URL=url, DATABASE_CONNECT_TIMEOUT="3", REDIS_URL="")
    env.pop("REDIS_URL")
    assert manage("migrate", "--noinput", "-v0", env=env).returncode == 0
    made = manage("shell", "-c", SETUP, env=env)
    assert made.returncode == 0, made.stderr
    cookie, token = made.stdout.strip().splitlines()[-1].split()
    port = free_port()
    web = spawn("web", env, port)
    try:
        wait_port(port)
        base = f"http://127.0.0.1:{port}"
        assert call(f"{base}/api/beads/gt-out", token)[0] == 200
        assert call(f"{base}/beads/gt-out/", cookie=cookie)[0] == 200
        stop()
        status, body, headers, took = call(f"{base}/beads/gt-out/", cookie=cookie)
        assert status == 503 and took < 15, (status, body[:300], took)
        assert b"database unavailable" in body and headers["Retry-After"]
        status, body, headers, took = call(f"{base}/api/beads/gt-out", token)
        assert status == 503 and took < 15, (status, body, took)
        assert "database unavailable" in json.loads(body)["detail"]
        assert headers["Content-Type"] == "application/json"
        close = call(f"{base}/api/beads/gt-out/close", token, b'{"reason": "x"}', "POST")
        assert close[0] == 503 and close[3] < 15, close[:2]
        start()
        # The pool reconnects on its own, after its back-off (about a second per failure).
        deadline = time.monotonic() + 60
        while (status := call(f"{base}/api/beads/gt-out", token))[0] != 200:
            assert status[0] == 503 and time.monotonic() < deadline, status[:2]
            time.sleep(0.5)
        body = status[1]
        assert call(f"{base}/beads/gt-out/", cookie=cookie)[0] == 200
        assert json.loads(body)["status"] == "open"  # the write during the outage: nothing
    finally:
        web.terminate()
        web.wait(timeout=30)
