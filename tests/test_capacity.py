"""Town-wide capacity: in flight derived from rows, the queue's order
(priority, then round-robin across convoys, then id) and its positions."""

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from convoys.models import Bead, Convoy, Dispatch, Event, Worker
from convoys.rules import breaker, capacity
from convoys.services import convoys, dispatch, feeding, staging
from convoys.services.launch import launch_staged

from .support.factories import bead
from .support.factories import command as cli


def claim(bead_id, convoy_id=""):
    won = dispatch.claim(Bead.objects.get(pk=bead_id), convoy_id=convoy_id, path="manual")
    assert won is not None, bead_id
    return won


def test_in_flight_counts_only_our_live_dispatches(routes, settings):
    settings.CONVOY_MAX_IN_FLIGHT = 0
    bead("gt-a")
    bead("gt-b")
    bead("gt-imported", status="hooked", assignee="gastown/polecats/someone")
    claim("gt-a")
    won = claim("gt-b")
    assert capacity.in_flight() == 2  # the imported hooked bead is not ours
    Worker.objects.filter(name=won.worker).update(
        last_seen=timezone.now() - timedelta(seconds=settings.CONVOY_WORKER_TIMEOUT + 1)
    )
    assert capacity.in_flight() == 1  # a dead worker's slot is free again
    Bead.objects.filter(pk="gt-a").update(status="in_progress")
    assert capacity.in_flight() == 1  # in progress is in flight too


def test_queue_is_priority_then_round_robin_then_id(routes, settings):
    settings.CONVOY_MAX_IN_FLIGHT = 1
    a = convoys.create("A", [bead(f"gt-a{i}").id for i in range(3)])
    b = convoys.create("B", [bead(f"gt-b{i}").id for i in range(3)])
    bead("gt-urgent", priority=0)
    c = convoys.create("C", ["gt-urgent"])
    claim("gt-a0", a.pk)  # the town is full; A was served last
    snap = capacity.snapshot()
    assert (snap.cap, snap.in_flight, snap.free) == (1, 1, 0)
    order = [(q.bead_id, q.convoy_id) for q in snap.waiting]
    assert order == [
        ("gt-urgent", c.pk),  # priority first
        ("gt-b0", b.pk),  # B never dispatched: before A
        ("gt-a1", a.pk),
        ("gt-b1", b.pk),
        ("gt-a2", a.pk),
        ("gt-b2", b.pk),
    ]
    assert capacity.queue_positions() == {bead_id: i + 1 for i, (bead_id, _) in enumerate(order)}


def test_positions_skip_free_slots_paused_parked_and_full_convoys(routes, settings):
    from convoys.services import controls

    settings.CONVOY_MAX_IN_FLIGHT = 3
    a = convoys.create("A", [bead(f"gt-a{i}").id for i in range(4)], max_in_flight=2)
    p = convoys.create("Paused", [bead("gt-p0").id])
    controls.pause(p.pk, actor="test")
    Bead.objects.filter(pk="gt-a3").update(dispatch_failures=breaker.max_failures())
    claim("gt-a0", a.pk)
    snap = capacity.snapshot()
    # one slot of A's own limit left: gt-a1 only; gt-a3 is parked, gt-p0 paused
    assert [q.bead_id for q in snap.queue] == ["gt-a1"]
    assert snap.free == 2 and capacity.queue_positions() == {}  # a free slot is there for it
    settings.CONVOY_MAX_IN_FLIGHT = 1
    assert capacity.queue_positions() == {"gt-a1": 1}
    settings.CONVOY_MAX_IN_FLIGHT = 0
    assert capacity.queue_positions() == {}  # no cap: nothing waits for capacity


# --- enforcement: every path, the queue's order, slots freed by closes, failures and deaths --


def launched(ids):
    plan = staging.stage(ids, actor="test")
    return launch_staged(plan.convoy_id, force=True)


def oldest_in_flight():
    """The bead in flight whose dispatch is oldest."""
    busy = set(capacity.in_flight_beads().values_list("pk", flat=True))
    for bead_id in Dispatch.objects.order_by("created_at", "id").values_list("bead_id", flat=True):
        if bead_id in busy:
            return bead_id
    return None


