"""What a command line user sees on its streams: a command whose reader goes away
(`manage.py beads list | head`) stops quietly, and a close says its line and nothing of the
task queue behind it."""

import subprocess
import sys

import pytest
from django.utils import timezone

from convoys.infra import bulk
from convoys.models import Bead
from convoys.services import convoys

from .support.factories import bead, blocks
from .support.paths import ROOT
from .support.processes import child_env, manage


@pytest.mark.django_db(transaction=True)
def test_a_listing_piped_into_head_stops_quietly():
    now = timezone.now()
    rows = [
        {
            "id": f"gt-pipe{i:05d}",
            "title": "A bead with a long enough title to fill the pipe " * 2,
            "status": "open",
            "issue_type": "task",
            "priority": 2,
            "created_at": now,
            "updated_at": now,
        }
        for i in range(3000)  # well past a pipe's 64 kB buffer
    ]
    bulk.insert(Bead, rows)
    listing = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "beads", "list", "--limit", "3000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    assert listing.stdout is not None and listing.stderr is not None
    assert listing.stdout.readline().startswith(b"gt-pipe")  # what `head -1` reads
    listing.stdout.close()
    said = listing.stderr.read().decode()
    code = listing.wait(timeout=60)
    assert (code, "Traceback" in said, "BrokenPipe" in said) == (1, False, False), said


@pytest.mark.django_db(transaction=True)
def test_a_close_from_the_command_line_says_one_line_and_nothing_on_stderr(routes):
    bead("gt-said")
    done = manage("beads", "close", "gt-said", "--reason", "done")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Closed gt-said") and done.stderr == ""
    assert Bead.objects.get(pk="gt-said").status == "closed"


@pytest.mark.django_db(transaction=True)
def test_a_bead_action_in_a_convoy_prints_its_answer_and_not_the_feeders_log(routes):
    bead("gt-fed0")
    for held in ("gt-fed1", "gt-fed2"):  # blocked: the feed after a release finds nothing
        bead(held, assignee="gastown/polecats/nux", status="hooked")
        blocks("gt-fed0", held)
    convoys.create("Fed", ["gt-fed1", "gt-fed2"], actor="test")
    done = manage("beads", "release", "gt-fed1")
    assert done.returncode == 0 and "1 released" in done.stdout, done.stderr
    assert done.stderr == ""
    said = manage("beads", "-v", "2", "release", "gt-fed2")
    assert said.returncode == 0 and "no ready issues to feed" in said.stderr, said.stderr


def test_a_database_nobody_migrated_is_one_line_naming_it(tmp_path):
    empty = tmp_path / "other.sqlite3"
    done = manage("tokens", "create", "demo", env=child_env(DATABASE_URL=f"sqlite:///{empty}"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        f"error: {empty} has no convoyweb tables (no such table: auth_user): run "
        "`manage.py migrate`, or set DATABASE_URL to the database the server uses"
    )
