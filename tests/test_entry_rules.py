"""Rules at every entry (services, CLI, API): a blocking dependency that would make a cycle is
refused naming the cycle; work under way (hooked, in progress) needs an assignee. Each refusal
is one line and changes nothing. (The admin: tests/test_admin.py.)"""

import json

import pytest
from django.contrib.auth.models import User
from django.core.management.base import CommandError

from convoys.models import Bead, Dependency, Event
from convoys.services import beads
from convoys.services.errors import ServiceError
from convoys.services.tokens import create_token

from .support.factories import bead, blocks, command


@pytest.fixture
def chain(routes):
    for bead_id in ("gt-a", "gt-b", "gt-c"):
        bead(bead_id)
    blocks("gt-a", "gt-b")  # b depends on a
    blocks("gt-b", "gt-c")  # c depends on b


def test_a_cycle_is_refused_naming_it_everywhere(chain):
    before = (Event.objects.count(), Dependency.objects.count())
    with pytest.raises(ServiceError, match="would make a cycle gt-a → gt-c → gt-b → gt-a"):
        beads.add_dependency("gt-a", "gt-c")
    with pytest.raises(CommandError, match="would make a cycle gt-a → gt-c → gt-b → gt-a"):
        command("beads", "dep", "add", "gt-a", "gt-c")
    assert (Event.objects.count(), Dependency.objects.count()) == before
    beads.add_dependency("gt-a", "gt-c", "related")  # not blocking: no cycle to make
    beads.add_dependency("gt-c", "gt-a")  # a shortcut, not a loop


def test_work_under_way_needs_an_assignee(chain):
    token = create_token(User.objects.create_superuser("root", "r@localhost", None), "t")
    for status in ("in_progress", "hooked"):
        with pytest.raises(ServiceError, match=f"status {status} needs an assignee"):
            beads.update_bead("gt-a", status=status)
        with pytest.raises(CommandError, match="needs an assignee"):
            command("beads", "update", "gt-a", "--status", status)
    from django.test import Client

    answer = Client().patch(
        "/api/beads/gt-a",
        data=json.dumps({"status": "in_progress"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code in (400, 409, 422) and "needs an assignee" in answer.json()["detail"]
    assert Bead.objects.get(pk="gt-a").status == "open"
    worker = "gastown/polecats/nux"
    assert beads.update_bead("gt-a", status="in_progress", assignee=worker).status == "in_progress"
    with pytest.raises(ServiceError, match="needs an assignee"):
        beads.update_bead("gt-a", assignee="")  # taking the worker off work under way


def test_closing_with_open_blockers_asks_to_confirm_everywhere(chain, client):
    """gt-b is blocked by gt-a: each entry refuses the close naming gt-a and says how to close
    it anyway; nothing changes until the user confirms."""
    before = Event.objects.count()
    with pytest.raises(ServiceError, match="gt-b is still blocked by gt-a"):
        beads.close_bead("gt-b")
    with pytest.raises(CommandError, match="blocked by gt-a.*--force closes it anyway"):
        command("beads", "close", "gt-b")
    with pytest.raises(CommandError, match="--force closes it anyway"):
        command("beads", "update", "gt-b", "--status", "closed")
    user = User.objects.create_superuser("root", "r@localhost", None)
    auth = {"Authorization": f"Bearer {create_token(user, 't')}"}
    answer = client.post(
        "/api/beads/gt-b/close", data={}, content_type="application/json", headers=auth
    )
    assert answer.status_code == 400
    assert answer.json()["detail"].endswith(
        'blocked by gt-a (not done): send "force": true to close it anyway'
    )
    client.force_login(user)
    page = client.get("/beads/gt-b/").content.decode()
    assert 'id="close-anyway"' in page and "still blocked by gt-a" in page
    assert 'id="close-anyway"' not in client.get("/beads/gt-a/").content.decode()
    answer = client.post("/beads/gt-b/close/", {"reason": "shipped"}, follow=True)
    assert "tick “Close it anyway” to close it" in answer.content.decode()
    assert Bead.objects.get(pk="gt-b").status == "open"
    assert Event.objects.count() == before
    # Confirmed: closed, on each entry.
    client.post("/beads/gt-b/close/", {"reason": "shipped", "force": "1"})
    assert Bead.objects.get(pk="gt-b").status == "closed"
    assert "Closed gt-c" in command("beads", "close", "gt-c", "--force")
    beads.reopen_bead("gt-c")
    answer = client.patch(
        "/api/beads/gt-c",
        data=json.dumps({"status": "closed", "force": True}),
        content_type="application/json",
        headers=auth,
    )
    assert answer.status_code == 200 and answer.json()["status"] == "closed"
    # Done blockers block nothing: no confirmation.
    beads.close_bead("gt-a")
    beads.reopen_bead("gt-b")
    assert beads.close_bead("gt-b").status == "closed"
