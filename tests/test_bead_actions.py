"""The bead actions (retry, skip, release, reassign, reopen) on one bead or many: the preview
is what the action then does, a refusal leaves the rest applied, a skip is counted apart."""

import random

import pytest

from convoys.models import Bead, Convoy, Event
from convoys.read import summaries
from convoys.rules.readiness import ready_among
from convoys.services import actions, controls, convoys
from convoys.services import beads as bead_service
from convoys.services.errors import ServiceError
from convoys.services.notify import landing_message

from .support.factories import bead, blocks

pytestmark = pytest.mark.django_db


@pytest.fixture
def town(routes, settings):
    settings.CONVOY_RETRY_COOLDOWN = 0


def _dag(rng, prefix, n):
    ids = [bead(f"{prefix}{i}").id for i in range(n)]
    for j in range(1, n):
        for i in rng.sample(range(j), k=min(j, rng.randint(0, 2))):
            blocks(ids[i], ids[j])
    return ids


def _state(ids):
    return {
        b.pk: (b.status, b.assignee, b.rig_id, b.dispatch_failures)
        for b in Bead.objects.filter(pk__in=ids)
    }


def _claims_hold(outcome, convoy):
    """What the preview said holds after the real action (the feed may have dispatched what
    became ready: ready or hooked both count)."""
    found = outcome.effects
    moved = {b.pk: b for b in Bead.objects.filter(pk__in=[*found.ready, outcome.id])}
    ready = ready_among(list(moved))
    for bead_id in found.ready:
        assert bead_id in ready or moved[bead_id].status == "hooked", (outcome.words, bead_id)
    if found.dispatches_to:
        assert outcome.id in ready or moved[outcome.id].status == "hooked", outcome.words
    convoy.refresh_from_db()
    if found.lands:
        assert convoy.status == "closed", outcome.words
    if found.stays_open:
        assert convoy.status == "open", outcome.words


@pytest.mark.parametrize("seed", range(6))
def test_every_preview_says_what_the_action_then_does(town, seed):
    rng = random.Random(seed)
    ids = _dag(rng, f"gt-r{seed}x", rng.randint(3, 6))
    convoy = convoys.create(f"Random {seed}", ids)
    for bead_id in rng.sample(ids, k=2):
        Bead.objects.filter(pk=bead_id).update(dispatch_failures=rng.randint(0, 3))
    for _ in range(8):
        action = rng.choice(actions.ACTIONS)
        target = rng.choice(ids)
        extra = {"rig": "beads"} if action == "reassign" else {}
        before = _state(ids)
        seq = Event.objects.count()
        preview = actions.run(action, [target], actor="test", dry_run=True, **extra)
        assert _state(ids) == before and Event.objects.count() == seq  # nothing changed
        done = actions.run(action, [target], actor="test", reason="property", **extra)
        (said,), (did,) = preview.outcomes, done.outcomes
        assert (said.ok, said.words) == (did.ok, did.words)
        if did.ok:
            _claims_hold(did, convoy)
            kind = {"retry": "bead.retried", "skip": "bead.skipped"}.get(
                action, f"bead.{action.rstrip('e')}ed"
            )
            event = Event.objects.filter(bead_id=target, kind=kind).latest("seq")
            assert (event.actor, event.data["reason"], event.data["words"]) == (
                "test",
                "property",
                did.words,
            )
        else:
            assert _state([target]) == {k: v for k, v in before.items() if k == target}


