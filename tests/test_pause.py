"""Pause and resume: a paused convoy is fed by no path (close event,
catch-up, stranded scan, sling into it, launch), the proof is read from the dispatch records,
and resume feeds at once. CLI, web page, API and services."""

import json

import pytest
from django.core.management import CommandError
from django.utils import timezone

from convoys.models import Bead, Convoy, Dispatch, Event
from convoys.rules import stranding
from convoys.services import beads, controls, convoys, feeding
from convoys.services.errors import ServiceError

from .support.factories import bead, blocks, chain, command, hooked, launched
from .support.users import signed_in


@pytest.fixture
def closing(django_capture_on_commit_callbacks):
    """Close a bead and run what its commit triggers (the event feeder, in sync mode)."""

    def close(bead_id):
        with django_capture_on_commit_callbacks(execute=True):
            beads.close_bead(bead_id, reason="done")

    return close


@pytest.fixture
def paused_chain(routes):
    """gt-c0 → gt-c1 → gt-c2 launched (gt-c0 dispatched), then paused from the CLI."""
    convoy = launched(chain(3))
    assert hooked() == ["gt-c0"]
    out = command("convoy", "pause", convoy.pk, "--reason", "db migration", "--actor", "ops")
    assert f"⏸ Paused convoy 🚚 {convoy.pk}" in out
    return Convoy.objects.get(pk=convoy.pk)


def test_no_path_feeds_a_paused_convoy_and_status_proves_it(paused_chain, closing):
    convoy = paused_chain
    closing("gt-c0")  # the event feeder
    assert hooked() == []
    command("convoy", "feed", "--once")  # catch-up and the stranded scan
    feeding.stranded_scan()
    feeding.catch_up()
    assert hooked() == []
    with pytest.raises(CommandError, match=f"cannot sling paused convoy {convoy.pk}"):
        command("sling", convoy.pk)
    with pytest.raises(CommandError, match="cannot sling gt-c1: it is in paused convoy"):
        command("sling", "gt-c1")
    # Straight at the claim, as a racing feeder would: refused.
    assert feeding.feed_convoy(convoy, "event") == []
    assert hooked() == [] and Bead.objects.get(pk="gt-c1").status == "open"
    assert not Dispatch.objects.filter(created_at__gte=convoy.paused_at).exists()

    out = command("convoy", "status", convoy.pk)
    assert "⏸ Paused by ops at " in out
    assert "— db migration (0 dispatches since pause)" in out
    data = json.loads(command("convoy", "status", convoy.pk, "--json"))
    assert data["paused"]["by"] == "ops" and data["paused"]["reason"] == "db migration"
    assert data["paused"]["dispatches_since"] == 0
    verdict = stranding.classify_one(convoy)
    assert (verdict.kind, verdict.code) == ("stuck", "paused")
    assert verdict.reason == "paused by ops: db migration"
    assert [r["id"] for r in feeding.stranded()] == [convoy.pk]

    out = command("convoy", "resume", convoy.pk, "--actor", "ops")
    assert f"▶ Resumed convoy 🚚 {convoy.pk}; dispatched gt-c1 → gastown/polecats/" in out
    assert hooked() == ["gt-c1"]
    assert "Paused" not in command("convoy", "status", convoy.pk)
    kinds = list(
        Event.objects.filter(kind__in=("convoy.paused", "convoy.resumed")).values_list(
            "kind", "actor", "data__reason"
        )
    )
    assert kinds == [("convoy.paused", "ops", "db migration"), ("convoy.resumed", "ops", None)]


def test_pause_counts_dispatches_made_since_from_the_records(paused_chain):
    """The proof counts rows, not the flag: a dispatch row after the pause shows up."""
    convoy = paused_chain
    Dispatch.objects.create(bead_id="gt-c1", convoy_id="", path="manual", created_at=timezone.now())
    assert "(1 dispatch since pause)" in command("convoy", "status", convoy.pk)


def test_a_paused_convoy_that_lands_no_longer_says_it_is_paused(paused_chain, closing):
    """Its last beads closed by their workers while paused: landed, it holds nothing back."""
    convoy = paused_chain
    assert "⏸ Paused by" in command("convoy", "status", convoy.pk)
    for bead_id in ("gt-c0", "gt-c1", "gt-c2"):
        closing(bead_id)
    convoy.refresh_from_db()
    assert convoy.landed
    assert "Paused" not in command("convoy", "status", convoy.pk)
    assert json.loads(command("convoy", "status", convoy.pk, "--json"))["paused"] is None


def test_pause_holds_a_bead_in_any_convoy_that_tracks_it(routes, closing):
    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b")
    busy = convoys.create("Busy", ["gt-a", "gt-b"])
    other = convoys.create("Other", ["gt-b"])
    controls.pause(other.pk, actor="ops")
    command("sling", busy.pk)
    assert hooked() == ["gt-a"]
    closing("gt-a")
    assert hooked() == []  # gt-b waits: a convoy that tracks it is paused
    controls.resume(other.pk, actor="ops")
    assert hooked() == ["gt-b"]


def test_pause_and_resume_twice_and_refusals(paused_chain):
    convoy = paused_chain
    out = command("convoy", "pause", convoy.pk)
    assert f"○ Convoy {convoy.pk} is already paused" in out and "Paused by ops" in out
    assert Event.objects.filter(kind="convoy.paused").count() == 1
    command("convoy", "resume", convoy.pk)
    assert f"○ Convoy {convoy.pk} is not paused" in command("convoy", "resume", convoy.pk)
    with pytest.raises(CommandError, match="reason: at most 500 characters"):
        command("convoy", "pause", convoy.pk, "--reason", "x" * 501)
    with pytest.raises(CommandError, match="convoy 'hq-cv-nope' not found"):
        command("convoy", "pause", "hq-cv-nope")
    convoys.close(convoy.pk, force=True)
    with pytest.raises(ServiceError, match="is closed: nothing to pause"):
        controls.pause(convoy.pk, actor="ops")
    assert not Convoy.objects.get(pk=convoy.pk).paused_at


