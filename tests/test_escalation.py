"""Escalation that stops when acknowledged: a convoy with no progress for
CONVOY_STUCK_AFTER raises one action-needed notification naming its causes, again after
CONVOY_REESCALATE_AFTER at most twice, never to someone who may not view it; the convoy page's
and the inbox's button, `convoy ack` and the API stop it; progress starts afresh. Time is
passed to the service (`now`), never slept."""

import json
import sys
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError

from convoys import tasks
from convoys.models import Escalation, Event, Notification, Subscription
from convoys.services import beads, convoys, escalation, notify
from convoys.services.errors import ServiceError

from .support.factories import STUCK, bead, blocks, command, started
from .support.pages import needs_emoji_font
from .support.users import logged_in, viewer

AGAIN = timedelta(hours=4)


@pytest.fixture
def people(db):
    return {
        "alice": viewer("alice", "alice@example.com"),  # the owner
        "watcher": viewer("watcher"),  # a subscriber without an e-mail address
        "outsider": User.objects.create_user("outsider", email="out@example.com"),  # no rights
    }


@pytest.fixture
def stuck(routes, people):
    """A convoy whose one bead waits on an open decision: nothing can move."""
    bead("gt-gate", "Pick a database", type="decision")
    bead("gt-w", "Migrate")
    blocks("gt-gate", "gt-w")
    convoy = convoys.create("Stuck work", ["gt-w"], owner="alice")
    notify.subscribe(people["watcher"], convoy)
    Subscription.objects.create(user=people["outsider"], convoy=convoy, email=True)
    return convoy


def escalations(convoy=None):
    notes = Notification.objects.filter(kind=Notification.ESCALATION)
    return notes.filter(convoy=convoy) if convoy else notes


def recipients(notes):
    return sorted(n.user.username for n in notes)


def test_a_stuck_convoy_escalates_once_then_twice_more_at_most(stuck):
    start = started(stuck)
    assert escalation.escalate_stuck(now=start + STUCK - timedelta(seconds=1)) == []

    sent = escalation.escalate_stuck(now=start + STUCK)
    assert [(s["id"], s["escalation"]) for s in sent] == [(stuck.pk, 1)]
    notes = escalations(stuck)
    # the owner and the subscriber; the subscriber who may not view convoys gets nothing
    assert recipients(notes) == ["alice", "watcher"]
    note = notes.get(user__username="alice")
    assert note.subject == "⚠ Convoy stuck: Stuck work"
    assert "made no progress for 30m" in note.body
    assert "gt-w (gated): gated by gt-gate" in note.body  # the cause, named
    assert f"convoy ack {stuck.pk}" in note.body
    assert Event.objects.filter(kind="convoy.escalated", convoy_id=stuck.pk).count() == 1

    # Once within the window, however often the scan runs.
    for minutes in (0, 1, 30, 239):
        assert escalation.escalate_stuck(now=start + STUCK + timedelta(minutes=minutes)) == []
    assert escalations(stuck).count() == 2

    # Unacknowledged: again after the window, twice at most.
    second = escalation.escalate_stuck(now=start + STUCK + AGAIN)
    assert [s["escalation"] for s in second] == [2]
    assert escalation.escalate_stuck(now=start + STUCK + AGAIN + timedelta(hours=1)) == []
    third = escalation.escalate_stuck(now=start + STUCK + 2 * AGAIN)
    assert [s["escalation"] for s in third] == [3]
    for later in (3, 4, 10, 100):
        assert escalation.escalate_stuck(now=start + STUCK + later * AGAIN) == []
    subjects = [n.subject for n in escalations(stuck).filter(user__username="alice").order_by("id")]
    assert subjects == [
        "⚠ Convoy stuck: Stuck work",
        "⚠ Convoy still stuck (notice 2 of 3): Stuck work",
        "⚠ Convoy still stuck (notice 3 of 3): Stuck work",
    ]
    assert "This is the last notice (3 of 3)." in escalations(stuck).order_by("id").last().body
    assert not Notification.objects.filter(user__username="outsider").exists()


def test_the_thresholds_are_settings(stuck, settings):
    settings.CONVOY_STUCK_AFTER = 60
    settings.CONVOY_REESCALATE_AFTER = 120
    start = started(stuck)
    assert [s["escalation"] for s in escalation.escalate_stuck(start + timedelta(seconds=60))] == [
        1
    ]
    assert escalation.escalate_stuck(start + timedelta(seconds=179)) == []
    assert [s["escalation"] for s in escalation.escalate_stuck(start + timedelta(seconds=180))] == [
        2
    ]