@pytest.mark.slow
def test_two_convoys_of_50_with_a_cap_of_2_take_turns(routes, settings, closing):
    settings.CONVOY_MAX_IN_FLIGHT = 2
    a = launched([bead(f"gt-a{i:02d}").id for i in range(50)])
    assert [d["id"] for d in a.dispatched] == ["gt-a00", "gt-a01"]
    assert {s["reason"] for s in a.skipped} == {
        "town at capacity (2 in flight, cap 2): waiting for a free slot"
    }
    b = launched([bead(f"gt-b{i:02d}").id for i in range(50)])
    assert b.dispatched == [] and len(b.skipped) == 50
    turns = []
    while (bead_id := oldest_in_flight()) is not None:
        closing(bead_id)
        assert capacity.in_flight() <= 2
        turns += [
            d.convoy_id for d in Dispatch.objects.filter(path="event").order_by("id")[len(turns) :]
        ]
    # B, never served, goes first; then the two convoys alternate until A runs out
    expected = [b.convoy_id, a.convoy_id] * 48 + [b.convoy_id] * 2
    assert turns == expected
    assert set(Convoy.objects.values_list("status", flat=True)) == {"closed"}
    assert Dispatch.objects.count() == 100


class FailingFor:
    """A dispatcher that fails for the beads listed in FAILING."""

    FAILING = set()

    def dispatch(self, bead_id, rig, convoy_id, worker):
        from convoys.infra.dispatchers import Outcome

        return Outcome(bead_id not in self.FAILING, "pool down" if bead_id in self.FAILING else "")


def test_every_path_keeps_to_the_cap_and_every_freed_slot_is_refilled(
    routes, settings, closing, monkeypatch
):
    settings.CONVOY_MAX_IN_FLIGHT = 1
    convoy = launched([bead(f"gt-c{i}").id for i in range(5)])
    cid = convoy.convoy_id
    assert [d["id"] for d in convoy.dispatched] == ["gt-c0"]
    full = "town at capacity (1 in flight, cap 1): waiting for a free slot"
    # catch-up, the scan, a container sling and a single sling all respect it
    fed = json.loads(cli("convoy", "feed", "--once", "--json"))
    assert fed["catch_up"].get("dispatched", []) == [] and fed["stranded"]["dispatched"] == []
    slung = json.loads(cli("sling", cid, "--json"))
    assert slung["dispatched"] == [] and {s["reason"] for s in slung["skipped"]} >= {full}
    bead("gt-loose")
    out = io.StringIO()
    with pytest.raises(CommandError, match="nothing dispatched: 1 of 1 refused"):
        call_command("sling", "gt-loose", "--no-convoy", "--json", stdout=out)
    assert json.loads(out.getvalue())["dispatched"][0]["error"] == full  # and exit status 1
    assert capacity.in_flight() == 1
    # a close frees the slot for the queue's head
    closing("gt-c0")
    assert hooked() == ["gt-c1"]
    # a failed dispatch frees its slot at once: the next head goes in the same pass
    monkeypatch.setattr(FailingFor, "FAILING", {"gt-c2"})
    settings.CONVOY_DISPATCHER = "tests.test_capacity.FailingFor"
    closing("gt-c1")
    assert hooked() == ["gt-c3"]
    # a dead worker's slot is free again: the next catch-up fills it (here with the dead
    # worker's own bead, first in the queue and rescued to a live worker)
    dead = Bead.objects.get(pk="gt-c3").assignee
    Worker.objects.filter(name=dead).update(last_seen=timezone.now() - timedelta(hours=1))
    assert capacity.in_flight() == 0
    assert feeding.catch_up()["dispatched"] == ["gt-c3"]
    assert Bead.objects.get(pk="gt-c3").assignee != dead and capacity.in_flight() == 1
    # raising the cap takes effect at the next event, no restart
    settings.CONVOY_MAX_IN_FLIGHT = 3
    assert feeding.catch_up()["dispatched"] == ["gt-c4"]
    assert capacity.in_flight() == 2  # gt-c2 cools down after its failure


