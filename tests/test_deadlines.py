"""Deadlines: a convoy's due time against its forecast, told once when it becomes at risk and
once when overdue, re-armed when back on track; the forecast's spread."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management.base import CommandError
from django.db.models import F
from django.utils import timezone
from standardwebhooks import Webhook

from convoys.core import forecast
from convoys.models import Bead, Convoy, Dispatch, Event, Notification
from convoys.rules import forecasting
from convoys.services import convoys, deadlines, hooks, notify

from .support.factories import bead, blocks, command, launched
from .support.users import logged_in, user_with, viewer

HOUR = 3600.0


# --- the forecast (pure) --------------------------------------------------------------------------
def test_the_forecast_is_the_same_for_the_same_samples_in_any_order():
    now = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    a = forecast.forecast([HOUR, 2 * HOUR, 3 * HOUR, 10 * HOUR], 3, now, "hq-cv-1")
    b = forecast.forecast([10 * HOUR, 3 * HOUR, HOUR, 2 * HOUR], 3, now, "hq-cv-1")
    assert a == b and a is not None
    assert now + timedelta(hours=3) <= a.p50 <= a.p90 <= now + timedelta(hours=30)
    assert forecast.forecast([], 3, now) is None and forecast.forecast([HOUR], 0, now) is None


def test_a_chain_of_equal_beads_lands_exactly_and_the_spread_grows_with_variance():
    now = datetime(2026, 12, 7, tzinfo=UTC)
    fixed = forecast.forecast([HOUR] * 5, 4, now)
    assert fixed.p50 == fixed.p90 == now + timedelta(hours=4)
    varied = forecast.forecast([0.5 * HOUR, HOUR, 1.5 * HOUR, 4 * HOUR], 4, now)
    assert varied.p90 > varied.p50


def test_a_convoy_with_fewer_than_three_bead_times_draws_from_its_rigs():
    def unread():
        raise AssertionError("the rigs' times are read only when the convoy's own are too few")

    assert forecast.pool([HOUR] * 3, unread) == ([HOUR] * 3, True)
    assert forecast.pool([60.0, 60.0], lambda: [HOUR, 9 * HOUR]) == ([HOUR, 9 * HOUR], False)


@pytest.mark.parametrize(
    ("critical", "remaining", "width", "steps"),
    [(3, 10, None, 3), (3, 10, 2, 5), (6, 10, 4, 6), (0, 0, 2, 0), (0, 1, None, 1)],
)
def test_steps_left_take_the_critical_path_or_the_width(critical, remaining, width, steps):
    assert forecast.steps_left(critical, remaining, width) == steps


def test_deadline_states():
    now = datetime(2026, 12, 7, 12, tzinfo=UTC)
    soon = forecast.forecast([HOUR], 2, now)  # lands at 14:00
    assert forecast.deadline_state(None, now, soon, None) == ""
    assert forecast.deadline_state(now + timedelta(hours=3), now, soon, None) == "on-track"
    assert forecast.deadline_state(now + timedelta(hours=1), now, soon, None) == "at-risk"
    assert forecast.deadline_state(now - timedelta(minutes=1), now, soon, None) == "overdue"
    assert forecast.deadline_state(now + timedelta(hours=1), now, None, None) == "on-track"
    landed = now - timedelta(hours=1)
    assert forecast.deadline_state(now, now, None, landed) == "landed-on-time"
    assert forecast.deadline_state(landed - timedelta(hours=1), now, None, landed) == "landed-late"


# --- a convoy made late by a stalled bead -------------------------------------------------------
def chain_with_history(closing, n=5, closed=3, hours=1.0):
    """A launched chain of `n` beads whose first `closed` each took `hours` from dispatch to
    close: the forecast's samples."""
    ids = [bead(f"gt-d{i}").id for i in range(n)]
    for a, b in zip(ids, ids[1:], strict=False):
        blocks(a, b)
    convoy = launched(ids)
    for bead_id in ids[:closed]:
        closing(bead_id)
    now = timezone.now()
    Dispatch.objects.filter(bead_id__in=ids[:closed]).update(
        created_at=F("created_at") - timedelta(hours=hours)
    )
    Bead.objects.filter(pk__in=ids[:closed]).update(closed_at=now)
    return Convoy.objects.get(pk=convoy.pk), ids