def test_progress_resets_the_escalation(stuck):
    start = started(stuck)
    escalation.escalate_stuck(now=start + STUCK)
    assert escalations(stuck).count() == 2
    # Progress: the gate is decided, gt-w dispatched (a `bead.dispatched` event) and closed.
    bead("gt-w2", "Verify")
    convoys.add(stuck.pk, ["gt-w2"])
    beads.close_bead("gt-gate", reason="postgres")
    command("convoy", "feed", "--once")  # the stranded scan dispatches gt-w
    moved = Event.objects.filter(kind="bead.dispatched", bead_id="gt-w").get().created_at
    found = escalation.state(stuck)
    assert not found.current  # the page no longer shows it; nothing to acknowledge
    with pytest.raises(ServiceError, match=f"convoy {stuck.pk} is not escalated"):
        escalation.acknowledge(stuck.pk, actor="cli")
    # No further reminder for the old stall ...
    assert escalation.escalate_stuck(now=moved + STUCK - timedelta(seconds=1)) == []
    # ... but a new stall is escalated afresh, as the first of three.
    sent = escalation.escalate_stuck(now=moved + STUCK)
    assert [s["escalation"] for s in sent] == [1]
    # (its worker went silent meanwhile, and nothing took gt-w2: named per bead)
    assert sent[0]["causes"] == [
        "1 dead worker, 1 ready",
        "gt-w (dead worker): gastown/polecats/nux went silent: a stranded scan rescues it (one bead per convoy per scan)",
        "gt-w2 (ready): the next feed takes it",
    ]
    row = Escalation.objects.get(pk=stuck.pk)
    assert (row.count, row.progress_at) == (1, moved)


def test_acknowledge_from_the_cli_stops_it(stuck):
    start = started(stuck)
    with pytest.raises(CommandError, match=f"convoy {stuck.pk} is not escalated"):
        command("convoy", "ack", stuck.pk)
    escalation.escalate_stuck(now=start + STUCK)
    out = command("convoy", "ack", stuck.pk, "--actor", "ops")
    assert f"✓ Acknowledged convoy 🚚 {stuck.pk}" in out
    again = command("convoy", "ack", stuck.pk)
    assert f"○ Convoy {stuck.pk} was already acknowledged by ops" in again
    for later in (1, 2, 3):
        assert escalation.escalate_stuck(now=start + STUCK + later * AGAIN) == []
    assert escalations(stuck).count() == 2
    assert not escalations(stuck).filter(read_at__isnull=True).exists()  # handled: read
    event = Event.objects.get(kind="convoy.acknowledged")
    assert (event.convoy_id, event.actor) == (stuck.pk, "ops")
    status = command("convoy", "status", stuck.pk)
    assert "⏰ Stuck since" in status and "acknowledged by ops" in status
    data = json.loads(command("convoy", "status", stuck.pk, "--json"))
    assert data["escalation"]["acknowledged_by"] == "ops"
    assert data["escalation"]["escalations"] == 1
    with pytest.raises(CommandError, match="convoy 'hq-cv-nope' not found"):
        command("convoy", "ack", "hq-cv-nope")
    for hostile, why in (("hq-\x00x", "NUL"), ("\ud800", "lone surrogate")):
        with pytest.raises(CommandError, match=f"convoy id contains a {why}"):
            command("convoy", "ack", hostile)
    with pytest.raises(CommandError, match="not found"):
        command("convoy", "ack", "x" * 5000)
    assert Escalation.objects.get(pk=stuck.pk).acknowledged_by == "ops"  # unchanged


def test_acknowledge_from_the_api_stops_it(stuck, people):
    escalation.escalate_stuck(now=started(stuck) + STUCK)
    api = logged_in(people["watcher"])
    got = api.post(f"/api/convoys/{stuck.pk}/ack", content_type="application/json")
    assert got.status_code == 200, got.content
    body = got.json()
    assert body["changed"] is True and body["escalation"]["acknowledged_by"] == "api:watcher"
    again = api.post(f"/api/convoys/{stuck.pk}/ack", content_type="application/json")
    assert again.json()["changed"] is False
    detail = api.get(f"/api/convoys/{stuck.pk}").json()["escalation"]
    assert detail["current"] and detail["acknowledged_by"] == "api:watcher"
    assert detail["causes"] == ["1 gated", "gt-w (gated): gated by gt-gate"]
    assert escalation.escalate_stuck(now=started(stuck) + STUCK + AGAIN) == []
    # Who may not view convoys may not acknowledge; a missing convoy is a 404.
    refused = logged_in(people["outsider"]).post(f"/api/convoys/{stuck.pk}/ack")
    assert refused.status_code == 403
    missing = api.post("/api/convoys/hq-cv-nope/ack")
    assert missing.status_code == 404