def test_a_refusal_in_the_middle_leaves_the_others_applied(
    town, django_capture_on_commit_callbacks
):
    for bead_id in ("gt-b1", "gt-b2", "gt-b3"):
        bead(bead_id)
    bead("gt-b4")
    blocks("gt-b1", "gt-b4")
    blocks("gt-b3", "gt-b4")
    beads_done = Bead.objects.filter(pk="gt-b2")
    beads_done.update(status="closed")
    convoy = convoys.create("Batch", ["gt-b1", "gt-b2", "gt-b3", "gt-b4"])
    fed = []
    real_feed = actions.feed_convoy

    def counting(convoy, path):
        fed.append(convoy.pk)
        return real_feed(convoy, path)

    actions.feed_convoy = counting
    try:
        batch = actions.run(
            "skip", ["gt-b1", "gt-b2", "gt-b3", "gt-b1"], actor="web:ann", reason="dup work"
        )
    finally:
        actions.feed_convoy = real_feed
    assert [(o.id, o.ok) for o in batch.outcomes] == [
        ("gt-b1", True),
        ("gt-b2", False),
        ("gt-b3", True),
    ]
    assert batch.outcomes[1].words == "gt-b2 is closed"
    assert batch.summary == "2 skipped, 1 refused (gt-b2: gt-b2 is closed)"
    assert "makes gt-b4 ready" in batch.outcomes[2].words  # the second skip frees it
    assert "makes" not in batch.outcomes[0].words
    assert fed == [convoy.pk]  # one feed after the batch, not one per bead
    statuses = dict(Bead.objects.values_list("id", "status"))
    assert (statuses["gt-b1"], statuses["gt-b2"], statuses["gt-b3"]) == (
        "skipped",
        "closed",
        "skipped",
    )
    assert statuses["gt-b4"] == "hooked"  # ready, and the feed dispatched it
    event = Event.objects.get(kind="bead.skipped", bead_id="gt-b1")
    assert (event.actor, event.data["reason"]) == ("web:ann", "dup work")
    assert Bead.objects.get(pk="gt-b1").close_reason == "Skipped: dup work"


def test_a_skip_counts_as_skipped_and_the_convoy_lands_listing_it(town):
    bead("gt-s1")
    bead("gt-s2")
    convoy = convoys.create("Skippy", ["gt-s1", "gt-s2"])
    preview = actions.run("skip", ["gt-s1"], actor="test", dry_run=True)
    assert preview.outcomes[0].words.endswith(f"convoy {convoy.pk} stays open")
    actions.run("skip", ["gt-s1"], actor="test", reason="not needed")
    summary = summaries.convoy_summaries([convoy])[convoy.pk]
    assert (summary["done"], summary["skipped"], summary["total"]) == (0, 1, 2)
    # The feed after the skip dispatched the other; its worker closes it: it lands.
    assert Bead.objects.get(pk="gt-s2").status == "hooked"
    bead_service.close_bead("gt-s2", reason="did it", actor="test", force=True)
    convoys.close_if_complete(convoy)
    convoy.refresh_from_db()
    assert convoy.status == "closed"
    summary = summaries.convoy_summaries([convoy])[convoy.pk]
    assert (summary["done"], summary["skipped"], summary["percent_complete"]) == (1, 1, 50)
    status = summaries.convoy_status_json(convoy)
    assert status["completed"] == 1 and status["progress"]["skipped"] == 1
    _, body = landing_message(convoy, convoys.tracked_details([convoy])[convoy.pk])
    assert "Skipped, not needed (1):" in body and "gt-s1  Bead gt-s1  (Skipped: not needed)" in body


def test_skipping_every_bead_lands_the_convoy(town):
    bead("gt-l1")
    bead("gt-l2")
    blocks("gt-l1", "gt-l2")
    convoy = convoys.create("All skipped", ["gt-l1", "gt-l2"])
    preview = actions.run("skip", ["gt-l1", "gt-l2"], actor="test", dry_run=True)
    assert f"lands convoy {convoy.pk}" in preview.outcomes[1].words
    done = actions.run("skip", ["gt-l1", "gt-l2"], actor="test")
    assert [o.words for o in done.outcomes] == [o.words for o in preview.outcomes]
    convoy.refresh_from_db()
    assert convoy.status == "closed"
    assert Event.objects.filter(kind="convoy.landed", convoy_id=convoy.pk).exists()


def test_release_tells_the_worker_through_the_dispatchers_hook(town, settings, tmp_path):
    told = tmp_path / "told"
    settings.CONVOY_DISPATCHER = "command"
    settings.CONVOY_DISPATCH_COMMAND = "true {bead}"
    settings.CONVOY_RELEASE_COMMAND = f"touch {told}"
    bead("gt-w1", assignee="gastown/polecats/nux", status="hooked")
    preview = actions.run("release", ["gt-w1"], actor="test", dry_run=True)
    assert not told.exists()
    assert "tells worker gastown/polecats/nux it lost the bead" in preview.outcomes[0].words
    done = actions.run("release", ["gt-w1"], actor="test")
    assert done.outcomes[0].told == "worker told" and told.exists()
    row = Bead.objects.get(pk="gt-w1")
    assert (row.status, row.assignee) == ("open", "")


