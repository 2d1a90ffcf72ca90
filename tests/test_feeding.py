"""Feeder, catch-up, stranded scan and landing, with django-q2 in sync mode."""

import sys
from datetime import timedelta

from django.core import mail
from django.utils import timezone

from convoys.models import Bead, Convoy, Cursor, Dispatch, Event, Notification, Subscription, Worker
from convoys.services import beads, convoys, feeding, rigs, staging

from .support.factories import bead, blocks, chain, hooked, launched


def test_close_dispatches_the_next_ready_bead(routes, closing):
    ids = chain(3)
    launched(ids)
    assert hooked() == ["gt-c0"]
    closing("gt-c0")
    assert hooked() == ["gt-c1"]
    closing("gt-c1")
    closing("gt-c2")
    convoy = Convoy.objects.get()
    assert convoy.status == "closed" and convoy.close_reason == "All tracked issues completed"
    assert Dispatch.objects.filter(path="event").count() == 2


def _three_behind_a_root():
    bead("gt-root")
    for bead_id, priority in (("gt-x3", 2), ("gt-x1", 2), ("gt-x2", 1)):
        bead(bead_id, priority=priority)
        blocks("gt-root", bead_id)
    launched(["gt-root", "gt-x1", "gt-x2", "gt-x3"])


def test_a_close_dispatches_every_bead_it_made_ready(routes, closing):
    _three_behind_a_root()
    closing("gt-root")
    assert hooked() == ["gt-x1", "gt-x2", "gt-x3"]
    dispatched = Event.objects.filter(kind="bead.dispatched", data__path="event").order_by("seq")
    assert [e.bead_id for e in dispatched] == ["gt-x2", "gt-x1", "gt-x3"]  # (priority, id)


def test_feed_one_dispatches_one_per_close_in_priority_then_id_order(routes, closing, settings):
    settings.CONVOY_FEED = "ONE"  # the original's feeding
    _three_behind_a_root()
    closing("gt-root")
    assert hooked() == ["gt-x2"]


def test_max_in_flight_tops_up(routes, closing):
    bead("gt-root")
    for i in range(4):
        bead(f"gt-y{i}")
        blocks("gt-root", f"gt-y{i}")
    convoy = launched(["gt-root", *[f"gt-y{i}" for i in range(4)]])
    Convoy.objects.filter(pk=convoy.pk).update(max_in_flight=3)
    closing("gt-root")
    assert hooked() == ["gt-y0", "gt-y1", "gt-y2"]


def test_staged_and_closed_convoys_are_not_fed(routes, closing):
    ids = chain(2)
    staging.stage(ids, actor="test")
    closing("gt-c0")
    assert hooked() == []


def test_failed_dispatch_iterates_cools_down_and_releases(routes, closing, settings, tmp_path):
    script = tmp_path / "d.py"
    script.write_text("import sys\nsys.exit(1 if sys.argv[1] == 'gt-f1' else 0)\n")
    settings.CONVOY_DISPATCHER = "command"
    settings.CONVOY_DISPATCH_COMMAND = f"{sys.executable} {script} {{bead}}"
    bead("gt-root")
    for bead_id in ("gt-f1", "gt-f2"):
        bead(bead_id)
        blocks("gt-root", bead_id)
    launched(["gt-root", "gt-f1", "gt-f2"])
    closing("gt-root")
    assert hooked() == ["gt-f2"]
    assert Bead.objects.get(pk="gt-f1").status == "open"
    assert Dispatch.objects.get(bead_id="gt-f1").ok is False
    feeding.stranded_scan()  # gt-f1 is cooling down: not retried yet
    assert Dispatch.objects.filter(bead_id="gt-f1").count() == 1
    Dispatch.objects.filter(bead_id="gt-f1").update(
        created_at=timezone.now() - timedelta(minutes=2)
    )
    settings.CONVOY_DISPATCH_COMMAND = f"{sys.executable} -c pass"
    feeding.stranded_scan()
    assert Dispatch.objects.filter(bead_id="gt-f1").count() == 2
    assert Bead.objects.get(pk="gt-f1").status == "hooked"


def test_close_event_is_handled_once_and_again_after_reopen(routes, closing, settings):
    settings.CONVOY_FEED = "ONE"  # each close feeds one: the second close is seen to feed
    bead("gt-root")
    for bead_id in ("gt-z1", "gt-z2"):
        bead(bead_id)
        blocks("gt-root", bead_id)
    launched(["gt-root", "gt-z1", "gt-z2"])
    closing("gt-root")
    seq = Event.objects.get(kind="bead.closed", bead_id="gt-root").seq
    assert feeding.handle_close_event(seq) == {"seq": seq, "skipped": "already handled"}
    assert hooked() == ["gt-z1"]
    beads.reopen_bead("gt-root")
    closing("gt-root")  # a new close event: handled again
    assert hooked() == ["gt-z1", "gt-z2"]