def test_acknowledge_from_the_inbox_and_the_convoy_page(stuck, people):
    alice = logged_in(people["alice"])
    bead("gt-r", "Quick")
    landed = convoys.create("Done already", ["gt-r"], owner="alice")
    beads.close_bead("gt-r", reason="done")
    convoys.check(landed.pk)
    escalation.escalate_stuck(now=started(stuck) + STUCK)

    inbox = alice.get("/inbox/").content.decode()
    action, receipts = inbox.split('id="inbox-receipts"')
    assert "⚠ Action needed" in action and "⚠ Convoy stuck: Stuck work" in action
    assert f'action="/convoys/{stuck.pk}/ack/"' in action
    assert "Convoy landed: Done already" in receipts and "Stuck work" not in receipts
    page = alice.get(f"/convoys/{stuck.pk}/").content.decode()
    assert "⚠ Stuck: no progress since" in page and "gt-w (gated): gated by gt-gate" in page
    assert f'action="/convoys/{stuck.pk}/ack/"' in page
    assert needs_emoji_font(inbox) == [] and needs_emoji_font(page) == []  # no blank boxes

    got = alice.post(f"/convoys/{stuck.pk}/ack/", {"next": "/inbox/"})
    assert (got.status_code, got["Location"]) == (302, "/inbox/")
    inbox = alice.get("/inbox/").content.decode()
    assert f'action="/convoys/{stuck.pk}/ack/"' not in inbox
    assert "acknowledged by web:alice" in inbox
    page = alice.get(f"/convoys/{stuck.pk}/").content.decode()
    assert "Acknowledged by web:alice" in page and f"/convoys/{stuck.pk}/ack/" not in page
    assert escalation.escalate_stuck(now=started(stuck) + STUCK + AGAIN) == []

    # The convoy page's button, on a second stuck convoy; an off-site `next` is ignored.
    bead("gt-w3", "Also gated")
    blocks("gt-gate", "gt-w3")
    other = convoys.create("Also stuck", ["gt-w3"], owner="alice")
    escalation.escalate_stuck(now=started(other) + STUCK)
    got = alice.post(f"/convoys/{other.pk}/ack/", {"next": "https://evil.example/"})
    assert (got.status_code, got["Location"]) == (302, f"/convoys/{other.pk}/")
    assert Escalation.objects.get(pk=other.pk).acknowledged_by == "web:alice"
    # Not escalated: back to the page, which says why; nothing changed.
    bead("gt-calm")
    calm = convoys.create("Calm", ["gt-calm"], owner="alice")
    refused = alice.post(f"/convoys/{calm.pk}/ack/", follow=True)
    assert refused.redirect_chain == [(f"/convoys/{calm.pk}/", 302)]
    assert "is not escalated" in refused.content.decode()
    assert not Escalation.objects.filter(pk=calm.pk).exists()


def test_claims_are_single_under_two_scanners(stuck):
    """Two clusters scanning at once: each step is one conditional write, so a scan that
    read the same state a moment later sends nothing."""
    now = started(stuck) + STUCK
    since = escalation.last_progress([stuck])[stuck.pk]
    assert escalation._claim(stuck, since, None, True, ["x"], now) == 1
    assert escalation._claim(stuck, since, None, True, ["x"], now) == 0  # the row exists
    stale = Escalation.objects.get(pk=stuck.pk)
    later = now + AGAIN
    assert escalation._claim(stuck, since, stale, False, ["x"], later) == 2
    assert escalation._claim(stuck, since, stale, False, ["x"], later) == 0  # it moved on
    assert Escalation.objects.get(pk=stuck.pk).count == 2


