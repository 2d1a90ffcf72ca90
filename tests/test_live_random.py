"""A convoy page's live updates equal a reload, through random sequences of what people and
workers do (through the services): each live update is asked after one action, and every few
actions a fresh render of the page must hold every fragment the live page was sent."""

import random
import re

import pytest
from django.db import transaction

from convoys.infra.dispatchers import Outcome
from convoys.log.events import last_seq
from convoys.models import Bead, Rig
from convoys.read import sizes
from convoys.services import beads, controls, convoys, dispatch, rigs
from convoys.web import context

from .support.factories import bead, blocks
from .support.pages import as_of, assert_parts_of, live
from .support.users import logged_in


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
    ids = [bead(f"gt-b{i:03d}").id for i in range(sizes.COLLAPSE_AT + 30)]
    for i in range(3, len(ids)):
        blocks(ids[i - 3], ids[i])
    bead("gt-gate", "Decide", type="decision")
    blocks("gt-gate", ids[-1])
    bead("gt-out", "Elsewhere")
    blocks("gt-out", ids[7])
    return convoys.create("Long chains", ids), ids


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


def walk(client, url, ids, rng, steps, reload_every, reach=None):
    """`steps` random actions, each followed by the live update a page open at `url` asks
    for; every `reload_every` steps a reload shows what the live page shows."""
    page = client.get(url).content.decode()
    seq = as_of(page)
    layout_key = re.search(r'data-layout="([0-9a-f]+)"', page).group(1)
    for number in range(steps):
        step(rng, ids if reach is None else ids[: reach(number)])
        data = live(client, url, since=seq, x_live_layout=layout_key)
        assert data["seq"] >= seq
        seq = data["seq"]
        if number % reload_every == reload_every - 1:
            fresh = client.get(url).content.decode()
            assert_parts_of(fresh, data["fragments"])
            layout_key = re.search(r'data-layout="([0-9a-f]+)"', fresh).group(1)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_live_updates_equal_reloads(chain, admin_user, seed, settings):
    settings.CONVOY_FEED_INTERVAL = 0  # as below: no badge may appear between update and reload
    convoy, ids = chain
    walk(logged_in(admin_user), f"/convoys/{convoy.pk}/", ids, random.Random(seed), 30, 3)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [4, 5])
def test_a_big_convoys_live_updates_equal_reloads(big_chain, admin_user, seed, settings):
    # Ready work is called stranded once it has waited a feed interval: with none, the badge
    # cannot appear between a live update and the reload that follows it on a slow machine.
    settings.CONVOY_FEED_INTERVAL = 0
    convoy, ids = big_chain
    client = logged_in(admin_user)
    # the first waves, where work happens: some of them complete
    walk(client, f"/convoys/{convoy.pk}/", ids, random.Random(seed), 40, 5, lambda n: 12 + n)


def test_a_live_update_after_a_pause_and_a_new_dependency_equals_a_reload(chain, admin_user):
    """What changes more than bead rows (a convoy's pause, a new dependency, a rig parked)."""
    convoy, ids = chain
    client = logged_in(admin_user)
    url = f"/convoys/{convoy.pk}/"
    seq = as_of(client.get(url).content.decode())
    for change in (
        lambda: controls.pause(convoy.pk, actor="test", reason="hold"),
        lambda: blocks(ids[0], ids[1]),
        lambda: rigs.set_rig_state(Bead.objects.get(pk=ids[2]).rig_id, Rig.PARKED, actor="test"),
    ):
        change()
        data = live(client, url, since=seq)
        seq = data["seq"]
        assert seq == last_seq()
        assert_parts_of(client.get(url).content.decode(), data["fragments"])


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
    monkeypatch.setattr(context, "last_seq", lambda: behind)  # read before that event committed
    page = client.get(url).content.decode()
    monkeypatch.undo()
    assert as_of(page) == behind

    def steps(html):
        return int(re.search(r'data-steps="(\d+)"', html).group(1))

    data = live(client, url, since=behind)
    assert steps(data["fragments"]["gantt-card"]) == steps(page) + 1
    assert steps(data["fragments"]["gantt-card"]) == steps(client.get(url).content.decode())
