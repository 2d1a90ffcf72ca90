"""`sling` through call_command: container expansion, refusals of what must never be
dispatched, --force recorded on the dispatch."""

import io
import json
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from convoys.models import Bead, Convoy, Dispatch, Event, TrackedBead
from convoys.services import beads, convoys, rigs, staging

from .support.factories import bead, blocks, child


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    assert err.getvalue() == ""
    return out.getvalue()


def run_json(*args):
    return json.loads(run(*args, "--json"))


def refused(*args, match):
    """The command fails with `match` and writes nothing: no event, convoy or dispatch."""
    before = (Event.objects.count(), Convoy.objects.count(), Dispatch.objects.count())
    with pytest.raises(CommandError, match=match) as exc:
        run(*args)
    assert (Event.objects.count(), Convoy.objects.count(), Dispatch.objects.count()) == before
    return str(exc.value)


@pytest.fixture
def mixed(routes):
    """An open convoy tracking one bead of every kind sling must tell apart."""
    bead("gt-a", "Ready")
    bead("gt-b", "Blocked")
    blocks("gt-a", "gt-b")
    bead("gt-c", status="closed")
    bead("gt-d", status="hooked", assignee="gastown/polecats/live")
    beads.heartbeat("gastown/polecats/live")
    bead("gt-e", "Go or no-go", type="decision")
    bead("gt-f", "Also ready", priority=0)
    return convoys.create("Mixed", ["gt-a", "gt-b", "gt-c", "gt-d", "gt-e", "gt-nowhere", "gt-f"])


def test_sling_convoy_dispatches_each_ready_bead_and_lists_the_others(mixed):
    data = run_json("sling", mixed.pk)
    assert data["convoy_id"] == mixed.pk
    assert [(d["id"], d["ok"], d["forced"]) for d in data["dispatched"]] == [
        ("gt-a", True, False),
        ("gt-f", True, False),
    ]
    assert all(d["worker"].startswith("gastown/polecats/") for d in data["dispatched"])
    assert data["skipped"] == [
        {"id": "gt-b", "reason": "blocked by gt-a"},
        {"id": "gt-c", "reason": "already closed"},
        {"id": "gt-d", "reason": "already hooked (gastown/polecats/live)"},
        {"id": "gt-e", "reason": 'non-slingable type "decision"'},
        {"id": "gt-nowhere", "reason": "not in the database"},
    ]
    # The container is the convoy: no auto-convoy, one dispatch per ready bead, all its own.
    assert Convoy.objects.count() == 1
    assert sorted(Dispatch.objects.values_list("bead_id", "convoy_id", "path")) == [
        ("gt-a", mixed.pk, "batch"),
        ("gt-f", mixed.pk, "batch"),
    ]
    assert Bead.objects.get(pk="gt-b").status == "open"
    assert Bead.objects.get(pk="gt-d").assignee == "gastown/polecats/live"


def test_sling_convoy_text_and_a_second_sling_dispatches_nothing_twice(mixed):
    out = run("sling", mixed.pk)
    assert f"→ Convoy 🚚 {mixed.pk}: Mixed (its own container)" in out
    assert "✓ gt-a → gastown/polecats/" in out
    assert "○ gt-b skipped: blocked by gt-a" in out
    assert "📊 Convoy sling complete: 2/2 dispatched, 5 skipped" in out
    again = run_json("sling", mixed.pk)
    assert again["dispatched"] == []
    assert {s["id"]: s["reason"] for s in again["skipped"]}["gt-a"].startswith("already hooked")
    assert Dispatch.objects.count() == 2


def test_sling_convoy_one_failure_does_not_stop_the_others(routes, settings, tmp_path):
    script = tmp_path / "dispatch.py"
    script.write_text("import sys\nif sys.argv[1] == 'gt-a':\n    sys.exit('connection failed')\n")
    settings.CONVOY_DISPATCHER = "command"
    settings.CONVOY_DISPATCH_COMMAND = f"{sys.executable} {script} {{bead}}"
    for bead_id in ("gt-a", "gt-b", "gt-c"):
        bead(bead_id)
    convoy = convoys.create("Three", ["gt-a", "gt-b", "gt-c"])
    out = run("sling", convoy.pk)
    assert "✗ gt-a → connection failed" in out and "✓ gt-b" in out and "✓ gt-c" in out
    assert "📊 Convoy sling complete: 2/3 dispatched, 0 skipped" in out
    assert Dispatch.objects.filter(bead_id="gt-a").get().error == "connection failed"
    assert Dispatch.objects.count() == 3  # one attempt each
    a = Bead.objects.get(pk="gt-a")
    assert (a.status, a.assignee) == ("open", "")  # its claim released, the others kept


def test_sling_convoy_force_dispatches_blocked_beads_and_says_so(mixed):
    data = run_json("sling", mixed.pk, "--force")
    assert [(d["id"], d["forced"]) for d in data["dispatched"]] == [
        ("gt-a", False),
        ("gt-b", True),
        ("gt-f", False),
    ]
    # --force overrides blockers only: closed, busy, non-slingable and missing stay skipped.
    assert [s["id"] for s in data["skipped"]] == ["gt-c", "gt-d", "gt-e", "gt-nowhere"]
    assert Dispatch.objects.get(bead_id="gt-b").forced
    assert not Dispatch.objects.get(bead_id="gt-a").forced
    event = Event.objects.get(kind="bead.dispatched", bead_id="gt-b")
    assert event.data["forced"] is True and event.convoy_id == mixed.pk