def test_the_periodic_scan_task_escalates(stuck, settings):
    """The cluster's stranded-scan task (scheduled by the ticker) runs the check."""
    settings.CONVOY_STUCK_AFTER = 0
    summary = tasks.stranded_scan()
    assert [s["id"] for s in summary["escalated"]] == [stuck.pk]
    assert tasks.stranded_scan()["escalated"] == []
    out = command("convoy", "feed", "--once", "--json")
    assert json.loads(out)["escalated"] == []


def test_done_empty_and_staged_convoys_are_not_escalated(routes, people):
    bead("gt-d")
    done = convoys.create("Done", ["gt-d"], owner="alice")
    beads.close_bead("gt-d")  # complete, waiting for the scan to land it
    empty = convoys.create("Empty", [], owner="alice")
    later = max(started(done), started(empty)) + STUCK
    assert escalation.escalate_stuck(now=later) == []
    assert not escalations().exists()


def test_the_notification_names_each_beads_cause(stuck, people):
    """The causes come from convoys/rules/causes.py, one per unfinished bead, in its order."""
    bead("gt-x", "Outside work")
    bead("gt-b", "Needs outside work")
    blocks("gt-x", "gt-b")
    convoys.add(stuck.pk, ["gt-b", "gt-gone"])  # gt-gone is in no store
    sent = escalation.escalate_stuck(now=started(stuck) + STUCK)
    assert sent[0]["causes"] == [
        "1 unknown, 1 blocked, 1 gated",
        "gt-gone (unknown): not in the store",
        "gt-b (blocked): blocked by gt-x",
        "gt-w (gated): gated by gt-gate",
    ]
    # A paused convoy is stuck too, and says who paused it and why.
    bead("gt-p", "Paused work")
    paused = convoys.create("On hold", ["gt-p"], owner="alice")
    command("convoy", "pause", paused.pk, "--reason", "db migration", "--actor", "ops")
    sent = escalation.escalate_stuck(now=started(paused) + STUCK)
    assert [s["causes"] for s in sent if s["id"] == paused.pk] == [
        ["1 paused", f"gt-p (paused): convoy {paused.pk} paused by ops: db migration"]
    ]


def test_the_scan_costs_the_same_queries_whatever_the_size(routes, people):
    """The check runs every stranded scan: when nothing is due it is four queries (the
    open convoys, their progress in two aggregates, their escalation rows), for 2 or 40
    convoys alike; escalating loads the causes of every due convoy at once."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def scan_cost(count, beads_each, prefix):
        made = []
        for c in range(count):
            ids = [bead(f"gt-{prefix}{c}x{b}").id for b in range(beads_each)]
            made.append(convoys.create(f"{prefix}{c}", ids))
        at = max(started(c) for c in made) + STUCK
        assert len(escalation.escalate_stuck(now=at)) == count
        with CaptureQueriesContext(connection) as queries:
            assert escalation.escalate_stuck(now=at + timedelta(minutes=1)) == []
        return len(queries)

    assert scan_cost(2, 2, "s") == 4
    assert scan_cost(40, 5, "m") == 4


def test_a_failed_dispatch_is_no_progress(routes, people, settings, tmp_path):
    """Dispatches that fail (a `dispatch.failed` follows) leave the clock running; the one
    that succeeds restarts it."""
    script = tmp_path / "dispatch.py"
    broken = tmp_path / "broken"
    broken.write_text("")
    script.write_text(f"import os, sys\nsys.exit(1 if os.path.exists({str(broken)!r}) else 0)\n")
    settings.CONVOY_DISPATCHER = "command"
    settings.CONVOY_DISPATCH_COMMAND = f"{sys.executable} {script} {{bead}}"
    settings.CONVOY_RETRY_COOLDOWN = 0
    settings.CONVOY_MAX_DISPATCH_FAILURES = 100  # no breaker: it would stop the retries
    bead("gt-f", "Flaky")
    convoy = convoys.create("Failing", ["gt-f"], owner="alice")
    start = started(convoy)
    for _ in range(3):
        command("convoy", "feed", "--once")
    assert Event.objects.filter(kind="dispatch.failed", bead_id="gt-f").count() == 3
    assert escalation.last_progress([convoy])[convoy.pk] == start
    assert [s["id"] for s in escalation.escalate_stuck(now=start + STUCK)] == [convoy.pk]
    broken.unlink()
    command("convoy", "feed", "--once")
    good = Event.objects.filter(kind="bead.dispatched", bead_id="gt-f").last()
    assert escalation.last_progress([convoy])[convoy.pk] == good.created_at
