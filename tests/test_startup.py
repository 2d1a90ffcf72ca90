"""The commands agents call most start without what only other commands need: no web server
(daphne, twisted, autobahn), no graph library (networkx), no API framework (ninja, pydantic).
Each runs as a real process under `python -X importtime`, which lists every module it loads."""

import subprocess
import sys

import pytest

from convoys.services.rigs import upsert_route

from .support.factories import bead, blocks
from .support.paths import ROOT
from .support.processes import child_env

NOT_AT_START_UP = ("daphne", "twisted", "autobahn", "networkx", "ninja", "pydantic")

pytestmark = pytest.mark.django_db(transaction=True)


def loaded(*args):
    """The top-level packages whose modules a real `manage.py <args>` loaded, and its result."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "manage.py"), *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    names = {
        line.split("|")[-1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    return names, done.returncode, "\n".join(errors)


@pytest.fixture
def town():
    upsert_route("gt-", "gastown/mayor/rig")
    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b")


@pytest.mark.parametrize(
    "args",
    [
        ("beads", "show", "gt-a"),
        ("beads", "ready"),
        ("beads", "update", "gt-a", "--priority", "1"),
        ("beads", "heartbeat", "gastown/alpha"),
        ("beads", "close", "gt-a", "--reason", "done"),
        ("sling", "gt-a", "--no-convoy"),
        ("convoy", "status"),
        ("users", "list"),
    ],
    ids=" ".join,
)
def test_an_agents_command_loads_nothing_it_does_not_need(town, args):
    names, code, errors = loaded(*args)
    assert code == 0, errors
    assert "django" in names and "convoys" in names  # the listing is read
    assert sorted(names.intersection(NOT_AT_START_UP)) == []


def test_staging_loads_the_graph_library_when_it_needs_it(town):
    """The guard sees a lazily loaded module once it is used (else it could not fail)."""
    names, code, errors = loaded("convoy", "stage", "gt-a", "gt-b", "--json")
    assert code == 0, errors
    assert "networkx" in names
    assert "daphne" not in names