def test_sling_convoy_force_names_what_still_stops_a_blocked_bead(routes):
    bead("gt-a")
    bead("bd-b")
    blocks("gt-a", "bd-b")
    convoy = convoys.create("Two rigs", ["gt-a", "bd-b"])
    rigs.set_rig_state("beads", "parked")
    data = run_json("sling", convoy.pk, "--force")
    assert data["skipped"] == [{"id": "bd-b", "reason": "rig beads is parked"}]


def test_sling_convoy_keeps_max_in_flight(routes):
    for bead_id in ("gt-a", "gt-b", "gt-c"):
        bead(bead_id)
    convoy = convoys.create("Narrow", ["gt-a", "gt-b", "gt-c"], max_in_flight=2)
    data = run_json("sling", convoy.pk)
    assert [d["id"] for d in data["dispatched"]] == ["gt-a", "gt-b"]
    assert data["skipped"] == [{"id": "gt-c", "reason": "convoy at max in flight (2)"}]
    assert run_json("sling", convoy.pk)["dispatched"] == []


def test_sling_convoy_refusals(routes):
    bead("gt-a")
    bead("gt-b")
    staged = staging.stage(["gt-a"], actor="test")
    refused("sling", staged.convoy_id, match=r"is staged \(staged_ready\): launch it")
    empty = convoys.create("Empty")
    refused("sling", empty.pk, match="tracks no beads")
    done = convoys.create("Done", ["gt-b"])
    convoys.close(done.pk, force=True)
    refused("sling", done.pk, match=f"convoy {done.pk} is closed")
    refused("sling", staged.convoy_id, "gastown", match="give no rig, --owned or --merge")
    refused("sling", staged.convoy_id, "--owned", match="give no rig")
    refused("sling", "gt-a", done.pk, match=f"'{done.pk}' is a convoy: sling it on its own")


def test_sling_epic_is_refused_with_a_stage_hint(routes):
    bead("gt-root", type="epic")
    bead("gt-a")
    child("gt-root", "gt-a")
    message = refused("sling", "gt-root", match="is an epic")
    assert "convoy stage gt-root" in message
    refused("sling", "gt-root", "--force", match="is an epic")
    refused("sling", "gt-a", "gt-root", match="is an epic")  # nothing of the batch either


@pytest.mark.parametrize("bead_type", ["decision", "convoy", "message", "molecule", "gate"])
def test_sling_refuses_non_slingable_types_even_with_force(routes, bead_type):
    bead("gt-x", type=bead_type)
    refused("sling", "gt-x", match=f'non-slingable type "{bead_type}"')
    refused("sling", "gt-x", "--force", match="non-slingable type")


@pytest.mark.parametrize("bead_type", ["task", "bug", "feature", "chore", ""])
def test_sling_accepts_slingable_types(routes, bead_type):
    bead("gt-x", type=bead_type)
    assert run_json("sling", "gt-x", "--no-convoy")["dispatched"][0]["ok"]


def test_sling_refuses_open_blockers_naming_them_and_force_is_recorded(routes):
    bead("gt-a")
    bead("gt-m")
    bead("gt-b")
    blocks("gt-a", "gt-b")
    blocks("gt-m", "gt-b", "merge-blocks")
    message = refused("sling", "gt-b", match="bead gt-b has open blockers: ")
    assert "gt-a" in message and "gt-m" in message and "--force" in message
    beads.close_bead("gt-a")
    beads.close_bead("gt-m", reason="Merged in abc123")
    assert run_json("sling", "gt-b")["dispatched"][0]["forced"] is False
    bead("gt-c")
    bead("gt-d")
    blocks("gt-c", "gt-d", "waits-for")
    refused("sling", "gt-d", match="bead gt-d has open blockers: gt-c")
    data = run_json("sling", "gt-d", "--force")
    assert data["dispatched"][0]["ok"] and data["dispatched"][0]["forced"] is True
    attempt = Dispatch.objects.get(bead_id="gt-d")
    assert attempt.forced and attempt.path == "manual"
    assert TrackedBead.objects.filter(bead_id="gt-d", convoy_id=data["convoy_id"]).exists()
    out = run("sling", "gt-c")
    assert "forced" not in out and not Dispatch.objects.get(bead_id="gt-c").forced


def test_sling_blockers_outside_the_rule_do_not_block(routes):
    """Only the four blocking types with an unfinished target block (readiness.py):
    parent-child, related and discovered-from do not, nor a blocker that is not in the
    database, nor a tombstone."""
    bead("gt-p", type="epic")
    bead("gt-r")
    bead("gt-q")
    bead("gt-t", status="tombstone")
    bead("gt-x")
    child("gt-p", "gt-x")
    blocks("gt-r", "gt-x", "related")
    blocks("gt-q", "gt-x", "discovered-from")
    blocks("gt-t", "gt-x")
    blocks("gt-ghost", "gt-x")
    assert run_json("sling", "gt-x")["dispatched"][0]["ok"]


def test_batch_sling_refuses_a_bead_blocked_by_another_of_the_batch(routes):
    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b")
    refused("sling", "gt-a", "gt-b", match="bead gt-b has open blockers: gt-a")
    data = run_json("sling", "gt-a", "gt-b", "--force")
    assert [(d["id"], d["forced"]) for d in data["dispatched"]] == [
        ("gt-a", False),
        ("gt-b", True),
    ]
    assert Convoy.objects.get().title == "Batch: 2 beads to gastown"
