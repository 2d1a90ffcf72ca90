"""The read model kept with the event log equals a rebuild from the rows, after every step of
random sequences of what people, workers and time do (on whichever database the suite runs:
CI runs it on SQLite and on PostgreSQL); and time passing is recorded as events."""

import os
import random
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from convoys.infra.dispatchers import Outcome
from convoys.log.events import last_seq
from convoys.models import Bead, BeadFacts, Convoy, ConvoyFacts, Event, Rig, TrackedBead
from convoys.read import projection, summaries
from convoys.services import (
    actions,
    beads,
    controls,
    convoys,
    dispatch,
    feeding,
    merges,
    rigs,
    timekeeping,
)
from convoys.services.errors import ServiceError

from .support.factories import bead, blocks, command


class Failing:
    def dispatch(self, bead_id, rig, convoy_id, worker):
        return Outcome(False, "no worker answered")


class Clock:
    """timezone.now, moved by hand: every caller of timezone.now() reads it."""

    def __init__(self, monkeypatch):
        self.now = timezone.now()
        monkeypatch.setattr(timezone, "now", lambda: self.now)

    def advance(self, seconds):
        self.now += timedelta(seconds=seconds)


def kept_beads():
    return {
        row[0]: dict(zip(projection.BEAD_FIELDS, row[1:], strict=True))
        for row in BeadFacts.objects.values_list("bead_id", *projection.BEAD_FIELDS)
    }


def kept_convoys():
    return {
        row[0]: dict(zip(projection.CONVOY_FIELDS, row[1:], strict=True))
        for row in ConvoyFacts.objects.values_list("convoy_id", *projection.CONVOY_FIELDS)
    }


def kept_waves():
    found = {}
    for convoy_id, bead_id, wave in TrackedBead.objects.values_list("convoy_id", "bead_id", "wave"):
        found.setdefault(convoy_id, {})[bead_id] = wave
    return found


def assert_same(kept, derived, step):
    differ = {k: (kept.get(k), derived.get(k)) for k in kept.keys() | derived.keys()}
    differ = {k: v for k, v in differ.items() if v[0] != v[1]}
    for key, (a, b) in list(differ.items()):
        if isinstance(a, dict) and isinstance(b, dict):
            differ[key] = {
                f: (a.get(f), b.get(f)) for f in a.keys() | b.keys() if a.get(f) != b.get(f)
            }
    assert not differ, f"after {step[-3:]}: kept, rebuilt {differ}"


def assert_equals_rebuild(now, step=""):
    """What was kept event by event equals what the rows alone give now: each bead's facts,
    each convoy's facts and plan (its beads' waves, its critical path)."""
    assert_same(kept_beads(), projection.derive_beads(None, now), step)
    plans = projection.derive_plans(None)
    assert_same(kept_waves(), {c: p.waves for c, p in plans.items() if p.waves}, step)
    kept = kept_convoys()
    critical = {c: p.critical for c, p in plans.items()}
    assert_same(kept, projection.derive_convoys(None, now, kept, critical), step)


FIXTURES = Path(__file__).parent / "fixtures"
IDS = [f"gt-p{i}" for i in range(10)]


def town(rng):
    for i, bead_id in enumerate(IDS):
        bead(bead_id, priority=i % 3)
    bead("gt-gate", "Decide", type="decision")
    for i in range(3, len(IDS)):
        if rng.random() < 0.5:
            blocks(IDS[rng.randrange(i)], IDS[i])
    blocks("gt-gate", IDS[-1])
    first = convoys.create("First", IDS[:6], actor="test")
    second = convoys.create(
        "Second", IDS[4:] + ["gt-absent"], actor="test", max_in_flight=2, merge="mr"
    )
    return [first.pk, second.pk]


def step(rng, clock, convoy_ids, settings):
    """One random thing that happens; returns its name."""
    bead_id = rng.choice(IDS)
    convoy_id = rng.choice(convoy_ids)
    action = rng.choice(ACTIONS)
    try:
        ACTIONS_BY_NAME[action](bead_id, convoy_id, rng, clock, settings)
    except ServiceError:
        pass  # refused (closing a closed bead, pausing a paused convoy): nothing changed
    return f"{action} {bead_id} {convoy_id}"


def _close(bead_id, *_):
    beads.close_bead(bead_id, actor="worker", force=True)


def _reopen(bead_id, *_):
    beads.reopen_bead(bead_id, actor="manager")


def _bead_action(bead_id, _, rng, *__):
    """A bead action on a few beads (skip, release, reassign, retry, reopen), fed once."""
    chosen = [bead_id, *rng.sample(IDS, k=rng.randint(0, 2))]
    action = rng.choice(actions.ACTIONS)
    target = {"rig": rng.choice(["gastown", "beads"])} if action == "reassign" else {}
    actions.run(action, chosen, actor="manager", **target)


def _feed(_, convoy_id, *__):
    feeding.feed_convoy(Convoy.objects.get(pk=convoy_id), "event")