def test_a_convoy_made_late_becomes_at_risk_once_then_overdue_and_back_on_track_re_arms(
    routes, closing
):
    convoy, _ = chain_with_history(closing)
    convoy.owner = "alice"
    convoy.save()
    user_with("alice", "view_convoy")
    now = timezone.now()
    convoys.update_fields(convoy.pk, due_at=now + timedelta(minutes=30), actor="test")
    state, found = forecasting.deadline_of(Convoy.objects.get(pk=convoy.pk), now)
    assert state == "at-risk" and found is not None and found.steps == 2
    assert [t.state for t in deadlines.check(now)] == ["at-risk"]
    assert deadlines.check(now) == []  # told once
    notice = Notification.objects.get(kind="at_risk", convoy_id=convoy.pk)
    assert notice.action_needed and notice.subject.startswith("⏰ Convoy at risk: ")
    assert "its forecast lands after that" in notice.body and "nine times in ten" in notice.body
    assert Event.objects.filter(kind="convoy.at_risk", convoy_id=convoy.pk).count() == 1

    later = now + timedelta(hours=1)  # past due, not landed
    assert [t.state for t in deadlines.check(later)] == ["overdue"]
    assert deadlines.check(later) == []
    assert Notification.objects.filter(kind="overdue", convoy_id=convoy.pk).count() == 1

    convoys.update_fields(convoy.pk, due_at=now + timedelta(days=2), actor="test")
    assert Convoy.objects.get(pk=convoy.pk).deadline == ""  # a new due time: told afresh
    Convoy.objects.filter(pk=convoy.pk).update(deadline="at-risk")
    assert [t.state for t in deadlines.check(now)] == ["on-track"]  # re-armed
    assert Event.objects.filter(kind="convoy.on_track", convoy_id=convoy.pk).count() == 1
    convoys.update_fields(convoy.pk, due_at=now + timedelta(minutes=30), actor="test")
    assert [t.state for t in deadlines.check(now)] == ["at-risk"]
    assert Notification.objects.filter(kind="at_risk", convoy_id=convoy.pk).count() == 2


def test_a_convoy_on_track_is_not_told_and_one_without_a_forecast_is_on_track(routes, closing):
    convoy, _ = chain_with_history(closing)
    now = timezone.now()
    convoys.update_fields(convoy.pk, due_at=now + timedelta(days=3), actor="test")
    assert deadlines.check(now) == []
    bead("zz-new")  # no rig: no times of its own or of its rigs to draw from
    fresh = convoys.create("Fresh", ["zz-new"], due=now + timedelta(hours=1))
    assert forecasting.deadline_of(fresh, now) == ("on-track", None)
    bead("gt-new")  # its rig's beads took an hour each: due in an hour is at risk
    rigged = convoys.create("Rigged", ["gt-new"], due=now + timedelta(hours=1))
    assert forecasting.deadline_of(rigged, now)[0] == "at-risk"
    assert not Notification.objects.filter(kind__in=["at_risk", "overdue"]).exists()


def test_the_daily_digest_lists_convoys_at_risk_and_overdue(routes, closing, settings):
    convoy, _ = chain_with_history(closing)
    now = timezone.now()
    convoys.update_fields(convoy.pk, due_at=now + timedelta(minutes=30), actor="test")
    deadlines.check(now)
    late = convoys.create("Late one", [], due=now - timedelta(hours=2))
    lines = notify.deadline_lines(now)
    assert any(convoy.pk in line and "at risk" in line for line in lines)
    assert any(late.pk in line and "overdue" in line for line in lines)


# --- where people see and set it ---------------------------------------------------------------
def test_the_command_line_sets_shows_and_lists_due_times(routes, closing):
    convoy, _ = chain_with_history(closing)
    out = command("convoy", "update", convoy.pk, "--due", "2026-12-24T17:00Z")
    assert "Due: 2026-12-24 17:00 UTC" in out
    assert Convoy.objects.get(pk=convoy.pk).due_at == datetime(2026, 12, 24, 17, tzinfo=UTC)
    status = command("convoy", "status", convoy.pk)
    assert "  Due: 2026-12-24 17:00 UTC · " in status
    data = json.loads(command("convoy", "status", convoy.pk, "--json"))
    assert data["deadline"]["due_at"] == "2026-12-24T17:00:00+00:00"
    soon = (timezone.now() + timedelta(minutes=20)).isoformat()
    command("convoy", "update", convoy.pk, "--due", soon)
    deadlines.check()
    listed = command("convoy", "list", "--at-risk")
    assert convoy.pk in listed and "at risk" in listed
    assert "No convoys overdue." in command("convoy", "stranded", "--overdue")
    past = json.loads(
        command("convoy", "create", "Was due", "--due", "2026-01-01T00:00Z", "--json")
    )
    overdue = json.loads(command("convoy", "stranded", "--overdue", "--json"))
    assert [row["id"] for row in overdue] == [past["id"]] and overdue[0]["state"] == "overdue"
    assert "No due time" in command("convoy", "update", convoy.pk, "--no-due")


@pytest.mark.parametrize(
    ("due", "message"),
    [
        ("tomorrow", "'tomorrow' is not a time like 2026-12-24T17:00Z"),
        ("2026-12-24T17:00", "has no time zone: end it with Z or an offset"),
        ("2026-12-24", "'2026-12-24' names a day but no time: say 2026-12-24T17:00Z"),
    ],
)
def test_a_bad_due_time_is_one_line_and_changes_nothing(routes, due, message):
    bead("gt-a")
    with pytest.raises(CommandError, match=message):
        command("convoy", "create", "Nope", "gt-a", "--due", due)
    with pytest.raises(CommandError, match=message):
        command("convoy", "stage", "gt-a", "--due", due)
    assert not Convoy.objects.exists()