def test_a_paused_staged_convoy_launches_nothing_until_resumed(routes):
    from convoys.services import staging
    from convoys.services.launch import launch_staged

    plan = staging.stage(chain(2), actor="test")
    controls.pause(plan.convoy_id, actor="ops")
    result = launch_staged(plan.convoy_id, force=True)
    assert result.dispatched == [] and hooked() == []
    controls.resume(plan.convoy_id, actor="ops")
    assert hooked() == ["gt-c0"]


# --- the web page and the API ---------------------------------------------------------------


def test_convoy_page_pause_and_resume_buttons(paused_chain):
    convoy = paused_chain
    viewer = signed_in("viewer", "view_convoy")
    page = viewer.get(f"/convoys/{convoy.pk}/").content.decode()
    assert "Paused by <strong>ops</strong>" in page and "db migration" in page
    assert "0 dispatches since pause" in page
    assert f"/convoys/{convoy.pk}/resume/" not in page  # no button without change_convoy
    assert viewer.post(f"/convoys/{convoy.pk}/resume/").status_code == 403
    assert Convoy.objects.get(pk=convoy.pk).paused_at

    editor = signed_in("editor", "view_convoy", "change_convoy")
    page = editor.get(f"/convoys/{convoy.pk}/").content.decode()
    assert f'action="/convoys/{convoy.pk}/resume/"' in page
    answer = editor.post(f"/convoys/{convoy.pk}/resume/")
    assert answer.status_code == 302
    assert hooked() == ["gt-c0"]  # nothing else is ready: gt-c1 waits on gt-c0
    convoy.refresh_from_db()
    assert convoy.paused_at is None
    page = editor.get(f"/convoys/{convoy.pk}/").content.decode()
    assert f'action="/convoys/{convoy.pk}/pause/"' in page
    editor.post(f"/convoys/{convoy.pk}/pause/", {"reason": "lunch"})
    convoy.refresh_from_db()
    assert (convoy.paused_by, convoy.pause_reason) == ("web:editor", "lunch")
    # A refusal: back to the page, which names what is wrong; nothing changed.
    refused = editor.post(f"/convoys/{convoy.pk}/pause/", {"reason": "y" * 501}, follow=True)
    assert refused.redirect_chain == [(f"/convoys/{convoy.pk}/", 302)]
    assert "reason" in [str(m) for m in refused.context["messages"]][-1]
    convoy.refresh_from_db()
    assert convoy.pause_reason == "lunch"
    assert editor.post("/convoys/hq-cv-nope/pause/").status_code == 404
    assert editor.get(f"/convoys/{convoy.pk}/pause/").status_code == 405


def test_api_pause_and_resume(paused_chain):
    convoy = paused_chain
    viewer = signed_in("viewer", "view_convoy")
    assert viewer.post(f"/api/convoys/{convoy.pk}/resume").status_code == 403
    editor = signed_in("editor", "view_convoy", "change_convoy")
    answer = editor.post(f"/api/convoys/{convoy.pk}/resume")
    assert answer.status_code == 200, answer.content
    assert answer.json()["changed"] is True
    assert answer.json()["dispatched"] == []  # gt-c1 waits on gt-c0, which is hooked
    answer = editor.post(
        f"/api/convoys/{convoy.pk}/pause", {"reason": "freeze"}, content_type="application/json"
    )
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["changed"] is True and body["paused"]["by"] == "editor"
    assert body["paused"]["reason"] == "freeze" and body["paused"]["dispatches_since"] == 0
    detail = editor.get(f"/api/convoys/{convoy.pk}").json()
    assert detail["paused"] == body["paused"]
    answer = editor.post(
        f"/api/convoys/{convoy.pk}/pause", {"reason": "z" * 501}, content_type="application/json"
    )
    assert answer.status_code == 422
    assert "at most 500 characters" in answer.content.decode()
    assert Convoy.objects.get(pk=convoy.pk).pause_reason == "freeze"
    answer = editor.post("/api/convoys/hq-cv-nope/pause", {}, content_type="application/json")
    assert answer.status_code == 404
    assert answer.json() == {"detail": "convoy 'hq-cv-nope' not found"}


def test_the_open_page_learns_of_a_pause_live(routes):
    """A pause from the CLI reaches an open convoy page: its live request answers the pause
    panel (the convoy.paused event names the convoy, so the page asks)."""
    convoy = launched(chain(2))
    editor = signed_in("editor", "view_convoy", "change_convoy")
    url = f"/convoys/{convoy.pk}/"
    before = editor.get(url, headers={"X-Live": "1"}).json()
    assert f'action="/convoys/{convoy.pk}/pause/"' in before["fragments"]["convoy-actions"]
    command("convoy", "pause", convoy.pk, "--reason", "hold", "--actor", "ops")
    since = str(before["seq"])
    after = editor.get(url, headers={"X-Live": "1", "X-Live-Since": since}).json()
    panel = after["fragments"]["convoy-pause"]
    assert panel.startswith('<div id="convoy-pause">') and "Paused by <strong>ops</strong>" in panel
    assert "0 dispatches since pause" in panel
    # The action bar offers no second pause.
    assert "/pause/" not in after["fragments"]["convoy-actions"]