def _fail(bead_id, convoy_id, *_):
    dispatch.dispatch(Bead.objects.get(pk=bead_id), convoy_id, path="manual", dispatcher=Failing())


def _pause(_, convoy_id, *__):
    if Convoy.objects.get(pk=convoy_id).paused_at:
        controls.resume(convoy_id, actor="manager")
    else:
        controls.pause(convoy_id, actor="manager", reason="look")


def _park(*_):
    state = Rig.objects.get(pk="gastown").state
    rigs.set_rig_state("gastown", Rig.PARKED if state == Rig.ACTIVE else Rig.ACTIVE)


def _cap(_, __, rng, *___):
    controls.set_cap(rng.choice([None, 1, 3]), actor="operator")


def _max_in_flight(_, convoy_id, rng, *__):
    convoys.update_fields(convoy_id, actor="manager", max_in_flight=rng.choice([None, 1, 2]))


def _heartbeat(bead_id, *_):
    assignee = Bead.objects.get(pk=bead_id).assignee
    if assignee:
        beads.heartbeat(assignee)


def _time(_, __, rng, clock, settings):
    clock.advance(rng.choice([5, 61, settings.CONVOY_WORKER_TIMEOUT + 1]))
    timekeeping.pass_time()  # what the ticker does every feed interval


def _depend(bead_id, _, rng, *__):
    target = rng.choice(IDS)
    if target == bead_id:
        return
    try:
        beads.remove_dependency(bead_id, target, actor="admin")
    except ServiceError:
        kind = rng.choice(["blocks", "merge-blocks"])
        beads.add_dependency(bead_id, target, kind, actor="admin")


def _merge(bead_id, _, rng, *__):
    """A forge (or the bead store) says what became of the bead's change."""
    state = rng.choice(["open", "merged", "merged", "abandoned"])
    merges.record(bead_id, merges.Change(state, "api", ref=f"r{rng.randrange(99)}"), "forge")


def _merge_strategy(_, convoy_id, rng, *__):
    convoys.update_fields(convoy_id, actor="manager", merge_strategy=rng.choice(["mr", "direct"]))


def _track(bead_id, convoy_id, *_):
    if Convoy.objects.get(pk=convoy_id).tracked.filter(bead_id=bead_id).exists():
        convoys.untrack(convoy_id, [bead_id], actor="manager")
    else:
        convoys.add(convoy_id, [bead_id], actor="manager")


def _scan(*_):
    feeding.stranded_scan()


ACTIONS_BY_NAME = {
    "close": _close,
    "reopen": _reopen,
    "bead action": _bead_action,
    "feed": _feed,
    "failed dispatch": _fail,
    "pause/resume": _pause,
    "park/unpark": _park,
    "cap": _cap,
    "max in flight": _max_in_flight,
    "heartbeat": _heartbeat,
    "time passes": _time,
    "dependency": _depend,
    "tracking": _track,
    "merge": _merge,
    "merge strategy": _merge_strategy,
    "stranded scan": _scan,
}
ACTIONS = sorted(ACTIONS_BY_NAME)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(int(os.environ.get("PROJECTION_SEEDS", "6"))))
def test_kept_facts_equal_a_rebuild_after_every_step(routes, monkeypatch, settings, seed):
    settings.CONVOY_WORKER_TIMEOUT = 600
    settings.CONVOY_RETRY_COOLDOWN = 60
    rng = random.Random(seed)
    clock = Clock(monkeypatch)
    convoy_ids = town(rng)
    assert_equals_rebuild(clock.now, "start")
    done: list[str] = []
    wanted = {"close", "feed", "time"}  # a run goes on until it has done each at least once
    while len(done) < 45 or (len(done) < 150 and not {d.split(" ")[0] for d in done} >= wanted):
        done.append(step(rng, clock, convoy_ids, settings))
        assert_equals_rebuild(clock.now, done)
    assert {name.split(" ")[0] for name in done} >= wanted


def test_each_event_refreshes_what_it_touches_with_its_seq(routes):
    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b")
    convoy = convoys.create("Pair", ["gt-a", "gt-b"], actor="test")
    facts = BeadFacts.objects.get(pk="gt-b")
    assert (facts.segment, facts.ready, facts.open_blockers) == ("blocked", False, 1)
    beads.close_bead("gt-a", actor="worker")
    facts = BeadFacts.objects.get(pk="gt-b")
    assert (facts.segment, facts.ready, facts.open_blockers) == ("ready", True, 0)
    assert facts.seq == last_seq()  # the close that unblocked it
    row = ConvoyFacts.objects.get(pk=convoy.pk)
    assert (row.done, row.ready, row.total, row.verdict) == (1, 1, 2, "feedable")
    assert row.feedable_since is not None


