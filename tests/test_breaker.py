"""The dispatch circuit breaker: after CONVOY_MAX_DISPATCH_FAILURES failed
dispatches in a row a bead is parked: no path retries it, the convoy cannot land, its people
are told to act; `beads retry` (or the bead page's button) clears it."""

import json
import sys

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError

from convoys.models import Bead, Convoy, Dispatch, Event, Notification
from convoys.rules import stranding
from convoys.services import controls, convoys, feeding, notify
from convoys.services.notify import ACTION_NEEDED

from .support.factories import bead, command
from .support.users import signed_in


@pytest.fixture
def failing(routes, settings, tmp_path):
    """The command dispatcher with a command that exits 1 while `broken` exists; no
    cooldown, so every path may try again at once."""
    broken = tmp_path / "broken"
    broken.write_text("")
    script = tmp_path / "dispatch.py"
    script.write_text(
        "import os, sys\n"
        f"if os.path.exists({str(broken)!r}):\n"
        "    sys.exit('worker pool unreachable')\n"
    )
    settings.CONVOY_DISPATCHER = "command"
    settings.CONVOY_DISPATCH_COMMAND = f"{sys.executable} {script} {{bead}}"
    settings.CONVOY_RETRY_COOLDOWN = 0
    return broken


@pytest.fixture
def convoy(failing):
    bead("gt-a")
    row = convoys.create("Fragile", ["gt-a"], owner="alice")
    User.objects.create_user("alice", email="alice@example.com")
    watcher = User.objects.create_user("watcher")
    from django.contrib.auth.models import Permission

    view = Permission.objects.get(codename="view_convoy")
    for name in ("alice", "watcher"):
        User.objects.get(username=name).user_permissions.add(view)
    notify.subscribe(watcher, row)
    return row


def attempts():
    return Dispatch.objects.filter(bead_id="gt-a").count()


def test_three_failures_in_a_row_park_the_bead_on_every_path(convoy, failing):
    command("sling", convoy.pk)  # 1: a container sling
    command("convoy", "feed", "--once")  # 2: the stranded scan
    assert attempts() == 2 and Bead.objects.get(pk="gt-a").dispatch_failures == 2
    assert not Event.objects.filter(kind="bead.parked").exists()
    feeding.feed_convoy(convoy, "event")  # 3: the event feeder
    parked = Bead.objects.get(pk="gt-a")
    assert (parked.dispatch_failures, parked.status, parked.assignee) == (3, "open", "")
    event = Event.objects.get(kind="bead.parked")
    assert event.data["failures"] == 3 and event.data["error"] == "worker pool unreachable"

    # No path tries it again.
    command("convoy", "feed", "--once")
    assert feeding.feed_convoy(convoy, "event") == []
    slung = json.loads(command("sling", convoy.pk, "--json"))
    assert slung["dispatched"] == [] and [s["id"] for s in slung["skipped"]] == ["gt-a"]
    assert attempts() == 3
    # It counts as failing and the convoy cannot land.
    verdict = stranding.classify_one(convoy)
    assert (verdict.kind, verdict.code) == ("stuck", "dispatch_failing")
    command("convoy", "check", convoy.pk)
    assert Convoy.objects.get(pk=convoy.pk).status == "open"
    assert "⚠ gt-a" in command("convoy", "status", convoy.pk)
    assert "parked: dispatch failed 3 times in a row" in command("convoy", "status", convoy.pk)
    shown = command("beads", "show", "gt-a")
    assert "⚠ parked: 3 failed dispatches in a row (last: worker pool unreachable)" in shown
    assert json.loads(command("beads", "show", "gt-a", "--json"))["parked"] is True
    assert slung["skipped"][0]["reason"].startswith("parked after 3 failed dispatches in a row")
    with pytest.raises(CommandError, match="cannot sling gt-a: parked after 3 failed dispatches"):
        command("sling", "gt-a")
    assert attempts() == 3

    # The owner and the subscriber are told to act, once.
    notes = Notification.objects.filter(kind=ACTION_NEEDED)
    assert sorted(n.user.username for n in notes) == ["alice", "watcher"]
    note = notes.first()
    assert note.subject == "⚠ Dispatch failing: gt-a parked"
    assert "failed 3 times in a row" in note.body and "beads retry gt-a" in note.body
    assert "Last error: worker pool unreachable" in note.body

    # The cause is fixed; `beads retry` clears the breaker and the next pass dispatches it.
    failing.unlink()
    out = command("beads", "retry", "gt-a")
    assert "↻ gt-a: clears the breaker (3 failed dispatches)" in out
    assert Event.objects.filter(kind="bead.retried", bead_id="gt-a").exists()
    command("convoy", "feed", "--once")
    dispatched = Bead.objects.get(pk="gt-a")
    assert (dispatched.status, dispatched.dispatch_failures) == ("hooked", 0)
    with pytest.raises(CommandError, match="gt-a has no failed dispatches to retry"):
        command("beads", "retry", "gt-a")
    assert Notification.objects.filter(kind=ACTION_NEEDED).count() == 2


