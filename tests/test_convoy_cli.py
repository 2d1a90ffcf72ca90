"""The convoy command line through call_command: staging, launch, lifecycle, sling."""

import io
import json
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from convoys.models import Bead, Convoy, Dispatch, Event, TrackedBead
from convoys.services import beads, convoys, rigs

from .support.factories import bead, blocks, child, imported_blocks


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue()


def fails(*args, match=None):
    with pytest.raises(CommandError, match=match):
        run(*args)


@pytest.fixture
def epic(routes):
    """root epic -> a -> b (blocks), c independent; a decision gates nothing."""
    bead("gt-root", "Root epic", type="epic")
    for bead_id in ("gt-a", "gt-b", "gt-c"):
        bead(bead_id)
        child("gt-root", bead_id)
    blocks("gt-a", "gt-b")
    return "gt-root"


def test_stage_epic_creates_staged_convoy_with_waves(epic):
    out = run("convoy", "stage", epic)
    assert out.index("gt-root [epic]") < out.index("Wave   ID")
    assert "3 tasks across 2 waves (max parallelism: 2 in wave 1)" in out
    assert "[orphan] task gt-c" in out
    convoy = Convoy.objects.get()
    assert convoy.status == "staged_warnings" and convoy.id.startswith("hq-cv-")
    assert len(convoy.id) == 11 and convoy.title == "Convoy: Root epic"
    assert sorted(convoy.tracked.values_list("bead_id", flat=True)) == ["gt-a", "gt-b", "gt-c"]
    assert "3 tasks, 2 waves" in convoy.description and "Staged at" in convoy.description
    assert Event.objects.filter(kind="convoy.staged", convoy_id=convoy.id).exists()


def test_stage_json_shape(epic):
    data = json.loads(run("convoy", "stage", epic, "--json"))
    assert set(data) >= {"status", "convoy_id", "restaged", "errors", "warnings", "waves", "tree"}
    assert data["errors"] == [] and data["waves"][1]["tasks"][0] == {
        "id": "gt-b",
        "title": "Bead gt-b",
        "type": "task",
        "rig": "gastown",
        "blocked_by": ["gt-a"],
    }
    assert data["tree"][0]["id"] == "gt-root" and len(data["tree"][0]["children"]) == 3


def test_restage_updates_in_place_and_reports_moves(epic):
    run("convoy", "stage", epic)
    first = Convoy.objects.get()
    blocks("gt-b", "gt-c")
    out = run("convoy", "stage", epic)
    assert "Re-staging existing convoy" in out and "moved gt-c: wave 1 → 3" in out
    assert Convoy.objects.count() == 1 and Convoy.objects.get().pk == first.pk
    out = run("convoy", "stage", first.pk)
    assert f"Convoy updated: {first.pk}" in out
    assert Convoy.objects.count() == 1


