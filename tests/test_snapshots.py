"""A convoy page's snapshot carried forward by live updates equals one loaded afresh.

A live update re-reads only the beads its events touched (`convoys.snapshots`); these tests
drive random sequences of what people and workers do through the services and, after each,
compare the carried snapshot field by field with a fresh load, and the live fragments with a
fresh render of the page."""

import random
import re
from dataclasses import asdict

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from convoys import causes, selectors, snapshots, timeline, views
from convoys.dispatchers import Outcome
from convoys.events import last_seq
from convoys.models import Bead, Convoy, Rig
from convoys.services import beads, controls, convoys, dispatch, rigs

from .factories import bead, blocks
from .test_web import as_of, assert_parts_of, live, logged_in

FIELDS = (
    "tracked",
    "beads",
    "edges",
    "gates",
    "ready",
    "failed",
    "blockers",
    "target_types",
    "rigs",
    "cap",
)


class Refuses:
    def dispatch(self, bead_id, rig, convoy_id, worker):
        return Outcome(ok=False, error="worker refused")


@pytest.fixture
def chain(routes):
    """12 tracked tasks in chains, a decision gating one, a task outside the convoy blocking
    another."""
    ids = [bead(f"gt-s{i:02d}").id for i in range(12)]
    for i in range(3, 12):
        blocks(ids[i - 3], ids[i])
    bead("gt-gate", "Decide", type="decision")
    blocks("gt-gate", ids[11])
    bead("gt-out", "Elsewhere")
    blocks("gt-out", ids[7])
    return convoys.create("Chains", ids), ids


@pytest.fixture
def big_chain(routes):
    """The same shape past COLLAPSE_AT beads: a big convoy's page (done waves list no links,
    the bead table is capped)."""
    ids = [bead(f"gt-b{i:03d}").id for i in range(selectors.COLLAPSE_AT + 30)]
    for i in range(3, len(ids)):
        blocks(ids[i - 3], ids[i])
    bead("gt-gate", "Decide", type="decision")
    blocks("gt-gate", ids[-1])
    bead("gt-out", "Elsewhere")
    blocks("gt-out", ids[7])
    return convoys.create("Long chains", ids), ids


def same_as_fresh(convoy, seq):
    carried = snapshots.kept(convoy, seq)
    assert carried is not None
    fresh = snapshots.load(convoy, timezone.now())
    for name in FIELDS:
        assert getattr(carried, name) == getattr(fresh, name), name
    # the graph carried forward (patched with the beads re-read) equals one built afresh
    _, _, graph, waves, gated = selectors.convoy_graph(convoy, carried)
    _, _, built, built_waves, built_gated = selectors.convoy_graph(convoy)
    assert {i: asdict(n) for i, n in graph.nodes.items()} == {
        i: asdict(n) for i, n in built.nodes.items()
    }
    assert sorted(graph.graph.edges) == sorted(built.graph.edges)
    assert (waves, gated, graph.ghost_edges, graph.ghosts) == (
        built_waves,
        built_gated,
        built.ghost_edges,
        built.ghosts,
    )
    # the causes carried forward (the beads the events touched read again) equal a fresh read
    kept = carried.derived["kept"]["causes"]
    loaded = causes.for_convoy(convoy, timezone.now(), known=fresh)

    def untimed(found):  # a silent worker's rescue is due by a time counted from now
        return {i: {k: v for k, v in c.items() if k != "rescue_by"} for i, c in found.items()}

    assert untimed(kept) == untimed(loaded)
    assert (kept.blockers, kept.limited) == (loaded.blockers, loaded.limited)
    if "summary" in carried.derived["kept"]:  # the head's counts and the stranded verdict
        kept_summary = carried.derived["kept"]["summary"].summary
        summary = selectors._after_grace(convoy, kept_summary, timezone.now())  # as pages show it
        fresh_summary = selectors.convoy_summary(
            convoy, fresh.tracked, fresh.beads, timezone.now(), fresh
        )[0]
        assert summary == fresh_summary
    if "loaded" in carried.derived["kept"]:  # the statuses the summary counts
        assert carried.derived["kept"]["loaded"] == selectors._statuses(fresh.beads, fresh.beads)
    if "cooling" in carried.derived["kept"]:  # the ready beads the feeders skip
        assert carried.derived["kept"]["cooling"] == selectors._cooling(fresh.ready, timezone.now())
    if "samples" in carried.derived["kept"]:  # and the ETA's samples
        assert carried.derived["kept"]["samples"] == selectors.samples(fresh.beads.values())
    # so does the timeline of each wave drawn (its drawn beads' spans re-read, its axis moved)
    user = User.objects.get(username="admin")
    page = selectors.convoy_page(convoy, {}, user, timezone.now(), fresh)
    # and what the page derives per bead: rows, nodes, the wave table
    for name, parts in carried.derived["kept"].items():
        if name.startswith("parts:"):
            drawn = fresh.derived["kept"][name]
            for field in ("rows", "states", "waves", "frontier", "done"):
                assert untimed_all(getattr(parts, field)) == untimed_all(getattr(drawn, field))
    for name, gantt in carried.derived["kept"].items():
        if name.startswith("gantt:"):
            drawn = timeline.gantt(convoy, page, fresh, {"twave": name[6:]}, timezone.now(), seq)
            assert asdict(gantt) == asdict(drawn)


