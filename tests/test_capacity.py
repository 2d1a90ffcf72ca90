"""Town-wide capacity (issue 16 item 1): in flight derived from rows, the queue's order
(priority, then round-robin across convoys, then id) and its positions."""

from datetime import timedelta

from django.utils import timezone

from convoys.models import Bead, Worker
from convoys.services import capacity, convoys, dispatch

from .factories import bead


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
    Bead.objects.filter(pk="gt-a3").update(dispatch_failures=dispatch.max_failures())
    claim("gt-a0", a.pk)
    snap = capacity.snapshot()
    # one slot of A's own limit left: gt-a1 only; gt-a3 is parked, gt-p0 paused
    assert [q.bead_id for q in snap.queue] == ["gt-a1"]
    assert snap.free == 2 and capacity.queue_positions() == {}  # a free slot is there for it
    settings.CONVOY_MAX_IN_FLIGHT = 1
    assert capacity.queue_positions() == {"gt-a1": 1}
    settings.CONVOY_MAX_IN_FLIGHT = 0
    assert capacity.queue_positions() == {}  # no cap: nothing waits for capacity
