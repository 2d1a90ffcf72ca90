"""How each user hears about each kind: action needed and receipts, each
immediate (toast, browser notification, e-mail), in the app only, or for receipts a daily
digest e-mail; chosen on the Subscriptions page; users without an address get in-app only."""

from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail

from convoys.models import DeliveryPreference, Event, Notification
from convoys.services import beads, convoys, escalation, notify

from .support.factories import STUCK, bead, blocks, started
from .support.users import logged_in, viewer


@pytest.fixture
def fan(routes):
    """A viewer with an e-mail address, subscribed to every convoy (no "e-mail too")."""
    user = viewer("fan", "fan@example.com")
    notify.subscribe(user)
    return user


@pytest.fixture
def land(django_capture_on_commit_callbacks):
    """Create, close and land a one-bead convoy; run the e-mail tasks its commit queues."""
    made = []

    def go(title="Shipped"):
        bead_id = f"gt-l{len(made)}"
        bead(bead_id)
        with django_capture_on_commit_callbacks(execute=True):
            convoy = convoys.create(title, [bead_id])
            beads.close_bead(bead_id)
            convoys.check(convoy.pk)
        made.append(convoy)
        return Notification.objects.filter(convoy=convoy, kind="landed")

    return go


def test_the_subscriptions_page_sets_the_choices(fan):
    page = logged_in(fan)
    html = page.get("/subscriptions/").content.decode()
    assert 'name="receipts" value="in_app" checked' in html  # the defaults
    assert 'name="action_needed" value="immediate" checked' in html
    got = page.post(
        "/subscriptions/",
        {"do": "preferences", "receipts": "digest", "action_needed": "in_app"},
        follow=True,
    )
    assert "Saved how you hear about each kind." in got.content.decode()
    row = DeliveryPreference.objects.get(user=fan)
    assert (row.receipts, row.action_needed) == ("digest", "in_app")
    html = page.get("/subscriptions/").content.decode()
    assert 'name="receipts" value="digest" checked' in html
    # A value that is no choice is refused with one line, nothing changed.
    for hostile in ("sometimes", "digest\x00", "x" * 5000, "digest"):
        field = "action_needed" if hostile == "digest" else "receipts"  # no digest for actions
        got = page.post("/subscriptions/", {"do": "preferences", field: hostile}, follow=True)
        assert f"{field}: " in got.content.decode() and "is not one of" in got.content.decode()
    row.refresh_from_db()
    assert (row.receipts, row.action_needed) == ("digest", "in_app")


def test_receipts_in_the_app_by_default_immediately_with_an_e_mail_when_chosen(fan, land):
    notes = land()
    assert notes.get(user=fan).email_wanted is False and mail.outbox == []
    notify.set_preferences(fan, receipts="immediate")
    notes = land("Shipped again")
    assert notes.get(user=fan).emailed_at is not None
    assert [(m.to, m.subject) for m in mail.outbox] == [
        (["fan@example.com"], "🚚 Convoy landed: Shipped again")
    ]
    event = Event.objects.filter(kind="notification").last()
    assert event.data["user_id"] == fan.pk and "quiet" not in event.data  # toasted live


def test_a_user_without_an_address_gets_in_app_only(routes, land):
    nomail = viewer("nomail")
    notify.subscribe(nomail)
    notify.set_preferences(nomail, receipts="immediate")
    note = land().get(user=nomail)
    assert (note.email_wanted, note.digest) == (False, False) and mail.outbox == []
    notify.set_preferences(nomail, receipts="digest")
    note = land("Again").get(user=nomail)
    assert (note.email_wanted, note.digest) == (False, False)
    assert notify.send_digests(now=note.created_at + timedelta(days=2)) == 0


def test_action_needed_e_mails_by_default_and_not_in_app_only(
    routes, django_capture_on_commit_callbacks
):
    alice = viewer("alice", "alice@example.com")
    bob = viewer("bob", "bob@example.com")
    notify.set_preferences(bob, action_needed="in_app")
    bead("gt-gate", type="decision")
    bead("gt-w")
    blocks("gt-gate", "gt-w")
    convoy = convoys.create("Stuck", ["gt-w"], owner="alice")
    notify.subscribe(bob, convoy)
    with django_capture_on_commit_callbacks(execute=True):
        escalation.escalate_stuck(now=started(convoy) + STUCK)
    assert [m.to for m in mail.outbox] == [["alice@example.com"]]
    assert mail.outbox[0].subject == "⚠ Convoy stuck: Stuck"
    assert Notification.objects.filter(user__in=[alice, bob], kind="escalation").count() == 2
    events = Event.objects.filter(kind="notification")
    assert all(e.data["action_needed"] and "quiet" not in e.data for e in events)


def test_the_daily_digest_collects_receipts(fan, land, settings):
    settings.CONVOY_DIGEST_HOUR = 7
    notify.set_preferences(fan, receipts="digest")
    first = land("Alpha").get(user=fan)
    second = land("Beta").get(user=fan)
    assert (first.digest, first.email_wanted) == (True, False) and mail.outbox == []
    event = Event.objects.filter(kind="notification").last()
    assert event.data["quiet"] is True  # no toast, no browser notification

    # Move the receipts to a known time: 10:00 UTC; the digest goes at 07:00 the next day.
    day = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    Notification.objects.filter(pk__in=[first.pk, second.pk]).update(created_at=day)
    assert notify.send_digests(now=day + timedelta(hours=1)) == 0  # before the digest time
    assert notify.send_digests(now=day + timedelta(hours=20, minutes=59)) == 0
    at = day + timedelta(hours=21, minutes=2)  # 07:02 the next day
    assert notify.send_digests(now=at) == 1
    assert notify.send_digests(now=at) == 0  # a second cluster, or the next tick: nothing
    assert notify.send_digests(now=at + timedelta(hours=12)) == 0
    (message,) = mail.outbox
    assert message.to == ["fan@example.com"]
    assert message.subject == "🚚 convoyweb daily digest: 2 receipts"
    assert "🚚 Convoy landed: Alpha" in message.body and "🚚 Convoy landed: Beta" in message.body
    assert Notification.objects.filter(digested_at__isnull=True, digest=True).count() == 0

    # The inbox says where the receipt went.
    html = logged_in(fan).get("/inbox/").content.decode()
    assert "in the digest of 2026-12-02" in html

    # The next day's digest holds only what came after.
    third = land("Gamma").get(user=fan)
    Notification.objects.filter(pk=third.pk).update(created_at=at + timedelta(hours=3))
    assert notify.send_digests(now=at + timedelta(days=1)) == 1
    assert "Gamma" in mail.outbox[1].body and "Alpha" not in mail.outbox[1].body


def test_the_digest_job_is_on_the_cluster_schedule():
    from convoys.services import ticker

    assert ("digest", "convoys.tasks.send_digests", "CONVOY_DIGEST_INTERVAL") in ticker.jobs()