def untimed_all(value):
    """`value` without the rescue times counted from now (in causes, wherever they are)."""
    if isinstance(value, dict):
        return {k: untimed_all(v) for k, v in value.items() if k != "rescue_by"}
    if isinstance(value, list):
        return [untimed_all(v) for v in value]
    return value


def step(rng, ids):
    """One random thing people or workers do, through the services."""
    target = rng.choice(ids + ["gt-out", "gt-gate"])
    row = Bead.objects.get(pk=target)
    action = rng.choice(
        ["close", "reopen", "work", "release", "title", "fail", "priority", "bury", "reason"]
    )
    if action == "close" and row.status != "closed":
        beads.close_bead(target, actor="test", force=True)
    elif action == "reopen" and row.status == "closed":
        beads.reopen_bead(target, actor="test")
    elif action == "work" and row.status == "open":
        beads.update_bead(target, status="in_progress", assignee="gastown/polecats/nux")
    elif action == "release" and row.status == "in_progress":
        beads.update_bead(target, status="open", assignee="")
    elif action == "title":
        beads.update_bead(target, title=f"Renamed {rng.randrange(1000)}")
    elif action == "bury" and row.status == "open" and rng.random() < 0.3:
        beads.update_bead(target, status="tombstone")
    elif action == "reason" and row.status == "closed":
        beads.update_bead(target, close_reason=f"Reason {rng.randrange(1000)}")
    elif action == "priority":
        beads.update_bead(target, priority=rng.randrange(5))
    elif action == "fail" and row.status == "open" and not row.assignee:
        with transaction.atomic():
            claim = dispatch.claim(row)
        if claim is not None:
            dispatch.run(claim, dispatcher=Refuses())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_carried_snapshots_equal_fresh_loads(chain, admin_user, seed):
    convoy, ids = chain
    client = logged_in(admin_user)
    url = f"/convoys/{convoy.pk}/"
    rng = random.Random(seed)
    page = client.get(url).content.decode()
    seq = as_of(page)
    layout_key = re.search(r'data-layout="([0-9a-f]+)"', page).group(1)
    for number in range(30):
        step(rng, ids)
        convoy = Convoy.objects.get(pk=convoy.pk)
        data = live(client, url, since=seq, x_live_layout=layout_key)
        seq = data["seq"]
        same_as_fresh(convoy, seq)
        if number % 6 == 5:  # a reload (which loads afresh) shows what the live page shows
            fresh = client.get(url).content.decode()
            assert_parts_of(fresh, data["fragments"])
            layout_key = re.search(r'data-layout="([0-9a-f]+)"', fresh).group(1)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [4, 5])
def test_a_big_convoys_carried_snapshots_equal_fresh_loads(big_chain, admin_user, seed, settings):
    # Ready work is called stranded once it has waited a feed interval: with none, the badge
    # cannot appear between a live update and the reload that follows it on a slow machine.
    settings.CONVOY_FEED_INTERVAL = 0
    convoy, ids = big_chain
    client = logged_in(admin_user)
    url = f"/convoys/{convoy.pk}/"
    rng = random.Random(seed)
    page = client.get(url).content.decode()
    seq = as_of(page)
    layout_key = re.search(r'data-layout="([0-9a-f]+)"', page).group(1)
    for number in range(40):
        # the first waves, where work happens: some of them complete
        step(rng, ids[: 12 + number])
        data = live(client, url, since=seq, x_live_layout=layout_key)
        seq = data["seq"]
        same_as_fresh(Convoy.objects.get(pk=convoy.pk), seq)
        if number % 10 == 9:
            fresh = client.get(url).content.decode()
            assert_parts_of(fresh, data["fragments"])
            layout_key = re.search(r'data-layout="([0-9a-f]+)"', fresh).group(1)