def test_stage_cycle_is_an_error_and_creates_nothing(routes):
    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b")
    imported_blocks("gt-b", "gt-a")
    events = Event.objects.count()
    with pytest.raises(CommandError, match="1 error"):
        out = io.StringIO()
        call_command("convoy", "stage", "gt-a", "gt-b", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["status"] == "error" and data["convoy_id"] == ""
    assert data["errors"][0]["category"] == "cycle" and data["waves"] == []
    assert Convoy.objects.count() == 0 and Event.objects.count() == events


def test_stage_no_rig_is_an_error(routes):
    bead("zz-norig")
    fails("convoy", "stage", "zz-norig", match="staging failed")
    assert Convoy.objects.count() == 0


@pytest.mark.parametrize(
    "args,message",
    [
        (["--", "--verbose"], "looks like a CLI flag"),
        (["gt-missing"], "cannot resolve bead gt-missing"),
    ],
)
def test_stage_input_errors(routes, args, message):
    fails("convoy", "stage", *args, match=message)


def test_stage_mixed_and_multiple_epics(epic):
    bead("gt-root2", type="epic")
    fails("convoy", "stage", "gt-root", "gt-a", match="mixed input types")
    fails("convoy", "stage", "gt-root", "gt-root2", match="only one epic ID allowed")


def test_stage_overlap_with_open_convoy_is_an_error(epic):
    convoys.create("Existing", ["gt-a"])
    fails("convoy", "stage", epic, match="open convoy hq-cv-.* already tracks 1 of these beads")


def test_staging_an_open_convoy_is_an_error(epic):
    convoy = convoys.create("Existing", ["gt-a"])
    fails("convoy", "stage", convoy.pk, match="only staged convoys can be re-staged")


def test_launch_dispatches_only_ready_wave1(epic):
    run("convoy", "stage", epic)
    convoy = Convoy.objects.get()
    fails("convoy", "launch", convoy.pk, match="has warnings, use --force")
    assert Convoy.objects.get().status == "staged_warnings"
    data = json.loads(run("convoy", "launch", convoy.pk, "--force", "--json"))
    assert data["status"] == "open"
    assert [d["id"] for d in data["dispatched"]] == ["gt-a", "gt-c"]
    assert all(d["ok"] and d["worker"].startswith("gastown/polecats/") for d in data["dispatched"])
    assert Bead.objects.get(pk="gt-b").status == "open"
    assert Bead.objects.get(pk="gt-a").status == "hooked"
    fails("convoy", "launch", convoy.pk, match="is already launched")


def test_launch_epic_stages_and_launches(routes):
    bead("gt-root", type="epic")
    for bead_id in ("gt-a", "gt-b"):
        bead(bead_id)
        child("gt-root", bead_id)
    blocks("gt-a", "gt-b")
    out = run("convoy", "launch", "gt-root")
    assert "Convoy launched: hq-cv-" in out and "✓ gt-a" in out
    assert "Wave 2: 1 tasks (pending)" in out
    assert Dispatch.objects.filter(path="launch").count() == 1


def test_stage_with_launch_stages_then_launches(routes):
    """`convoy stage X --launch` (the README's one step; it once crashed on a name clash)."""
    bead("gt-root", type="epic")
    for bead_id in ("gt-a", "gt-b"):
        bead(bead_id)
        child("gt-root", bead_id)
    blocks("gt-a", "gt-b")
    out = run("convoy", "stage", "gt-root", "--launch")
    assert "Convoy created: hq-cv-" in out and "✓ gt-a" in out
    assert Convoy.objects.get().status == "open"
    assert list(Dispatch.objects.values_list("bead_id", flat=True)) == ["gt-a"]
    bead("gt-root2", type="epic")
    bead("gt-x")
    child("gt-root2", "gt-x")
    fails("convoy", "stage", "gt-root2", "--launch", match="has warnings, use --force")
    data = json.loads(run("convoy", "stage", "gt-root2", "--launch", "--force", "--json"))
    assert data["stage"]["status"] == "staged_warnings"
    assert [d["id"] for d in data["launch"]["dispatched"]] == ["gt-x"]


def test_launch_skips_closed_and_blocked_with_reasons(routes):
    bead("gt-a")
    bead("gt-done", status="closed")
    bead("gt-ext")
    bead("gt-outside")
    blocks("gt-outside", "gt-ext")  # blocker outside the convoy: still blocks dispatch
    run("convoy", "stage", "gt-a", "gt-done", "gt-ext")
    convoy = Convoy.objects.get()
    data = json.loads(run("convoy", "launch", convoy.pk, "--json"))
    assert [d["id"] for d in data["dispatched"]] == ["gt-a"]
    reasons = {s["id"]: s["reason"] for s in data["skipped"]}
    assert reasons == {"gt-done": "already closed", "gt-ext": "blocked by gt-outside"}


def test_launch_parked_rig_needs_force_and_changes_nothing(routes):
    bead("gt-a")
    run("convoy", "stage", "gt-a")
    convoy = Convoy.objects.get()
    rigs.set_rig_state("gastown", "parked")
    assert Convoy.objects.get().status == "staged_warnings"  # parking re-checked it
    fails("convoy", "launch", convoy.pk, match="parked or docked")
    assert Convoy.objects.get().status == "staged_warnings"


def test_failed_dispatch_does_not_stop_the_others(routes, settings, tmp_path):
    script = tmp_path / "dispatch.py"
    script.write_text(
        "import sys\nif sys.argv[1] == 'gt-a':\n    sys.exit('connection failed')\n"
        "print('started', sys.argv[1])\n"
    )
    settings.CONVOY_DISPATCHER = "command"
    settings.CONVOY_DISPATCH_COMMAND = f"{sys.executable} {script} {{bead}} {{rig}} {{convoy}}"
    for bead_id in ("gt-a", "gt-b", "gt-c"):
        bead(bead_id)
    run("convoy", "stage", "gt-a", "gt-b", "gt-c")
    convoy = Convoy.objects.get()
    out = run("convoy", "launch", convoy.pk)
    assert "✗ gt-a" in out and "connection failed" in out and "✓ gt-b" in out and "✓ gt-c" in out
    a = Bead.objects.get(pk="gt-a")
    assert a.status == "open" and a.assignee == ""  # claim released
    attempt = Dispatch.objects.get(bead_id="gt-b")
    assert attempt.ok and "started gt-b" in attempt.output
    assert Dispatch.objects.get(bead_id="gt-a").error == "connection failed"


def test_transition_table():
    allowed = {
        ("open", "closed"),
        ("closed", "open"),
        ("staged_ready", "open"),
        ("staged_ready", "closed"),
        ("staged_ready", "staged_warnings"),
        ("staged_warnings", "open"),
        ("staged_warnings", "closed"),
        ("staged_warnings", "staged_ready"),
    }
    statuses = ["open", "closed", "staged_ready", "staged_warnings"]
    for cur in statuses:
        for tgt in statuses:
            if cur == tgt or (cur, tgt) in allowed:
                assert convoys.check_transition(cur, tgt) == tgt
            else:
                with pytest.raises(convoys.ServiceError, match="illegal convoy status transition"):
                    convoys.check_transition(cur, tgt)
    assert convoys.check_transition(" CLOSED ", "open") == "open"
    with pytest.raises(convoys.ServiceError, match='unsupported convoy status "archived"'):
        convoys.check_transition("open", "archived")


def test_create_rules(routes):
    bead("gt-a", "First task")
    out = run("convoy", "create", "gt-a")
    assert "First task" in out
    fails("convoy", "create", "--", "--force", match="looks like a CLI flag")
    fails("convoy", "create", "Name", "gt-a", "--merge", "x", match='invalid --merge value "x"')
    bead("gt-e", type="epic")
    bead("gt-s", type="epic")
    bead("gt-l")
    child("gt-e", "gt-s")
    child("gt-s", "gt-l")
    data = json.loads(run("convoy", "create", "--from-epic", "gt-e", "--json"))
    assert [t["id"] for t in data["tracked"]] == ["gt-l"]
    fails("convoy", "create", "--from-epic", "gt-a", match="is not an epic")


def test_check_never_completes_empty_or_unknown(routes):
    empty = convoys.create("Empty")
    unknown = convoys.create("Unknown", ["gt-nowhere"])
    assert "never complete" in run("convoy", "check", empty.pk)
    assert "unknown" in run("convoy", "check", unknown.pk)
    assert set(Convoy.objects.values_list("status", flat=True)) == {"open"}


def test_check_closes_complete_convoy_and_add_reopens_it(
    routes, django_capture_on_commit_callbacks
):
    bead("gt-a")
    convoy = convoys.create("Work", ["gt-a"])
    with django_capture_on_commit_callbacks(execute=True):
        beads.close_bead("gt-a")
    convoy.refresh_from_db()
    assert convoy.status == "closed"  # the event feeder already landed it
    assert convoy.close_reason == "All tracked issues completed"
    assert convoy.completion_notified_at is not None
    bead("gt-b")
    out = run("convoy", "add", convoy.pk, "gt-b")
    assert "↺ Reopened convoy" in out and "Added 1 issue(s)" in out
    convoy.refresh_from_db()
    assert convoy.status == "open" and convoy.completion_notified_at is None


def test_close_and_land(routes):
    bead("gt-a")
    convoy = convoys.create("Work", ["gt-a"])
    fails("convoy", "close", convoy.pk, match="convoy has 1 open issue")
    out = run("convoy", "close", convoy.pk, "--force", "--reason", "abandoned")
    assert "Reason: abandoned" in out and "1 still open" in out
    assert "already closed" in run("convoy", "close", convoy.pk)
    plain = convoys.create("Plain", ["gt-a"])
    fails("convoy", "land", plain.pk, match="is not an owned convoy")
    owned = convoys.create("Owned", ["gt-a"], owned=True)
    out = run("convoy", "land", owned.pk, "--force")
    assert "Landed convoy" in out
    assert Convoy.objects.get(pk=owned.pk).close_reason == "Landed by owner"


def test_status_and_list(routes):
    bead("gt-a")
    bead("gt-b", status="closed")
    convoy = convoys.create("Work", ["gt-a", "gt-b", "gt-zz"])
    data = json.loads(run("convoy", "status", convoy.pk, "--json"))
    assert (data["completed"], data["total"]) == (1, 3)
    assert data["tracked"][2] == {
        "id": "gt-zz",
        "title": "",
        "status": "unknown",
        "issue_type": "",
        "assignee": "",
        "rig": "",
        "worker_seen": None,
        "source": None,
        "missing_from_source": False,
        "cause": {"kind": "unknown", "text": "not in the store"},
        "merge": None,
    }
    out = run("convoy", "status", convoy.pk)
    assert "✓ gt-b" in out and "● gt-a" in out and "? gt-zz" in out
    listing = json.loads(run("convoy", "list", "--json"))
    assert listing[0]["id"] == convoy.pk
    assert "├──" in run("convoy", "list", "--tree")


def test_sling_single_and_batch(routes):
    bead("gt-a", "Solo")
    out = run("sling", "gt-a")
    assert "Work: Solo" in out and "✓ gt-a" in out
    bead("gt-b")
    bead("gt-c")
    out = run("sling", "gt-b", "gt-c")
    assert "Batch: 2 beads to gastown" in out
    bead("gt-d")
    fails("sling", "gt-d", "gt-b", match="gt-b is already tracked by convoy")


def test_sling_rig_resolution_errors(routes):
    bead("gt-a")
    bead("bd-b")
    bead("hq-c")
    bead("zz-d")
    fails("sling", "gt-a", "bd-b", match="beads resolve to different rigs")
    fails("sling", "hq-c", match='prefix "hq-" is not mapped to any rig')
    fails("sling", "zz-d", match='prefix "zz-" is not mapped')
    with pytest.raises(CommandError) as exc:
        run("sling", "gt-a", "bd-b")
    assert "--force" not in str(exc.value)


def test_stranded_json(routes, settings):
    bead("gt-a")
    convoy = convoys.create("Work", ["gt-a"])
    data = json.loads(run("convoy", "stranded", "--json"))
    assert data == [
        {
            "id": convoy.pk,
            "title": "Work",
            "tracked_count": 1,
            "ready_count": 1,
            "ready_issues": ["gt-a"],
            "created_at": convoy.created_at.isoformat(),
        }
    ]


def test_stage_real_epic_gt_si8rq(db):
    from convoys.services import jsonl

    from .support.paths import shared_file

    jsonl.import_file(shared_file("steveyegge+gastown+issues.jsonl"))
    rigs.upsert_route("gt-", "gastown/mayor/rig")
    data = json.loads(run("convoy", "stage", "gt-si8rq", "--json"))
    assert [[t["id"] for t in w["tasks"]] for w in data["waves"]] == [
        ["gt-si8rq.1", "gt-si8rq.2", "gt-si8rq.4", "gt-si8rq.8"],
        ["gt-si8rq.3", "gt-si8rq.7", "gt-si8rq.9"],
        ["gt-hibbj", "gt-si8rq.5", "gt-si8rq.6"],
        ["gt-4u49x", "gt-si8rq.10"],
    ]
    assert len(data["tree"][0]["children"]) == 12
    assert TrackedBead.objects.count() == 12


def test_list_and_status_print_statuses_in_the_pages_words(routes):
    from .support.factories import staged_on_parked_rig

    plan = staged_on_parked_rig()
    listing = run("convoy", "list")
    assert "staged with warnings" in listing and "staged_warnings" not in listing
    status = run("convoy", "status", plan.convoy_id)
    assert "Status: staged with warnings" in status and "staged_warnings" not in status
    assert json.loads(run("convoy", "list", "--json"))[0]["status"] == "staged_warnings"
    rigs.set_rig_state("gastown", "active", actor="test")
    bead("gt-more")
    staged = run("convoy", "stage", "gt-more")
    assert "(staged, ready to launch)" in staged and "staged_ready" not in staged
