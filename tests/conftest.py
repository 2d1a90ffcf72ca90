"""What every test gets without asking (tasks inline, a fresh channel layer, no process that
outlives its test) and the fixtures of tests/support, registered here."""

import os
import signal

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher

# The support modules' asserts report what they compared, as a test's own do.
pytest.register_assert_rewrite("tests.support")
pytest_plugins = [
    "tests.support.processes",  # first: browser imports it
    "tests.support.browser",
    "tests.support.factories",
    "tests.support.pages",
    "tests.support.receiver",
    "tests.support.sync",
]


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
