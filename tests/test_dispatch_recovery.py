"""Crash-safe dispatch: a claim whose process died before or during the dispatcher's call is
settled by the catch-up (released to ready and fed again, or confirmed by its worker), and it
shows as "unknown outcome", never as "working", until then. Real processes killed mid-launch
and mid-feed: tests/test_dispatch_faults.py."""

import json
import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from convoys.infra.dispatchers import Outcome
from convoys.models import Bead, Convoy, Dispatch, Event, Worker
from convoys.rules import breaker, causes
from convoys.services import beads, dispatch, feeding, staging
from convoys.services.launch import launch_staged

from .support.factories import bead, blocks, command
from .support.users import signed_in


def claimed(bead_id, convoy_id=""):
    """A claim whose process died before it called the dispatcher."""
    won = dispatch.claim(Bead.objects.get(pk=bead_id), convoy_id=convoy_id, path="launch")
    assert won is not None
    return won


def later(seconds):
    return timezone.now() + timedelta(seconds=seconds)


def open_convoy(*ids):
    """A convoy that feeds `ids` and has dispatched none of them yet."""
    plan = staging.stage(list(ids), actor="test")
    Convoy.objects.filter(pk=plan.convoy_id).update(status="open")
    return plan.convoy_id


def test_a_claim_never_sent_shows_unknown_outcome_then_is_released_and_fed(routes, settings):
    settings.CONVOY_CLAIM_GRACE = 30
    bead("gt-a")
    convoy_id = open_convoy("gt-a")
    lost = claimed("gt-a", convoy_id)
    cause = causes.for_bead("gt-a")
    assert cause["kind"] == "unknown-outcome" and cause["worker"] == lost.worker
    assert feeding.recover_dispatches(now=later(5)) == []  # its holder may still send it

    assert feeding.recover_dispatches(now=later(31)) == ["gt-a"]
    first = Dispatch.objects.get(pk=lost.dispatch_id)
    assert (first.resolution, first.ok) == ("abandoned", None)
    assert Event.objects.filter(kind="dispatch.abandoned", bead_id="gt-a").count() == 1
    # Fed again at once, by the rescue path; not a failure: no cooldown, no breaker count.
    again = Dispatch.objects.exclude(pk=first.pk).get(bead_id="gt-a")
    assert (again.path, again.ok) == ("stranded", True)
    row = Bead.objects.get(pk="gt-a")
    assert row.status == "hooked" and row.assignee == again.worker and row.dispatch_failures == 0
    assert breaker.cooling_down(["gt-a"]) == set()
    assert causes.for_bead("gt-a")["kind"] == "working"
    assert feeding.recover_dispatches(now=later(31)) == []  # settled once


def test_a_dispatch_started_without_an_answer_is_released_after_the_timeout(routes, settings):
    settings.CONVOY_CLAIM_GRACE = 10
    settings.CONVOY_DISPATCH_TIMEOUT = 20

    class Dies:
        def dispatch(self, bead_id, rig, convoy_id, worker):
            raise KeyboardInterrupt  # stands for the process dying mid-call

    bead("gt-b")
    won = claimed("gt-b")
    with pytest.raises(KeyboardInterrupt):
        dispatch.run(won, Dies())
    # An interrupt the process lives through records the failure itself:
    assert Dispatch.objects.get(pk=won.dispatch_id).ok is False
    bead("gt-c")
    won = claimed("gt-c")
    Dispatch.objects.filter(pk=won.dispatch_id).update(
        started_at=timezone.now(), held_until=later(30)
    )
    assert causes.for_bead("gt-c")["kind"] == "unknown-outcome"
    assert feeding.recover_dispatches(now=later(25)) == []
    assert feeding.recover_dispatches(now=later(31)) == ["gt-c"]
    attempt = Dispatch.objects.get(pk=won.dispatch_id)
    assert attempt.resolution == "released" and "outcome unknown" in attempt.error
    row = Bead.objects.get(pk="gt-c")
    assert (row.status, row.assignee) == ("open", "")  # no open convoy feeds it: ready
    assert causes.for_bead("gt-c")["kind"] == "ready"
    assert Event.objects.filter(kind="dispatch.released", bead_id="gt-c").exists()