def test_without_a_release_hook_the_preview_does_not_claim_the_worker_is_told(town):
    bead("gt-w2", assignee="gastown/polecats/nux", status="hooked")
    preview = actions.run("release", ["gt-w2"], actor="test", dry_run=True).outcomes[0]
    assert "tells worker" not in preview.words
    assert "worker gastown/polecats/nux sees it at its next look (no release hook)" in preview.words
    done = actions.run("release", ["gt-w2"], actor="test").outcomes[0]
    assert done.words == preview.words and done.told == ""


def test_a_preview_says_when_a_paused_or_missing_convoy_sends_nothing(town):
    bead("gt-p1", assignee="gastown/polecats/nux", status="hooked")
    bead("gt-p2", assignee="gastown/polecats/nux", status="hooked")
    convoy = convoys.create("Held", ["gt-p1"])
    controls.pause(convoy.pk, actor="test", reason="hold")
    paused = actions.run("release", ["gt-p1"], actor="test", dry_run=True).outcomes[0].words
    assert f"ready, but {convoy.pk} paused: nothing sends it until a resume" in paused
    assert "dispatches to rig" not in paused
    loose = actions.run("release", ["gt-p2"], actor="test", dry_run=True).outcomes[0].words
    assert "no open convoy tracks it, so nothing sends it but a sling" in loose
    controls.resume(convoy.pk, actor="test")
    resumed = actions.run("release", ["gt-p1"], actor="test", dry_run=True).outcomes[0].words
    assert "dispatches to rig gastown" in resumed


def test_reassign_and_reopen(town):
    bead("gt-m1")
    done = actions.run("reassign", ["gt-m1"], actor="test", rig="beads")
    assert done.outcomes[0].ok and Bead.objects.get(pk="gt-m1").rig_id == "beads"
    again = actions.run("reassign", ["gt-m1"], actor="test", rig="beads")
    assert again.outcomes[0].words == "gt-m1 is on rig beads already"
    elsewhere = actions.run("reassign", ["gt-m1"], actor="test", worker="gastown/polecats/zed")
    assert elsewhere.outcomes[0].words == (
        "worker gastown/polecats/zed works on rig gastown, not beads: reassign the rig first"
    )
    assert Bead.objects.get(pk="gt-m1").assignee == ""
    worker = actions.run("reassign", ["gt-m1"], actor="test", worker="beads/crew/joe")
    row = Bead.objects.get(pk="gt-m1")
    assert worker.outcomes[0].ok and (row.status, row.assignee) == ("hooked", "beads/crew/joe")
    assert actions.run("reopen", ["gt-m1"], actor="test").outcomes[0].words == (
        "gt-m1 is not closed (status: hooked)"
    )
    actions.run("release", ["gt-m1"], actor="test")
    actions.run("skip", ["gt-m1"], actor="test")
    reopened = actions.run("reopen", ["gt-m1"], actor="test")
    assert reopened.outcomes[0].ok and Bead.objects.get(pk="gt-m1").status in ("open", "hooked")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (dict(action="explode", bead_ids=["gt-x"]), "action: one of retry, skip"),
        (dict(action="skip", bead_ids="gt-x"), "ids: expected a list"),
        (dict(action="skip", bead_ids=[]), "ids: give at least one"),
        (dict(action="skip", bead_ids=[1]), "ids: each id is a string"),
        (dict(action="skip", bead_ids=["x"] * 501), "ids: at most 500 beads"),
        (dict(action="reassign", bead_ids=["gt-x"]), "reassign: give a rig or a worker"),
        (dict(action="skip", bead_ids=["gt-x"], rig="beads"), "rig and worker go with reassign"),
        (dict(action="skip", bead_ids=["gt-x"], reason="x" * 501), "reason: at most 500"),
    ],
)
def test_a_bad_request_is_refused_whole(town, call, message):
    bead("gt-x")
    with pytest.raises(ServiceError, match=message):
        actions.run(call.pop("action"), call.pop("bead_ids"), actor="test", **call)
    assert Bead.objects.get(pk="gt-x").status == "open"


def test_odd_ids_are_refused_per_bead(town):
    bead("gt-o1")
    batch = actions.run("skip", ["gt-o1", "", "-rf", "x" * 300, "gt-nope"], actor="test")
    assert [o.ok for o in batch.outcomes] == [True, False, False, False, False]
    assert batch.outcomes[-1].words == "bead 'gt-nope' not found"
    assert Convoy.objects.count() == 0