def test_a_silent_worker_times_out_as_an_event(routes, monkeypatch, settings):
    settings.CONVOY_WORKER_TIMEOUT = 600
    clock = Clock(monkeypatch)
    bead("gt-w")
    convoy = convoys.create("Watch", ["gt-w"], actor="test")
    feeding.feed_convoy(convoy, "event")
    assert BeadFacts.objects.get(pk="gt-w").segment == "active"
    clock.advance(300)
    assert timekeeping.pass_time() == {"recorded": 0}
    clock.advance(301)
    assert timekeeping.pass_time() == {"recorded": 1}
    assert Event.objects.filter(kind="worker.timed_out", bead_id="gt-w").count() == 1
    facts = BeadFacts.objects.get(pk="gt-w")
    assert (facts.segment, facts.worker_dead) == ("ready", True)
    assert timekeeping.pass_time() == {"recorded": 0}  # once
    # The worker reports again: its bead is worked on, which an event says.
    beads.heartbeat(Bead.objects.get(pk="gt-w").assignee)
    assert Event.objects.filter(kind="worker.back", bead_id="gt-w").count() == 1
    assert BeadFacts.objects.get(pk="gt-w").segment == "active"
    summary = summaries.convoy_summaries([Convoy.objects.get(pk=convoy.pk)])[convoy.pk]
    assert (summary["active"], summary["ready"]) == (1, 0)


def test_a_cooldown_ends_as_an_event(routes, monkeypatch, settings):
    settings.CONVOY_RETRY_COOLDOWN = 60
    clock = Clock(monkeypatch)
    bead("gt-c")
    convoys.create("Cool", ["gt-c"], actor="test")
    dispatch.dispatch(Bead.objects.get(pk="gt-c"), path="manual", dispatcher=Failing())
    facts = BeadFacts.objects.get(pk="gt-c")
    assert (facts.ready, facts.feedable, facts.failed) == (True, False, True)
    clock.advance(61)
    assert timekeeping.pass_time() == {"recorded": 1}
    facts = BeadFacts.objects.get(pk="gt-c")
    assert (facts.feedable, facts.cooldown_until) == (True, None)


def test_reproject_rebuilds_what_was_lost(routes):
    bead("gt-r1")
    bead("gt-r2", status="closed")
    convoy = convoys.create("Lost", ["gt-r1", "gt-r2"], actor="test")
    with transaction.atomic():
        BeadFacts.objects.all().delete()
        ConvoyFacts.objects.all().delete()
    assert "Reprojected 1 convoy(s)" in command("convoy", "reproject", convoy.pk)
    row = ConvoyFacts.objects.get(pk=convoy.pk)
    assert (row.done, row.ready, row.total) == (1, 1, 2)
    assert "Reprojected every bead and convoy" in command("convoy", "reproject")


def test_reproject_of_an_unknown_convoy_says_so_and_changes_nothing(routes):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises((CommandError, SystemExit)):
        call_command("convoy", "reproject", "hq-cv-nope")


def test_an_import_is_settled_in_its_transaction_and_equals_a_rebuild(routes):
    """An import appends its events in bulk; the read model is derived in one pass before
    the import's transaction ends, and equals a rebuild."""
    command("beads", "import", str(FIXTURES / "hooked.jsonl"))
    assert BeadFacts.objects.count() == Bead.objects.count() > 0
    assert ConvoyFacts.objects.count() == Convoy.objects.count() > 0
    assert_equals_rebuild(timezone.now(), "import")


def test_a_bulk_append_nobody_settled_is_settled_by_the_next_time_pass(routes):
    from convoys.log.events import record_many

    bead("gt-u1")
    BeadFacts.objects.filter(pk="gt-u1").delete()
    with transaction.atomic():
        record_many([{"kind": "bead.updated", "bead_id": "gt-u1"}], instances=False)
    assert not BeadFacts.objects.filter(pk="gt-u1").exists()  # its writer did not settle
    timekeeping.pass_time()
    assert BeadFacts.objects.filter(pk="gt-u1").exists()


def test_a_rolled_back_bulk_load_leaves_nothing_to_settle(routes):
    from convoys.log.events import record_many
    from convoys.models import Cursor

    bead("gt-u2")
    with pytest.raises(RuntimeError), transaction.atomic():
        record_many([{"kind": "bead.updated", "bead_id": "gt-u2"}], instances=False)
        raise RuntimeError("the import failed")
    assert not Cursor.objects.filter(name=projection.BULK).exists()


def test_a_close_waiting_for_its_merge_moves_the_kept_critical_path(routes):
    """Under `mr` a close makes the bead submitted, not done; the plan leaves it out all the
    same, and takes it back when its change is abandoned (the bead needs work again)."""
    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b")
    convoy = convoys.create("Merge plan", ["gt-a", "gt-b"], actor="test", merge="mr")

    def critical():
        return ConvoyFacts.objects.get(convoy_id=convoy.pk).critical

    assert critical() == ["gt-a", "gt-b"]
    beads.close_bead("gt-a", actor="worker")
    assert BeadFacts.objects.get(bead_id="gt-a").segment == "submitted"
    assert critical() == ["gt-b"]
    merges.record("gt-a", merges.Change("abandoned", "api", ref="r1"), "forge")
    assert Bead.objects.get(pk="gt-a").status == "open"
    assert critical() == ["gt-a", "gt-b"]
    assert_equals_rebuild(timezone.now())