def test_the_workers_heartbeat_confirms_an_unanswered_dispatch(routes):
    bead("gt-d")
    won = claimed("gt-d")
    assert causes.for_bead("gt-d")["kind"] == "unknown-outcome"
    beads.heartbeat(won.worker)  # a name that was claimed but never sent: no worker runs
    assert Dispatch.objects.get(pk=won.dispatch_id).resolution == ""
    shown = command("beads", "show", "gt-d")
    assert f"why: unknown outcome: claimed for {won.worker}" in shown
    assert json.loads(command("beads", "show", "gt-d", "--json"))["cause"]["kind"] == (
        "unknown-outcome"
    )
    Dispatch.objects.filter(pk=won.dispatch_id).update(started_at=timezone.now())
    assert "confirmed the dispatch of gt-d" in command("beads", "heartbeat", won.worker)
    attempt = Dispatch.objects.get(pk=won.dispatch_id)
    assert (attempt.ok, attempt.resolution) == (True, "confirmed")
    assert causes.for_bead("gt-d")["kind"] == "working"
    assert Event.objects.filter(kind="dispatch.confirmed", bead_id="gt-d").exists()
    assert feeding.recover_dispatches(now=later(3600)) == []  # nothing left to settle
    assert Bead.objects.get(pk="gt-d").assignee == won.worker


def test_a_later_claim_of_the_same_worker_name_confirms_nothing(routes):
    """A rescue takes the bead over; the silent worker's name is picked again for another
    claim (which touches its last_seen) and reports in. The old attempt is settled as
    released, not confirmed: only a heartbeat or a close while its worker holds the bead
    says it ran."""
    bead("gt-e")
    old = claimed("gt-e")
    Dispatch.objects.filter(pk=old.dispatch_id).update(started_at=timezone.now())
    Bead.objects.filter(pk="gt-e").update(assignee="gastown/polecats/other")  # taken over
    time.sleep(0.01)
    Worker.objects.filter(name=old.worker).update(last_seen=timezone.now())
    beads.heartbeat(old.worker)  # alive, but it no longer holds gt-e
    assert Dispatch.objects.get(pk=old.dispatch_id).resolution == ""
    assert feeding.recover_dispatches(now=later(3600)) == ["gt-e"]
    attempt = Dispatch.objects.get(pk=old.dispatch_id)
    assert (attempt.resolution, attempt.ok) == ("released", None)
    assert Bead.objects.get(pk="gt-e").assignee == "gastown/polecats/other"  # left alone


def test_a_bead_its_worker_closed_confirms_the_dispatch(routes):
    bead("gt-i")
    won = claimed("gt-i")
    beads.close_bead("gt-i")
    assert feeding.recover_dispatches(now=later(3600)) == ["gt-i"]
    assert Dispatch.objects.get(pk=won.dispatch_id).resolution == "confirmed"


def test_a_claim_settled_before_it_ran_is_not_sent(routes):
    calls = []

    class Records:
        def dispatch(self, bead_id, rig, convoy_id, worker):
            calls.append(bead_id)
            return Outcome(True)

    bead("gt-f")
    won = claimed("gt-f")
    feeding.recover_dispatches(now=later(3600))  # its holder seemed dead
    result = dispatch.run(won, Records())
    assert calls == [] and result["ok"] is False and "released before it ran" in result["error"]
    assert Dispatch.objects.get(pk=won.dispatch_id).resolution == "abandoned"


def test_a_dispatch_answered_records_it_and_the_cause_moves_on(routes):
    bead("gt-g")
    won = claimed("gt-g")
    dispatch.run(won)
    attempt = Dispatch.objects.get(pk=won.dispatch_id)
    assert attempt.ok is True and attempt.started_at is not None and attempt.resolution == ""
    assert Event.objects.filter(kind="dispatch.ok", bead_id="gt-g").count() == 1
    assert causes.for_bead("gt-g")["kind"] == "working"