def test_pause_and_convoy_limits_still_hold_under_the_cap(routes, settings, closing):
    from convoys.services import controls

    settings.CONVOY_MAX_IN_FLIGHT = 2
    first = launched([bead(f"gt-f{i}").id for i in range(3)])
    assert len(first.dispatched) == 2
    plan = staging.stage([bead(f"gt-p{i}").id for i in range(3)], actor="test")
    convoys.update_fields(plan.convoy_id, max_in_flight=1, actor="test")
    launch_staged(plan.convoy_id, force=True)
    assert capacity.queue_positions() == {"gt-p0": 1, "gt-f2": 2}
    controls.pause(plan.convoy_id, actor="test")
    assert capacity.queue_positions() == {"gt-f2": 1}
    closing("gt-f0")
    assert hooked() == ["gt-f1", "gt-f2"]  # the paused convoy's bead was passed over
    controls.resume(plan.convoy_id, actor="test")
    assert hooked() == ["gt-f1", "gt-f2"]  # resumed, but the town is full
    closing("gt-f1")
    closing("gt-f2")
    assert hooked() == ["gt-p0"]  # its own limit of 1 holds with a town slot free
    assert capacity.snapshot().free == 1


def hooked():
    return sorted(Bead.objects.filter(status="hooked").values_list("id", flat=True))


def test_convoy_capacity_command_shows_and_changes_the_cap(routes, settings):
    from django.core.management import CommandError, call_command

    settings.CONVOY_MAX_IN_FLIGHT = 0
    assert "2 in flight" not in cli("convoy", "capacity")
    assert "no cap (CONVOY_MAX_IN_FLIGHT)" in cli("convoy", "capacity")
    settings.CONVOY_MAX_IN_FLIGHT = 1
    a = launched([bead(f"gt-a{i}").id for i in range(3)])
    text = cli("convoy", "capacity")
    assert "1 in flight / cap 1 (CONVOY_MAX_IN_FLIGHT) · 0 free · 2 queued" in text
    assert "   1. gt-a1" in text and "   2. gt-a2" in text
    report = json.loads(cli("convoy", "capacity", "--json"))
    assert (report["cap"], report["in_flight"], report["queued"]) == (1, 1, 2)
    assert [(q["position"], q["id"], q["convoy"]) for q in report["queue"]] == [
        (1, "gt-a1", a.convoy_id),
        (2, "gt-a2", a.convoy_id),
    ]
    # a run-time override: no restart, and more room feeds the queue at once
    raised = json.loads(cli("convoy", "capacity", "--set", "2", "--actor", "ops", "--json"))
    assert raised["changed"] == {"old": 1, "new": 2, "dispatched": ["gt-a1"]}
    assert (raised["source"], raised["set_by"], raised["in_flight"]) == ("override", "ops", 2)
    assert Event.objects.filter(kind="capacity.changed", actor="ops").exists()
    for hostile in ("-1", "two", "1e3", "1000001", "", "٣"):
        with pytest.raises(CommandError, match="cap: a whole number from 0"):
            call_command("convoy", "capacity", "--set", hostile, stdout=io.StringIO())
    assert capacity.cap() == 2  # refused values changed nothing
    lifted = cli("convoy", "capacity", "--set", "0")
    assert "Town cap 2 → none (unlimited); dispatched gt-a2" in lifted
    assert "no cap (override, set by cli at" in lifted
    back = json.loads(cli("convoy", "capacity", "--unset", "--json"))
    assert back["cap"] == 1 and back["source"] == "CONVOY_MAX_IN_FLIGHT"


def test_dashboard_capacity_panel_draws_and_updates_live(routes, settings, closing):
    from convoys.log.events import last_seq

    from .support.users import signed_in

    client = signed_in("viewer", "view_convoy")
    settings.CONVOY_MAX_IN_FLIGHT = 0
    page = client.get("/").content.decode()
    assert 'id="capacity-panel"' in page and "no town cap" in page
    settings.CONVOY_MAX_IN_FLIGHT = 1
    a = launched([bead(f"gt-a{i}").id for i in range(3)])
    page = client.get("/").content.decode()
    assert "<strong>1</strong> in flight / cap <strong>1</strong> · 0 free" in page
    assert "<strong>2</strong> queued" in page and "the server’s setting" in page
    assert page.index("gt-a1") < page.index("gt-a2") and f"/convoys/{a.convoy_id}/" in page
    seq = last_seq()
    closing("gt-a0")  # a slot frees and gt-a1 takes it
    live = client.get("/", headers={"X-Live": "1", "X-Live-Since": str(seq)}).json()
    panel = live["fragments"]["capacity-panel"]
    assert "<strong>1</strong> queued" in panel and "gt-a2" in panel and "gt-a1" not in panel
    assert panel == client.get("/?fragments=capacity-panel").json()["fragments"]["capacity-panel"]


