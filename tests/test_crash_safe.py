"""Dispatch is crash-safe: a claim whose outcome was never recorded (the process died between
claim and record) is settled by the catch-up: started on its worker's heartbeat, else
released after the dispatch timeout, never left hooked forever."""

from datetime import timedelta

from django.utils import timezone

from convoys.models import Bead, Dispatch, Event, Worker
from convoys.services import beads, dispatch, feeding

from .factories import bead


def _claimed(bead_id):
    """A claim as a process killed right after it leaves it: no dispatcher call, no outcome."""
    won = dispatch.claim(Bead.objects.get(pk=bead_id), path="launch")
    assert won is not None
    return won


def _age(claim_, seconds):
    then = timezone.now() - timedelta(seconds=seconds)
    Dispatch.objects.filter(pk=claim_.dispatch_id).update(created_at=then)
    Worker.objects.filter(name=claim_.worker).update(last_seen=then)


def test_a_claim_with_no_outcome_is_released_after_the_dispatch_timeout(routes, settings):
    settings.CONVOY_DISPATCH_TIMEOUT = 5
    bead("gt-1", "one")
    claim_ = _claimed("gt-1")
    assert dispatch.resolve_unknown() == {"started": [], "released": []}  # may still be running
    assert Bead.objects.get(pk="gt-1").status == "hooked"
    _age(claim_, 11)
    assert dispatch.resolve_unknown() == {"started": [], "released": ["gt-1"]}
    row = Bead.objects.get(pk="gt-1")
    assert (row.status, row.assignee) == ("open", "")
    attempt = Dispatch.objects.get(pk=claim_.dispatch_id)
    assert attempt.ok is False and attempt.error == dispatch.UNKNOWN_OUTCOME_RELEASED
    assert Event.objects.filter(kind="dispatch.failed", bead_id="gt-1").count() == 1
    # settled once: a second pass changes nothing
    assert dispatch.resolve_unknown() == {"started": [], "released": []}
    assert Event.objects.filter(kind="dispatch.failed", bead_id="gt-1").count() == 1


def test_a_heartbeat_after_the_claim_marks_the_dispatch_started(routes, settings):
    settings.CONVOY_DISPATCH_TIMEOUT = 5
    bead("gt-1", "one")
    claim_ = _claimed("gt-1")
    _age(claim_, 60)
    beads.heartbeat(claim_.worker)
    assert dispatch.resolve_unknown() == {"started": ["gt-1"], "released": []}
    assert Dispatch.objects.get(pk=claim_.dispatch_id).ok is True
    row = Bead.objects.get(pk="gt-1")
    assert (row.status, row.assignee) == ("hooked", claim_.worker)


def test_a_bead_that_moved_on_is_not_released(routes, settings):
    settings.CONVOY_DISPATCH_TIMEOUT = 5
    bead("gt-1", "one")
    claim_ = _claimed("gt-1")
    _age(claim_, 60)
    beads.close_bead("gt-1")
    assert dispatch.resolve_unknown()["released"] == []
    assert Dispatch.objects.get(pk=claim_.dispatch_id).ok is False
    assert Bead.objects.get(pk="gt-1").status == "closed"


def test_catch_up_settles_unknown_outcomes(routes, settings):
    settings.CONVOY_DISPATCH_TIMEOUT = 5
    feeding.catch_up()  # seeds the mark
    bead("gt-1", "one")
    claim_ = _claimed("gt-1")
    _age(claim_, 11)
    summary = feeding.catch_up()
    assert summary["unknown_outcome"] == {"started": [], "released": ["gt-1"]}
    assert Bead.objects.get(pk="gt-1").status == "open"


def test_a_claim_with_no_outcome_shows_as_unknown_outcome_until_a_heartbeat(routes, settings):
    from convoys import causes

    bead("gt-1", "one")
    claim_ = _claimed("gt-1")
    assert causes.for_bead("gt-1")["kind"] == "unknown-outcome"
    assert causes.word("unknown-outcome") == dispatch.UNKNOWN_OUTCOME
    _age(claim_, 1)
    beads.heartbeat(claim_.worker)
    assert causes.for_bead("gt-1")["kind"] == "working"
