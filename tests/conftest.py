import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data" / "beads"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
IN_CI = os.environ.get("CI", "").lower() == "true"


def shared_file(name):
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} is absent (../shared is not next to this clone)")
    return path


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """Django's own PBKDF2 with one iteration: a test user's password costs microseconds, not
    half a second (its 1,000,000 iterations were a third of the fast loop's time). The
    iteration count travels in the stored hash, so the daphne and cluster processes the tests
    start (with the default hashers) still check these passwords."""

    iterations = 1


@pytest.fixture(autouse=True)
def _sync_tasks(monkeypatch, settings):
    """django-q2 runs tasks inline in unit tests (its documented test mode)."""
    from django_q.conf import Conf

    monkeypatch.setattr(Conf, "SYNC", True)
    settings.CONVOY_RETRY_COOLDOWN = 60
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.PASSWORD_HASHERS = ["tests.conftest.QuickPBKDF2PasswordHasher"]


@pytest.fixture(autouse=True)
def _fresh_channel_layer():
    """Each test gets its own channel layer. Every async_to_sync call runs a new event loop,
    and channels_redis binds its receive lock to the loop that first waits on it: a socket
    test that ends while its consumers are still receiving left the next test's consumers a
    lock of a dead loop ("bound to a different event loop"). A web process has one loop."""
    yield
    from channels.layers import channel_layers

    channel_layers.backends.clear()


def _children():
    """Our live direct children: pid -> is it the leader of its own session?"""
    me, found = os.getpid(), {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry.name}/stat").read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == me and fields[0] != "Z":
            found[int(entry.name)] = int(fields[4]) == int(entry.name)
    return found


@pytest.fixture(autouse=True)
def _empty_task_queue():
    """On Redis the task broker's queue outlives a test (the database does not): the close
    tasks a test enqueued and no cluster ran would be the next test's cluster's first work
    (hundreds after the fault tests' bursts, so that cluster looked as if it never started)."""
    if os.environ.get("REDIS_URL"):
        from django_q.brokers import get_broker

        get_broker().purge_queue()
    yield


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test():
    """A test that fails before stopping what it started (a cluster that did not tick in
    time) must not leave it running: a stray cluster takes later tests' tasks."""
    before = set(_children())
    yield
    for pid, leader in _children().items():
        if pid in before:
            continue
        try:
            os.killpg(pid, signal.SIGKILL) if leader else os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture
def routes(db):
    from convoys.services.rigs import upsert_route

    upsert_route("gt-", "gastown/mayor/rig")
    upsert_route("bd-", "beads")
    upsert_route("hq-", ".")


def is_postgres():
    return connection.vendor == "postgresql"


def require_postgres():
    if not is_postgres():
        pytest.skip("runs in the PostgreSQL pass (DATABASE_URL=postgres://…; .ci/run does both)")


def redis_url():
    url = os.environ.get("REDIS_URL", "")
    if not url:
        if IN_CI and is_postgres():
            pytest.fail("REDIS_URL must be set in the CI PostgreSQL pass")
        pytest.skip("needs Redis (REDIS_URL=redis://…; .ci/run sets it in the PostgreSQL pass)")
    return url


def database_url():
    """A DATABASE_URL that points child processes at the test database."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    user = s.get("USER") or ""
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    return f"postgres://{auth}{host}:{port}/{s['NAME']}"


def child_env(**extra):
    env = dict(os.environ)
    # Set in this process only while Playwright's event loop runs (test_browser.browser);
    # a child must never hide a SynchronousOnlyOperation.
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    # Importing convoyweb.asgi in this process defaults DATABASE_POOL on for web processes;
    # children choose for themselves (daphne pools, task clusters must not).
    env.pop("DATABASE_POOL", None)
    env["DATABASE_URL"] = database_url()
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def manage(*args, env=None, check=False, timeout=120):
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        capture_output=True,
        text=True,
        env=env or child_env(),
        timeout=timeout,
        check=check,
    )


def free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port, timeout=20):
    import socket
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"port {port} did not open")


_LOGS = []  # (what, path) of the log files of the processes the running test started


def log_file(what):
    """An open file for a child process's output (an undrained pipe fills up and blocks the
    child; /dev/null hides why a test failed). A failing test's report shows each such log
    (section "log: <what>"); the files of a passing test are removed."""
    out = tempfile.NamedTemporaryFile("w+", prefix=f"convoy-{what}-", suffix=".log", delete=False)  # noqa: SIM115
    _LOGS.append((what, out.name))
    return out


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        for what, path in _LOGS:
            try:
                text = Path(path).read_text(errors="replace")
            except OSError:
                continue
            tail = text[-20000:]
            cut = (
                f"[{len(text) - len(tail)} characters before this left out]\n"
                if tail != text
                else ""
            )
            report.sections.append((f"log: {what} ({path})", cut + tail))
    if report.when == "teardown":
        if not (report.failed or getattr(item, "_convoy_failed", False)):
            for _, path in _LOGS:
                Path(path).unlink(missing_ok=True)
        _LOGS.clear()
    elif report.failed:
        item._convoy_failed = True
    return report


def spawn(kind, env, port=None):
    """A web process (daphne on `port`) or a task cluster in its own session; its output goes
    to a log file shown when the test fails (`log_file`)."""
    if kind == "web":
        argv = [
            sys.executable,
            "-m",
            "convoyweb.webserver",  # daphne, as serve starts it
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "convoyweb.asgi:application",
        ]
    else:
        argv = [sys.executable, str(ROOT / "manage.py"), "cluster"]
    out = log_file(f"{kind}-{port}" if port else kind)
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    out.close()  # the child holds its own descriptor
    proc.log_path = out.name
    return proc


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test databases, dropped at the end without a warning on PostgreSQL:
    importing convoyweb.asgi (the live tests do) turns the web processes' connection pool on
    in this process too, and a pooled connection kept DROP DATABASE out."""
    yield
    from django.db import connections

    with django_db_blocker.unblock():
        for conn in connections.all(initialized_only=True):
            if getattr(conn, "pool", None) is not None:
                conn.close_pool()


def pytest_collection_modifyitems(config, items):
    """Browser tests start a server, a cluster and Chromium: each is `slow` (out of the fast
    loop, `-m "not slow"`) whether or not its module says so."""
    for item in items:
        if item.get_closest_marker("browser") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