def test_a_good_dispatch_resets_the_count(convoy, failing):
    command("sling", convoy.pk)
    command("convoy", "feed", "--once")
    assert Bead.objects.get(pk="gt-a").dispatch_failures == 2
    failing.unlink()
    command("convoy", "feed", "--once")
    assert Bead.objects.get(pk="gt-a").dispatch_failures == 0
    assert not Event.objects.filter(kind="bead.parked").exists()


def test_the_limit_is_a_setting(convoy, settings):
    settings.CONVOY_MAX_DISPATCH_FAILURES = 1
    command("sling", convoy.pk)
    assert Event.objects.filter(kind="bead.parked").count() == 1
    command("convoy", "feed", "--once")
    assert attempts() == 1


def test_bead_page_shows_the_breaker_and_retry_clears_it(convoy):
    for _ in range(3):
        feeding.feed_convoy(convoy, "event")
    assert Bead.objects.get(pk="gt-a").dispatch_failures == 3
    viewer = signed_in("viewer", "view_bead", "view_convoy")
    page = viewer.get("/beads/gt-a/").content.decode()
    assert "Dispatch failing: parked" in page and "worker pool unreachable" in page
    assert "/beads/gt-a/retry/" not in page  # no button without change_bead
    assert viewer.post("/beads/gt-a/retry/").status_code == 403
    editor = signed_in("editor", "view_bead", "view_convoy", "change_bead")
    assert 'action="/beads/gt-a/retry/"' in editor.get("/beads/gt-a/").content.decode()
    assert editor.post("/beads/gt-a/retry/").status_code == 302
    assert Bead.objects.get(pk="gt-a").dispatch_failures == 0
    assert "Dispatch failing" not in editor.get("/beads/gt-a/").content.decode()
    assert editor.post("/beads/gt-nope/retry/").status_code == 404


def test_retry_refuses_an_unknown_bead(db):
    with pytest.raises(CommandError, match="bead 'gt-nope' not found"):
        command("beads", "retry", "gt-nope")


def test_api_retry(convoy):
    for _ in range(3):
        feeding.feed_convoy(convoy, "event")
    viewer = signed_in("viewer", "view_bead")
    assert viewer.post("/api/beads/gt-a/retry").status_code == 403
    editor = signed_in("editor", "view_bead", "change_bead")
    answer = editor.post("/api/beads/gt-a/retry")
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"id": "gt-a", "changed": True, "dispatch_failures": 0}
    assert editor.post("/api/beads/gt-a/retry").json()["changed"] is False
    assert Event.objects.get(kind="bead.retried").actor == "api:editor"
    assert editor.post("/api/beads/gt-nope/retry").json() == {"detail": "bead 'gt-nope' not found"}


@pytest.mark.parametrize("body", ['{"actor": 7}', "[1]", '{"zzz": 1}', "garbage", '"x"', "null"])
def test_api_controls_refuse_a_body_they_do_not_take(convoy, body):
    """ack, resume and retry take no body: one that is sent is a 422 and nothing is done."""
    for _ in range(3):
        feeding.feed_convoy(convoy, "event")
    controls.pause(convoy.pk, actor="test")
    editor = signed_in("editor", "view_bead", "change_bead", "view_convoy", "change_convoy")
    before = Event.objects.count()
    for path in (
        "/api/beads/gt-a/retry",
        f"/api/convoys/{convoy.pk}/resume",
        f"/api/convoys/{convoy.pk}/ack",
    ):
        answer = editor.post(path, body, content_type="application/json")
        assert answer.status_code == 422, (path, answer.content)
        assert "takes no body" in answer.json()["detail"][0]["msg"]
    assert Event.objects.count() == before
    assert editor.post("/api/beads/gt-a/retry", "{}", content_type="application/json").json()[
        "changed"
    ]
