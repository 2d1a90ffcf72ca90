"""`manage.py demo`: the first load, a second run on the same database, --reset, and the top-up
that keeps the demo moving as its convoys land."""

import io
import random

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from convoys.models import (
    CONVOY_CLOSED,
    CONVOY_OPEN,
    Bead,
    Convoy,
    Event,
    LogLine,
    Merge,
    TrackedBead,
)
from convoys.services import beads, demo, merges, worklog

pytestmark = pytest.mark.django_db(transaction=True)  # closes feed the next wave on commit

FIRST_TITLES = {
    "Chain: release pipeline",
    "Diamond: storage migration",
    "Wide wave: test matrix",
    "Gated: production rollout",
    "Mixed: search rewrite",
    "Staged: frontend polish (parked rig)",
}


def run_demo(*args):
    out = io.StringIO()
    call_command("demo", *args, stdout=out)
    return out.getvalue()


def counts():
    return {model.__name__: model.objects.count() for model in (Bead, Convoy, TrackedBead, Event)}


def titles():
    """The convoys' titles, which name their epics ("Convoy: " in front or not)."""
    return {c.title.removeprefix("Convoy: ") for c in Convoy.objects.all()}


def open_convoys():
    return Convoy.objects.filter(status=CONVOY_OPEN)


def work_the_beads():
    """What the swarm does, to the end: close whatever is dispatched until nothing is."""
    for _ in range(200):
        working = list(Bead.objects.filter(status__in=("hooked", "in_progress")))
        if not working:
            return
        for bead in working:
            beads.close_bead(bead.pk, reason="done", actor="test")
    raise AssertionError("work never ran out")


def test_first_load_launches_the_shapes_and_the_account():
    output = run_demo()
    assert titles() == FIRST_TITLES
    assert open_convoys().count() == 5
    assert Bead.objects.filter(status="hooked").exists()  # wave 1 is dispatched
    assert get_user_model().objects.get(username="demo").check_password("convoy-demo")
    assert "Demo account: demo / convoy-demo" in output


def test_demo_twice_on_the_same_database_is_idempotent_and_leaves_open_work():
    run_demo()
    before = counts()
    output = run_demo()
    assert "already present" in output and "launched" not in output
    assert counts() == before
    assert open_convoys().count() >= demo.KEEP_OPEN
    assert Bead.objects.filter(status="hooked").exists()


@pytest.mark.slow
def test_a_second_run_after_the_convoys_landed_launches_fresh_ones():
    run_demo()
    work_the_beads()
    assert open_convoys().count() == 1  # only the gated rollout waits, for a person
    output = run_demo()
    assert output.count("launched ") == demo.KEEP_OPEN - 1
    assert open_convoys().count() == demo.KEEP_OPEN
    assert Bead.objects.filter(status="hooked").exists()


@pytest.mark.slow
def test_replenish_stages_and_launches_a_fresh_epic_when_demo_convoys_have_landed():
    run_demo()
    assert demo.replenish(rng=random.Random(1)) == []  # enough convoys are open
    work_the_beads()
    landed = set(Convoy.objects.filter(status=CONVOY_CLOSED).values_list("pk", flat=True))
    assert len(landed) == 4

    launched = demo.replenish(keep_open=2, rng=random.Random(1))

    assert len(launched) == 1
    convoy_id, title = launched[0]
    convoy = Convoy.objects.get(pk=convoy_id)
    assert convoy.status == CONVOY_OPEN and title in convoy.title
    assert convoy_id not in landed
    tracked = Bead.objects.filter(pk__in=convoy.tracked.values("bead_id"))
    assert 3 <= tracked.count() <= 8
    assert tracked.filter(status="hooked").exists()  # wave 1 went out at launch
    # and it keeps going: working it lands it, and the next top-up launches another
    work_the_beads()
    assert Convoy.objects.get(pk=convoy_id).status == CONVOY_CLOSED
    assert len(demo.replenish(keep_open=2, rng=random.Random(2))) == 1


@pytest.mark.slow
def test_reset_wipes_the_work_data_and_reloads_it():
    run_demo()
    work_the_beads()
    run_demo()  # a topped-up database, as after a long run
    beads.create_bead("Mine", bead_id="gt-mine", actor="test")
    worklog.append("gt-mine", ["cloning"], actor="test")
    merges.record("gt-mine", merges.Change("merged", "api", ref="abc"), "test")
    old_beads = set(Bead.objects.values_list("pk", flat=True))
    last_seq = Event.objects.order_by("-seq").values_list("seq", flat=True)[0]

    output = run_demo("--reset")

    assert "Wiped" in output
    assert titles() == FIRST_TITLES
    assert not old_beads & set(Bead.objects.values_list("pk", flat=True))
    # nothing of the old beads waits for a new bead of the same id (a merge, a log)
    assert not LogLine.objects.exists() and not Merge.objects.exists()
    assert Event.objects.order_by("seq").values_list("seq", flat=True)[0] > last_seq
    assert get_user_model().objects.filter(username="demo").count() == 1


def test_production_refuses_demo_data(monkeypatch):
    monkeypatch.setenv("CONVOY_PRODUCTION", "1")
    with pytest.raises(CommandError, match="CONVOY_PRODUCTION"):
        run_demo()
    assert counts()["Bead"] == 0 and not get_user_model().objects.exists()