def test_catch_up_seeds_then_handles_missed_closes(routes):
    ids = chain(3)
    launched(ids)
    beads.close_bead("gt-c0")  # on_commit never runs here: the event task is "lost"
    assert feeding.catch_up() == {"seeded": Event.objects.latest("seq").seq}
    assert hooked() == []  # history is not replayed on a fresh mark
    beads.close_bead("gt-c1")  # ... lost again
    result = feeding.catch_up()
    assert len(result["handled"]) == 1 and hooked() == ["gt-c2"]
    position = Cursor.objects.get(name="close-feeder").position
    assert feeding.catch_up()["handled"] == []
    assert Cursor.objects.get(name="close-feeder").position >= position


def test_stranded_scan_feeds_one_per_convoy_per_scan(routes):
    for i in range(3):
        bead(f"gt-s{i}")
    convoys.create("Idle", [f"gt-s{i}" for i in range(3)])
    assert feeding.stranded_scan()["dispatched"] == ["gt-s0"]
    assert feeding.stranded_scan()["dispatched"] == ["gt-s1"]
    assert Event.objects.filter(kind="stranded.found").count() == 2


def test_stranded_scan_empty_convoys_grace_and_no_notification(routes, settings):
    user = __import__("django.contrib.auth.models", fromlist=["User"]).User.objects.create(
        username="sub"
    )
    Subscription.objects.create(user=user)
    young = convoys.create("Young")
    old = convoys.create("Old")
    Convoy.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(minutes=6))
    result = feeding.stranded_scan()
    assert result["closed_empty"] == [old.pk]
    old.refresh_from_db()
    assert old.close_reason == "Empty convoy (0 tracked issues)"
    assert Convoy.objects.get(pk=young.pk).status == "open"
    assert Notification.objects.count() == 0


def test_dead_worker_work_is_rescued_and_parked_rigs_skipped(routes, settings):
    bead("gt-w")
    convoys.create("W", ["gt-w"])
    feeding.stranded_scan()
    worker = Bead.objects.get(pk="gt-w").assignee
    assert feeding.stranded_scan()["dispatched"] == []
    Worker.objects.filter(pk=worker).update(last_seen=timezone.now() - timedelta(minutes=11))
    assert feeding.stranded_scan()["dispatched"] == ["gt-w"]
    assert Bead.objects.get(pk="gt-w").assignee != worker
    bead("gt-p")
    convoys.create("P", ["gt-p"])
    rigs.set_rig_state("gastown", "parked")
    assert "gt-p" not in feeding.stranded_scan()["dispatched"]


def test_spin_event_after_more_than_three_dispatches_in_an_hour(routes):
    bead("gt-spin")
    convoy = convoys.create("Spin", ["gt-spin"])
    for _ in range(4):
        feeding.stranded_scan()
        Bead.objects.filter(pk="gt-spin").update(status="open", assignee="")
    assert Event.objects.filter(kind="spin", bead_id="gt-spin", convoy_id=convoy.pk).exists()


def test_landing_notifies_owner_notify_and_subscribers_once(routes, settings, closing):
    from django.contrib.auth.models import Permission, User

    viewing = Permission.objects.get(codename="view_convoy")  # the report goes to viewers only
    User.objects.create(username="owner", email="owner@example.com").user_permissions.add(viewing)
    fan = User.objects.create(username="fan", email="fan@example.com")
    fan.user_permissions.add(viewing)
    Subscription.objects.create(user=fan, email=True)
    bead("gt-l1", "Land me")
    convoy = convoys.create("Landing", ["gt-l1"], owner="owner", notify="ops@example.com")
    closing("gt-l1")
    notes = Notification.objects.filter(convoy=convoy)
    assert sorted((n.user.username if n.user else n.address) for n in notes) == [
        "fan",
        "ops@example.com",
        "owner",
    ]
    note = notes.get(user=fan)
    assert note.subject == "🚚 Convoy landed: Landing"
    assert "✓ gt-l1  Land me" in note.body and "Duration: " in note.body
    assert sorted(m.to[0] for m in mail.outbox) == ["fan@example.com", "ops@example.com"]
    convoys.check(convoy.pk)  # already closed: a second check sends nothing more
    assert Notification.objects.filter(convoy=convoy).count() == 3
    bead("gt-l2")
    convoys.add(convoy.pk, ["gt-l2"])  # reopen clears the stamp: landing again notifies again
    closing("gt-l2")
    assert Notification.objects.filter(convoy=convoy).count() == 6


def test_feed_once_command(routes):
    from io import StringIO

    from django.core.management import call_command

    bead("gt-k")
    convoys.create("K", ["gt-k"])
    out = StringIO()
    call_command("convoy", "feed", "--once", stdout=out)
    assert "seeded the high-water mark" in out.getvalue() and "dispatched gt-k" in out.getvalue()


def test_heartbeat_command_keeps_a_worker_alive(routes):
    from io import StringIO

    from django.core.management import call_command

    call_command("beads", "heartbeat", "gastown/polecats/nux", stdout=StringIO())
    assert Worker.objects.get(pk="gastown/polecats/nux").last_seen > timezone.now() - timedelta(
        seconds=5
    )