def test_a_live_dashboard_redraws_the_capacity_panel_only_when_an_edit_can_move_it(
    routes, settings
):
    from convoys.log.events import last_seq
    from convoys.services.beads import update_bead

    from .support.users import signed_in

    client = signed_in("viewer", "view_convoy")
    settings.CONVOY_MAX_IN_FLIGHT = 0
    launched([bead(f"gt-a{i}").id for i in range(3)])  # no cap: all three at work
    bead("gt-idle")

    def live_after(bead_id, **fields):
        seq = last_seq()
        update_bead(bead_id, actor="test", **fields)
        return client.get("/", headers={"X-Live": "1", "X-Live-Since": str(seq)}).json()

    def reloaded():
        return client.get("/?fragments=capacity-panel").json()["fragments"]["capacity-panel"]

    # Retitling a bead nobody works on moves neither the count nor (without a cap) a queue.
    assert "capacity-panel" not in live_after("gt-idle", title="Quiet")["fragments"]
    # An edit of a bead at work refreshes its clock, by which an unheard worker is judged.
    assert live_after("gt-a1", title="Busy")["fragments"]["capacity-panel"] == reloaded()
    assert live_after("gt-idle", assignee="someone")["fragments"]["capacity-panel"] == reloaded()
    settings.CONVOY_MAX_IN_FLIGHT = 1  # now the queue shows: titles and priorities count
    bead("gt-waits")
    convoys.create("W", ["gt-waits"])
    assert "gt-waits" in reloaded()
    panel = live_after("gt-waits", title="Renamed in the queue")["fragments"]["capacity-panel"]
    assert "Renamed in the queue" in panel and panel == reloaded()
    assert "capacity-panel" not in live_after("gt-waits", description="prose")["fragments"]


def test_a_failed_launch_dispatch_frees_its_slot_for_the_queue(
    routes, settings, monkeypatch, django_capture_on_commit_callbacks
):
    settings.CONVOY_MAX_IN_FLIGHT = 2
    monkeypatch.setattr(FailingFor, "FAILING", {"gt-x0"})
    settings.CONVOY_DISPATCHER = "tests.test_capacity.FailingFor"
    with django_capture_on_commit_callbacks(execute=True):  # the failure's commit feeds
        result = launched([bead(f"gt-x{i}").id for i in range(4)])
    assert [(d["id"], d["ok"]) for d in result.dispatched] == [("gt-x0", False), ("gt-x1", True)]
    assert hooked() == ["gt-x1", "gt-x2"]  # gt-x0 cools down; the next head took its slot
    assert Dispatch.objects.get(bead_id="gt-x2").path == "event"


def test_a_convoy_waiting_for_town_capacity_is_not_stranded(routes, settings):
    settings.CONVOY_MAX_IN_FLIGHT = 1
    launched([bead(f"gt-a{i}").id for i in range(2)])
    b = launched([bead(f"gt-b{i}").id for i in range(2)])
    waiting = {c["id"]: c for c in feeding.stranded()}[b.convoy_id]  # /api/stranded's rows
    assert (waiting["kind"], waiting["cause"]) == ("moving", "waiting_for_capacity")
    assert waiting["reason"] == "2 ready, waiting for town capacity (1 in flight, cap 1)"
    assert "2 ready, waiting for town capacity (1 in flight, cap 1) (2 tracked)" in cli(
        "convoy", "stranded"
    )
    settings.CONVOY_MAX_IN_FLIGHT = 0  # no cap: the same convoy is stranded (feedable)
    assert {c["id"]: c for c in feeding.stranded()}[b.convoy_id]["kind"] == "feedable"