def test_update_refuses_an_empty_due_time_and_keeps_the_one_set(routes):
    bead("gt-a")
    convoy = convoys.create("Due", ["gt-a"], due=timezone.now() + timedelta(days=1))
    for due, message in (("", "--due is empty: --no-due removes"), ("2026-12-24", "no time")):
        with pytest.raises(CommandError, match=message):
            command("convoy", "update", convoy.pk, "--due", due)
    assert Convoy.objects.get(pk=convoy.pk).due_at == convoy.due_at


def test_the_convoy_page_and_dashboard_say_the_deadline(routes, closing):
    convoy, _ = chain_with_history(closing)
    now = timezone.now()
    convoys.update_fields(convoy.pk, due_at=now + timedelta(minutes=30), actor="test")
    deadlines.check(now)
    client = logged_in(viewer("vera"))
    page = client.get(f"/convoys/{convoy.pk}/").content.decode()
    assert 'class="tag deadline at-risk" id="deadline"' in page
    assert 'id="deadline-words">Due <time' in page and "at risk: the forecast lands" in page
    assert "nine times in ten by" in page
    bead("gt-other")
    other = convoys.create("No due", ["gt-other"])
    board = client.get("/?deadline=at-risk").content.decode()
    assert convoy.pk in board and other.pk not in board
    assert '<span class="tag deadline at-risk"' in board
    assert other.pk in client.get("/?deadline=none").content.decode()
    ordered = client.get("/?sort=due").content.decode()
    assert ordered.index(convoy.pk) < ordered.index(other.pk)


def test_the_api_carries_the_due_time_and_stages_with_one(routes, closing):
    convoy, _ = chain_with_history(closing)
    convoys.update_fields(convoy.pk, due_at="2030-01-01T00:00Z", actor="test")
    client = logged_in(user_with("otto", "view_convoy", "add_convoy"))
    detail = client.get(f"/api/convoys/{convoy.pk}").json()
    assert detail["due_at"].startswith("2030-01-01T00:00:00") and detail["deadline"] == "on-track"
    bead("gt-s")
    staged = client.post(
        "/api/stage",
        data=json.dumps({"ids": ["gt-s"], "due": "2030-02-01T09:00+01:00"}),
        content_type="application/json",
    )
    assert staged.status_code == 200, staged.content
    due = Convoy.objects.get(pk=staged.json()["convoy_id"]).due_at
    assert due == datetime(2030, 2, 1, 8, tzinfo=UTC)
    refused = client.post(
        "/api/stage",
        data=json.dumps({"ids": ["gt-s"], "due": "soon"}),
        content_type="application/json",
    )
    assert refused.status_code == 400 and "is not a time like" in refused.json()["detail"]


# --- told through webhooks and chat too -------------------------------------------------------
def test_at_risk_and_overdue_reach_webhooks_and_chat_once(
    routes, closing, receiver, second_receiver, settings, django_capture_on_commit_callbacks
):
    settings.CONVOY_WEBHOOK_ALLOW_PRIVATE = True  # the receivers listen on 127.0.0.1
    convoy, _ = chain_with_history(closing)
    signed = hooks.add_target(receiver.url, convoy_id=convoy.pk, kinds="at-risk,overdue")
    hooks.add_target(f"json://127.0.0.1:{second_receiver.port}/", town=True, kinds="at-risk")
    now = timezone.now()
    convoys.update_fields(convoy.pk, due_at=now + timedelta(minutes=30), actor="test")
    with django_capture_on_commit_callbacks(execute=True):
        deadlines.check(now)
        deadlines.check(now)  # told once
    (body,) = [Webhook(signed.secret).verify(b, h) for _, _, h, b, _ in receiver.requests]
    assert body["type"] == "convoy.at_risk" and body["data"]["convoy"]["id"] == convoy.pk
    (chat,) = second_receiver.bodies()
    assert "at risk" in json.dumps(chat).lower()
    Convoy.objects.filter(pk=convoy.pk).update(due_at=now - timedelta(minutes=1))
    with django_capture_on_commit_callbacks(execute=True):
        deadlines.check()  # past due: overdue
    assert [json.loads(r[3])["type"] for r in receiver.requests] == [
        "convoy.at_risk",
        "convoy.overdue",
    ]
    assert len(second_receiver.requests) == 1  # the chat asked for at-risk only


def test_convoy_feed_once_runs_the_deadline_check(routes):
    user_with("alice", "view_convoy")
    past = convoys.create("Was due", [], owner="alice", due=timezone.now() - timedelta(hours=1))
    out = command("convoy", "feed", "--once")
    assert f"⏰ Convoy {past.pk}: overdue" in out
    assert Notification.objects.filter(kind="overdue", convoy_id=past.pk).count() == 1
    listed = json.loads(command("convoy", "list", "--json"))
    assert [(c["id"], c["deadline"]) for c in listed] == [(past.pk, "overdue")]