def test_what_may_change_more_than_rows_loads_afresh(chain, admin_user):
    convoy, ids = chain
    client = logged_in(admin_user)
    url = f"/convoys/{convoy.pk}/"
    seq = as_of(client.get(url).content.decode())
    first = snapshots.kept(convoy, seq)
    beads.update_bead(ids[0], status="in_progress", assignee="gastown/polecats/nux")
    seq = live(client, url, since=seq)["seq"]
    carried = snapshots.kept(convoy, seq)
    assert carried is not first and carried.edges is first.edges  # carried, not loaded
    assert carried.derived["graph"][1] is first.derived["graph"][1]  # waves kept, graph patched
    blocks(ids[0], ids[1])  # a new dependency: loaded afresh
    seq = live(client, url, since=seq)["seq"]
    assert snapshots.kept(convoy, seq).edges is not carried.edges
    same_as_fresh(convoy, seq)
    rig = Bead.objects.get(pk=ids[2]).rig_id
    rigs.set_rig_state(rig, Rig.PARKED, actor="test")  # a rig's state: loaded afresh
    parked = live(client, url, since=seq)
    same_as_fresh(convoy, parked["seq"])
    assert last_seq() == parked["seq"]


def test_a_dead_workers_bead_is_never_carried(chain, admin_user, settings):
    """Its readiness changes with a heartbeat, which is no event."""
    convoy, ids = chain
    settings.CONVOY_WORKER_TIMEOUT = 0
    beads.update_bead(ids[0], status="in_progress", assignee="gastown/polecats/nux")
    client = logged_in(admin_user)
    url = f"/convoys/{convoy.pk}/"
    seq = as_of(client.get(url).content.decode())
    assert snapshots.kept(convoy, seq).valid_until <= timezone.now()
    beads.update_bead(ids[1], title="Renamed")
    seq = live(client, url, since=seq)["seq"]
    assert snapshots.kept(convoy, seq).edges is not None
    same_as_fresh(convoy, seq)


def test_causes_are_carried_for_bead_events_and_read_afresh_otherwise(
    chain, admin_user, monkeypatch
):
    """A live update after a bead's own event re-reads the causes of that bead and the beads
    it blocks only; a convoy's event (a pause) may change every cause: all are read again."""
    convoy, ids = chain
    client = logged_in(admin_user)
    url = f"/convoys/{convoy.pk}/"
    seq = as_of(client.get(url).content.decode())
    loads = []
    real = causes.load
    monkeypatch.setattr(
        causes,
        "load",
        # the page's loads (the writer's read model asks without capacity queues)
        lambda bead_ids, *a, **k: (
            (k.get("queues", True) and loads.append(list(bead_ids))) or real(bead_ids, *a, **k)
        ),
    )
    drawn = []
    real_spans = timeline._spans
    monkeypatch.setattr(
        timeline, "_spans", lambda c, s, b, u: drawn.append(list(b)) or real_spans(c, s, b, u)
    )
    beads.update_bead(ids[0], status="in_progress", assignee="gastown/polecats/nux")
    seq = live(client, url, since=seq)["seq"]
    assert loads == [[ids[0], ids[3]]]  # the bead and the one it blocks
    assert drawn == [[ids[0]]]  # of the timeline's wave (the first), the bead's spans only
    same_as_fresh(Convoy.objects.get(pk=convoy.pk), seq)
    loads.clear()
    drawn.clear()
    controls.pause(convoy.pk, actor="test", reason="hold")
    seq = live(client, url, since=seq)["seq"]
    assert loads == [ids]  # every tracked bead
    assert drawn == []  # a pause moves no bead's spans: the timeline only redrawn
    same_as_fresh(Convoy.objects.get(pk=convoy.pk), seq)


def test_an_event_the_page_does_not_show_is_counted_once(chain, admin_user, monkeypatch):
    """The time slider's steps (the timeline's event count) are counted as of the seq the
    page shows: an event committed after the page read its seq, before it drew the timeline,
    is counted once, by the live update that shows it (it was counted twice: the slider's
    end jumped back on a later update)."""
    convoy, ids = chain
    client = logged_in(admin_user)
    url = f"/convoys/{convoy.pk}/"
    beads.update_bead(ids[0], title="Renamed")
    behind = last_seq() - 1
    monkeypatch.setattr(views, "last_seq", lambda: behind)  # read before that event committed
    page = client.get(url).content.decode()
    monkeypatch.undo()
    assert as_of(page) == behind

    def steps(html):
        return int(re.search(r'data-steps="(\d+)"', html).group(1))

    data = live(client, url, since=behind)
    assert steps(data["fragments"]["gantt-card"]) == steps(page) + 1
    assert steps(data["fragments"]["gantt-card"]) == steps(client.get(url).content.decode())
