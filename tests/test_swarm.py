"""The demo swarm's log: a human stop message on SIGTERM (exit 0, not -15), a waiting line
once per outage, per-bead lines only with -v 2."""

import io
import os
import signal
import threading
import time

from django.core.management import call_command

from convoys.management.commands import swarm as swarm_command

from .support.waiting import wait_until


class Clock:
    """The swarm's `time`, with sleeps counted (and short)."""

    def __init__(self):
        self.sleeps = 0

    def monotonic(self):
        return time.monotonic()

    def sleep(self, seconds):
        self.sleeps += 1
        time.sleep(0.01)


def test_sigterm_stops_the_swarm_with_words_and_the_log_stays_quiet(db, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(swarm_command, "time", clock)
    out = io.StringIO()

    def terminate():  # once the swarm listens for SIGTERM and has retried a few times
        wait_until(lambda: signal.getsignal(signal.SIGTERM) is swarm_command._stop, 20, 0.01)
        wait_until(lambda: clock.sleeps >= 5, 20, 0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate)
    killer.start()
    call_command(
        "swarm", url="http://127.0.0.1:9", token="t", keep_open=0, stdout=out, stderr=io.StringIO()
    )
    killer.join()
    text = out.getvalue()
    assert text.count("swarm: waiting for the server") == 1, text  # not once per retry
    assert text.rstrip().endswith("swarm: stopped after 0 beads picked up, 0 closed"), text
    assert signal.getsignal(signal.SIGTERM) is not swarm_command._stop  # handler restored


def test_per_bead_lines_only_when_asked():
    quiet, chatty = (
        swarm_command.Command(stdout=io.StringIO()),
        swarm_command.Command(stdout=io.StringIO()),
    )
    chatty.verbose = True
    for command in (quiet, chatty):
        command.count("picked up", "swarm: nux picked up gt-a")
        command.count("closed", "swarm: nux closed gt-a")
        command.count("launched", "swarm: launched hq-cv-1: Pump", always=True)
        command.report(command.done, "in the last minute:")
    lines = quiet.stdout._out.getvalue().splitlines()
    assert lines == [
        "swarm: launched hq-cv-1: Pump",
        "swarm: in the last minute: 1 bead picked up, 1 closed, 1 convoy launched",
    ]
    assert "swarm: nux closed gt-a" in chatty.stdout._out.getvalue()
