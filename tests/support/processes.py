"""Real processes: web servers, task clusters and scripts in their own sessions, on the test
database, their output in log files that a failing test's report shows."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from .databases import database_url
from .paths import ROOT


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


FAST = {
    "CONVOY_FEED_INTERVAL": "1",
    "CONVOY_STRANDED_INTERVAL": "1",
    "CONVOY_TASK_TIMEOUT": "8",
    "CONVOY_TASK_RETRY": "10",
    "CONVOY_WORKERS": "2",
}


@pytest.fixture
def real_cluster(monkeypatch):
    """Tasks go through the broker to a cluster process, not inline (the modules that start
    clusters ask for it with `pytest.mark.usefixtures("real_cluster")`)."""
    from django_q.conf import Conf

    monkeypatch.setattr(Conf, "SYNC", False)


def start_cluster(**env):
    return start("cluster", env={**FAST, **env})


def start(*command, env):
    """`manage.py COMMAND` in a session of its own. Its output goes to a log file (shown in
    the report of a failing test, conftest.log_file). Every process it starts inherits a
    marker in its environment, for `survivors`."""
    out = log_file(command[0])
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *command],
        env=child_env(CONVOY_TEST_PROCESS=mark, **env),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    out.close()  # the child holds its own descriptor
    proc.log_path, proc.mark = out.name, mark
    return proc


def output(proc):
    return Path(proc.log_path).read_text()


def log(proc):
    return output(proc)


def survivors(proc):
    """Processes still alive that `proc` or any of its descendants started."""
    marker = f"CONVOY_TEST_PROCESS={proc.mark}".encode()
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                alive.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return alive


def stop(proc, sig=signal.SIGTERM, group=False):
    if proc.poll() is None:
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return log(proc)


def python(code, **env):
    script = "import django, os; django.setup()\n" + textwrap.dedent(code)
    return subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=child_env(DJANGO_SETTINGS_MODULE="convoyweb.settings", **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# The loop bodies of the race tests' child processes (`python`): each runs inside a `while` of
# the test's own (indented by 8, `io`, `time`, `call_command` and `CommandError` imported),
# `{cid}` the convoy they race on.
RACE_STEPS = {
    "close": """
        from convoys.models import Bead, Event, TrackedBead
        from convoys.services import feeding
        busy = Bead.objects.filter(
            pk__in=TrackedBead.objects.filter(convoy_id="{cid}").values("bead_id"),
            status="hooked",
        ).order_by("pk").first()
        if busy is None:
            time.sleep(0.02)
            continue
        call_command("beads", "close", busy.pk, stdout=io.StringIO())
        seq = Event.objects.filter(kind="bead.closed", bead_id=busy.pk).latest("seq").seq
        feeding.handle_close_event(seq)  # what the close task runs
""",
    "catch-up and scan": """
        call_command("convoy", "feed", "--once", stdout=io.StringIO())
""",
    "sling": """
        try:
            call_command("sling", "{cid}", "--json", stdout=io.StringIO())
        except CommandError:
            pass  # paused, or nothing ready to sling right now
""",
}


def _answers(port):
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=2):
            return True
    except OSError:
        return False