@pytest.mark.parametrize("holding", [True, False])
def test_a_slow_launch_keeps_its_waiting_claims(routes, settings, monkeypatch, holding):
    """A catch-up running while a launch works through slow dispatches settles none of the
    claims still waiting their turn (the launch renews them); without the renewal it would."""
    settings.CONVOY_CLAIM_GRACE = 1

    class Slow:
        def dispatch(self, bead_id, rig, convoy_id, worker):
            time.sleep(0.4)
            dispatch.recover()  # a catch-up in another process, now
            return Outcome(True)

    monkeypatch.setattr(dispatch, "get_dispatcher", lambda name=None: Slow())
    if not holding:
        monkeypatch.setattr(dispatch, "hold", lambda claims: None)
    ids = [bead(f"gt-s{i}").id for i in range(6)]
    plan = staging.stage(ids, actor="test")
    result = launch_staged(plan.convoy_id, force=True)
    abandoned = Dispatch.objects.filter(resolution="abandoned").count()
    if holding:
        assert [r["ok"] for r in result.dispatched] == [True] * 6 and abandoned == 0
    else:
        assert abandoned > 0


def test_the_bead_page_says_unknown_outcome_then_how_it_was_settled(routes):
    bead("gt-h")
    claimed("gt-h")
    client = signed_in("viewer", "view_bead", "view_convoy")
    page = client.get(reverse("bead", args=["gt-h"])).content.decode()
    assert "unknown outcome" in page and "no outcome of its dispatch recorded yet" in page
    feeding.recover_dispatches(now=later(3600))
    page = client.get(reverse("bead", args=["gt-h"])).content.decode()
    assert "not sent: the process that claimed it stopped first" in page
    assert "unknown outcome" not in page


def test_a_close_whose_handler_died_mid_feed_is_fed_again(routes, settings):
    """The feed of a close was cut short (its task's process died): the catch-up takes the
    close over once CONVOY_TASK_TIMEOUT has passed and dispatches what it made ready; a live
    handler's close is left to it."""
    from convoys.models import HandledEvent

    settings.CONVOY_TASK_TIMEOUT = 60
    bead("gt-root")
    ids = [bead(f"gt-r{i}").id for i in range(3)]
    for bead_id in ids:
        blocks("gt-root", bead_id)
    convoy_id = open_convoy("gt-root", *ids)
    feeding.catch_up()  # seeds the mark
    beads.close_bead("gt-root")  # its task is lost with the process that ran it ...
    seq = Event.objects.get(kind="bead.closed").seq
    HandledEvent.objects.create(seq=seq, finished=False)  # ... mid-feed
    assert feeding.catch_up()["handled"] == []  # a handler that may still be alive
    assert not Bead.objects.filter(pk__in=ids, status="hooked").exists()
    HandledEvent.objects.filter(seq=seq).update(handled_at=later(-61))
    assert feeding.catch_up()["handled"] == [seq]
    assert Bead.objects.filter(pk__in=ids, status="hooked").count() == 3
    assert HandledEvent.objects.get(seq=seq).finished
    assert feeding.catch_up()["handled"] == []
    assert Convoy.objects.get(pk=convoy_id).status == "open"


def test_credits_a_dead_drain_left_are_paid_by_the_catch_up(routes):
    """A close found the convoy's drain busy and left a credit; the drain's process died, so
    nobody pays it. Once the drain's lease has expired, the catch-up feeds the convoy."""
    from convoys.models import Lease

    ids = [bead(f"gt-p{i}").id for i in range(3)]
    convoy_id = open_convoy(*ids)
    feeding.catch_up()  # seeds the mark
    Convoy.objects.filter(pk=convoy_id).update(feed_credit=1)
    Lease.objects.create(name=f"drain:{convoy_id}", holder="dead", expires_at=later(30))
    assert "credits_paid" not in feeding.catch_up()  # its holder may be alive
    Lease.objects.filter(name=f"drain:{convoy_id}").update(expires_at=later(-1))
    assert feeding.catch_up()["credits_paid"] == [convoy_id]
    assert Bead.objects.filter(pk__in=ids, status="hooked").count() == 3  # filled
    assert Convoy.objects.get(pk=convoy_id).feed_credit == 0
