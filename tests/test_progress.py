"""Progress carries the original's `failed` and `percent` everywhere: CLI
`convoy status` and `list --json`, the API list and detail, the dashboard row, the convoy
page's counts and its SVG bar, all from the one summary."""

import json
import re

import pytest

from convoys.services import beads, convoys, feeding

from .support.factories import bead
from .support.factories import command as cli
from .support.users import signed_in

SEED_SHAPE = {"total", "complete", "inProgress", "ready", "blocked", "failed", "percentComplete"}


@pytest.fixture
def mixed(routes, settings):
    """Four beads: one closed, one in progress, one whose dispatch failed, one ready."""
    settings.CONVOY_DISPATCHER = "command"
    settings.CONVOY_DISPATCH_COMMAND = "false"
    for bead_id in ("gt-1done", "gt-2fail", "gt-3ready"):
        bead(bead_id)
    bead("gt-0busy", assignee="gastown/polecats/nux", status="hooked")
    beads.close_bead("gt-1done", actor="test")
    convoy = convoys.create("Mixed", ["gt-0busy", "gt-1done", "gt-2fail"], actor="test")
    assert feeding.stranded_scan()["dispatched"] == []  # gt-2fail's dispatch fails
    convoys.add(convoy.pk, ["gt-3ready"], actor="test")
    return convoy


EXPECTED = {
    "total": 4,
    "complete": 1,
    "skipped": 0,
    "submitted": 0,
    "inProgress": 1,
    "ready": 1,
    "blocked": 0,
    "failed": 1,
    "unknown": 0,
    "percentComplete": 25,
}


def test_cli_status_and_list_carry_failed_and_percent(mixed):
    status = json.loads(cli("convoy", "status", mixed.pk, "--json"))
    assert status["progress"] == EXPECTED and SEED_SHAPE <= set(status["progress"])
    assert sum(v for k, v in status["progress"].items() if k != "percentComplete") == 8
    [listed] = json.loads(cli("convoy", "list", "--json"))
    assert listed["progress"] == EXPECTED
    assert "Progress: 1/4 done (25%, 1 failed)" in cli("convoy", "status", mixed.pk)
    [every] = json.loads(cli("convoy", "status", "--json"))
    assert every["progress"] == EXPECTED


def test_api_and_pages_carry_failed_and_percent(mixed):
    client = signed_in("viewer", "view_convoy", "view_bead")
    [row] = client.get("/api/convoys").json()
    detail = client.get(f"/api/convoys/{mixed.pk}").json()
    for progress in (row["progress"], detail["progress"]):
        assert (progress["failed"], progress["percent"], progress["ready"]) == (1, 25, 1)
        assert (progress["done"], progress["active"], progress["total"]) == (1, 1, 4)
    dashboard = client.get("/").content.decode()
    assert '<span class="percent">25%</span>' in dashboard
    page = client.get(f"/convoys/{mixed.pk}/").content.decode()
    assert "1 in progress · 1 failed · 1 ready" in page and ">25%</span>" in page
    assert "1 failed, 1 ready, 0 blocked, 0 unknown of 4 (25% done)" in page  # the bar's label
    widths = dict(re.findall(r'<rect class="seg (\w+)" x="[\d.]+" width="([\d.]+)"', page))
    assert widths == {"done": "25", "active": "25", "failed": "25", "ready": "25"}


def test_a_retried_bead_that_runs_is_not_failed_and_all_done_is_100(mixed, settings):
    settings.CONVOY_DISPATCH_COMMAND = "true"
    settings.CONVOY_RETRY_COOLDOWN = 0
    feeding.feed_convoy(mixed, "manual", limit=5)
    progress = json.loads(cli("convoy", "status", mixed.pk, "--json"))["progress"]
    assert (progress["failed"], progress["inProgress"]) == (0, 3)
    for bead_id in ("gt-0busy", "gt-2fail", "gt-3ready"):
        beads.close_bead(bead_id, actor="test")
    progress = json.loads(cli("convoy", "status", mixed.pk, "--json"))["progress"]
    assert (progress["complete"], progress["percentComplete"]) == (4, 100)
