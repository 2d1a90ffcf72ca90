"""The ticker's schedule on a fake clock: each job on its interval, no burst after a stall.
(The real cluster running the jobs is test_processes.test_the_cluster_ticker_runs_both_periodic_jobs.)"""

import types

import pytest

from convoys.services import ticker

pytestmark = pytest.mark.django_db


class Clock:
    """time.monotonic for the ticker, and a threading.Event whose wait() moves the clock."""

    def __init__(self, until, stall_at=None, stall=0.0):
        self.now, self.until = 1000.0, 1000.0 + until
        self.stall_at, self.stall = stall_at, stall

    def monotonic(self):
        return self.now

    def is_set(self):
        return self.now >= self.until

    def wait(self, seconds):
        self.now += seconds
        if self.stall_at is not None and self.now >= 1000.0 + self.stall_at:
            self.now += self.stall  # the process was descheduled (or the machine slept)
            self.stall_at = None


def run(settings, monkeypatch, clock):
    settings.CONVOY_FEED_INTERVAL = 1
    settings.CONVOY_STRANDED_INTERVAL = 2
    settings.CONVOY_SYNC_SOURCES = []
    monkeypatch.setattr(ticker, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(ticker, "close_old_connections", lambda: None)  # the test's transaction
    ran = {}
    ticker.run(clock, "test-holder", lambda func, name: ran.setdefault(name, []).append(clock.now))
    return {name: [round(t - 1000.0, 6) for t in times] for name, times in ran.items()}


def test_each_job_runs_on_its_interval(settings, monkeypatch):
    ran = run(settings, monkeypatch, Clock(until=10))
    assert ran["catch-up"] == [float(s) for s in range(10)]
    assert ran["stranded-scan"] == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_a_stall_runs_each_job_once_then_keeps_the_interval(settings, monkeypatch):
    """Ticks missed while the process was stalled are not made up in a burst."""
    ran = run(settings, monkeypatch, Clock(until=20, stall_at=3, stall=7.5))
    feed = ran["catch-up"]
    assert feed[:4] == [0.0, 1.0, 2.0, 10.5]  # one run when the stall ends, not eight
    gaps = [b - a for a, b in zip(feed[3:], feed[4:], strict=False)]
    assert gaps and all(gap >= 0.5 for gap in gaps), feed
    assert ran["stranded-scan"][:2] == [0.0, 2.0] and ran["stranded-scan"][2] == 10.5
