"""`beads sync` after a trial user's findings: a dispatch claim of ours stands
through a source change that does not touch the fields it writes; a source no longer
configured can be forgotten (its records become local); a record moving from one source to
another says so (event, report, dashboard)."""

import io
import json
import logging
import shutil
import subprocess
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from convoys.models import Bead, Event, SourcedRecord, SyncMemo, SyncSource
from convoys.services import bdsync, beads, dispatch, leases

from .support.sync import rewrite, run_sync

pytestmark = pytest.mark.django_db

LATER = "2026-11-30T10:00:00Z"


def claim(bead_id):
    """Our claim of a bead, as the feeder makes it: hooked, a worker as its assignee."""
    won = dispatch.claim(Bead.objects.get(pk=bead_id), path="manual", actor="test")
    assert won is not None
    return won.worker


def hook(bead_id):
    bead = Bead.objects.get(pk=bead_id)
    return bead.status, bead.assignee


def dashboard(client):
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    return client.get("/").content.decode()


# --- 1. a claim of ours stands through a change that does not touch it ---------------------


@pytest.mark.parametrize(
    "edit",
    [{"labels": ["urgent"]}, {"title": "Lay the track, quickly"}, {"priority": 0}],
    ids=["label", "title", "priority"],
)
def test_a_claim_stands_through_a_source_change_of_other_fields(synced, edit):
    worker = claim("gt-s0")
    rewrite(synced, "gt-s0", updated_at=LATER, **edit)
    [report] = run_sync(synced)
    assert report["updated"] == 1
    bead = Bead.objects.get(pk="gt-s0")
    assert hook("gt-s0") == ("hooked", worker)  # the claim stands
    for name, value in edit.items():  # the source's other fields are applied
        assert getattr(bead, name) == value
    # So the feeder does not sling it a second time: a second claim loses.
    assert dispatch.claim(bead, path="manual", actor="test") is None
    [event] = Event.objects.filter(bead_id="gt-s0", kind="bead.updated")
    assert "status" not in event.data["changes"] and "assignee" not in event.data["changes"]
    run_sync(synced)  # and the next, unchanged pass keeps it too
    assert hook("gt-s0") == ("hooked", worker)


@pytest.mark.parametrize(
    "edit, expected",
    [
        ({"status": "closed", "closed_at": LATER}, ("closed", "")),
        (
            {"status": "hooked", "assignee": "gastown/polecats/other"},
            ("hooked", "gastown/polecats/other"),
        ),
        ({"assignee": "someone"}, ("open", "someone")),
    ],
    ids=["closed", "hooked-elsewhere", "reassigned"],
)
def test_a_source_change_of_a_claimed_field_wins(synced, edit, expected):
    claim("gt-s0")
    rewrite(synced, "gt-s0", updated_at=LATER, title="Renamed in bd", **edit)
    run_sync(synced)
    assert hook("gt-s0") == expected
    assert Bead.objects.get(pk="gt-s0").title == "Renamed in bd"


def test_once_the_source_showed_the_hook_a_later_unhook_wins(synced):
    worker = claim("gt-s0")
    rewrite(synced, "gt-s0", status="hooked", assignee=worker, updated_at=LATER)
    run_sync(synced)  # bd shows our hook
    assert hook("gt-s0") == ("hooked", worker)
    # bd unhooks it (the pre-claim values again): a change in the source, which wins.
    rewrite(synced, "gt-s0", status="open", assignee="", updated_at="2026-11-30T11:00:00Z")
    run_sync(synced)
    assert hook("gt-s0") == ("open", "")


def test_a_released_claim_leaves_the_source_record_whole(synced):
    claim("gt-s0")
    Bead.objects.filter(pk="gt-s0").update(status="open", assignee="")  # a failed dispatch
    rewrite(synced, "gt-s0", labels=["urgent"], updated_at=LATER)
    run_sync(synced)
    assert hook("gt-s0") == ("open", "")
    assert Bead.objects.get(pk="gt-s0").labels == ["urgent"]


# --- 2. forgetting a source no longer configured -------------------------------------------


def forget(source, *options, synced_ago=3600):
    """`beads sync --forget SOURCE`, its last good pass `synced_ago` seconds back (a source
    synced within a minute is refused: a running process may be syncing it)."""
    SyncSource.objects.filter(name=str(source)).update(
        last_pass_at=timezone.now() - timedelta(seconds=synced_ago)
    )
    out = io.StringIO()
    call_command("beads", "sync", "--forget", str(source), *options, stdout=out)
    return out.getvalue()


def test_a_configured_source_is_not_forgotten(synced, settings):
    settings.CONVOY_SYNC_SOURCES = [str(synced)]
    with pytest.raises(CommandError) as refused:
        forget(synced)
    assert (
        str(refused.value)
        == f"{synced} is in CONVOY_SYNC_SOURCES: take it out before forgetting it"
    )
    assert SourcedRecord.objects.filter(source=str(synced)).count() == 3
    assert SyncSource.objects.filter(name=str(synced)).exists()


def test_an_unknown_source_is_not_forgotten(synced, tmp_path):
    with pytest.raises(CommandError, match="no sync source"):
        forget(tmp_path / "elsewhere.jsonl")


def test_a_forgotten_source_leaves_its_records_local_and_the_dashboard(synced, client):
    before = {b.id: (b.title, b.status, b.priority) for b in Bead.objects.all()}
    assert str(synced) in dashboard(client)
    output = forget(synced)
    assert output.strip() == f"Forgot {synced}: its 3 records are local now"
    assert {b.id: (b.title, b.status, b.priority) for b in Bead.objects.all()} == before
    assert not SourcedRecord.objects.exists()
    assert not SyncSource.objects.exists() and not SyncMemo.objects.exists()
    events = Event.objects.filter(data__source_forgotten=True)
    assert sorted(e.bead_id for e in events) == ["gt-s0", "gt-s1", "gt-s2"]
    assert {e.data["source"] for e in events} == {str(synced)}
    beads.close_bead("gt-s0", actor="test")  # editable here now
    assert Bead.objects.get(pk="gt-s0").status == "closed"
    assert "Sync sources" not in client.get("/").content.decode()


def test_forget_answers_in_json(synced):
    answer = json.loads(forget(synced, "--json"))
    assert answer == {"forgotten": str(synced), "records": 3, "events": 3}


# --- 3. a record moving from one source to another says so ---------------------------------


def test_a_record_taken_from_another_source_is_an_event_a_report_line_and_on_the_dashboard(
    synced, tmp_path, client
):
    other = tmp_path / "other.jsonl"
    shutil.copy(synced, other)
    rewrite(other, "gt-s2", title="Sell the tickets elsewhere")
    [report] = run_sync(other)
    assert report["taken"] == 3 and report["taken_from"] == {str(synced): 3}
    moves = Event.objects.filter(data__previous_source=str(synced))
    assert sorted(e.bead_id for e in moves) == ["gt-s0", "gt-s1", "gt-s2"]
    assert {e.data["source"] for e in moves} == {str(other)}
    assert set(SourcedRecord.objects.values_list("source", flat=True)) == {str(other)}
    assert SyncSource.objects.get(name=str(other)).taken == 3
    assert "3 taken from another source" in dashboard(client)
    out = io.StringIO()
    rewrite(synced, "gt-s0", title="Lay the track again")
    call_command("beads", "sync", str(synced), stdout=out)  # the newest source wins
    assert f"  took 3 records from {other}" in out.getvalue().splitlines()
    assert Bead.objects.get(pk="gt-s0").title == "Lay the track again"
    [report] = run_sync(synced)  # nothing taken in its next pass
    assert report["taken"] == 0 and report["taken_from"] == {}
    assert SyncSource.objects.get(name=str(synced)).taken == 0


def test_sync_needs_a_source_or_forget(db):
    with pytest.raises(CommandError, match="needs a SOURCE"):
        call_command("beads", "sync")
    with pytest.raises(CommandError, match="--forget SOURCE takes no other"):
        call_command("beads", "sync", "a.jsonl", "--forget", "b.jsonl")


def test_a_source_being_synced_now_is_not_forgotten(synced):
    assert leases.acquire(bdsync.lease_name(str(synced)), "elsewhere:1:1", ttl=60)
    with pytest.raises(CommandError, match="another process is syncing it now"):
        forget(synced)
    assert SourcedRecord.objects.filter(source=str(synced)).count() == 3


# --- 4. the second trial: the docs' recipe, local beads, one-off failures, --forget, output ------


def test_the_docs_town_env_recipe_sets_every_variable(tmp_path):
    readme = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    start = readme.index("cat > town.env <<'ENV'\n")
    recipe = readme[start : readme.index("\nENV\n", start) + len("\nENV\n")]
    script = recipe + "set -a; . ./town.env; set +a\nenv | grep ^CONVOY_\n"
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert done.stderr == ""
    variables = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert variables["CONVOY_SYNC_SOURCES"] == "cmd:bd export --all"
    assert variables["CONVOY_DISPATCH_COMMAND"] == "gt sling {bead} {rig}"
    assert variables["CONVOY_SYNC_INTERVAL"] == "2" and variables["CONVOY_DISPATCHER"] == "command"


def test_a_local_bead_with_a_source_id_is_not_taken(routes, town, client, caplog):
    beads.create_bead("Our own track", bead_id="gt-s0", prefix="gt-")
    before = Event.objects.order_by("-pk").values_list("pk", flat=True).first()
    with caplog.at_level(logging.WARNING, logger="convoys.sync"):  # as the cluster runs it
        report = bdsync.sync(bdsync.source_for(str(town))).as_dict()
    assert report["conflicts"] == 1 and report["conflict_ids"] == ["gt-s0"]
    assert report["created"] == 2  # the rest of the pass proceeds
    bead = Bead.objects.get(pk="gt-s0")
    assert bead.title == "Our own track" and not bead.dependencies.exists()
    assert not SourcedRecord.objects.filter(pk="gt-s0").exists()
    assert not Event.objects.filter(bead_id="gt-s0", pk__gt=before).exists()
    beads.update_bead("gt-s0", title="Still ours", actor="test")  # still editable here
    [warning] = [r for r in caplog.records if "same id" in r.getMessage()]
    assert "gt-s0" in warning.getMessage()
    assert SyncSource.objects.get(name=str(town)).conflicts == 1
    assert "1 local bead with the same id: not taken" in dashboard(client)
    rewrite(town, "gt-s0", title="Lay the track, again")
    [again] = run_sync(town)  # and every later pass, the file changed or not
    assert again["conflicts"] == 1 and again["changed"] == 0
    [again] = run_sync(town)
    assert again["conflicts"] == 1 and again["changed"] == 0
    assert Bead.objects.get(pk="gt-s0").title == "Still ours"
    out = io.StringIO()
    call_command("beads", "sync", str(town), stdout=out)
    assert "  1 local beads with the same id: not taken (gt-s0)" in out.getvalue().splitlines()


def test_records_that_came_from_bd_are_a_sources_to_take(synced, tmp_path):
    """Only beads made here stay local: a forgotten source's records, and beads brought in
    by `beads import`, came from bd, and a source that has them takes them."""
    forget(synced)
    beads.update_bead("gt-s0", title="Edited while local", actor="test")
    other = tmp_path / "other.jsonl"
    shutil.copy(synced, other)
    rewrite(other, "gt-s0", title="Lay the track elsewhere")
    [report] = run_sync(other)
    assert report["conflicts"] == 0 and report["updated"] >= 1
    assert Bead.objects.get(pk="gt-s0").title == "Lay the track elsewhere"
    assert SourcedRecord.objects.get(pk="gt-s0").source == str(other)


def test_a_town_imported_first_is_followed_by_its_source(routes, town):
    call_command("beads", "import", str(town), stdout=io.StringIO())
    imported = Bead.objects.count()
    rewrite(town, "gt-s0", title="Changed in bd after the import")
    [report] = run_sync(town)
    assert report["conflicts"] == 0
    assert SourcedRecord.objects.count() == imported
    assert Bead.objects.get(pk="gt-s0").title == "Changed in bd after the import"


def test_a_one_off_failing_pass_of_an_unconfigured_source_leaves_no_row(db, tmp_path, client):
    with pytest.raises(CommandError, match="No such file"):
        call_command("beads", "sync", str(tmp_path / "nowhere.jsonl"), "--once")
    assert not SyncSource.objects.exists()
    assert "Sync sources" not in dashboard(client)


def test_a_failing_pass_keeps_the_row_of_a_source_once_synced_or_configured(
    synced, settings, tmp_path
):
    synced.write_text("not json\n")
    with pytest.raises(CommandError):
        run_sync(synced)
    assert SyncSource.objects.get(name=str(synced)).error
    nowhere = str(tmp_path / "nowhere.jsonl")
    settings.CONVOY_SYNC_SOURCES = [nowhere]
    with pytest.raises(CommandError):
        run_sync(nowhere)
    assert SyncSource.objects.get(name=nowhere).error


def test_a_source_synced_recently_is_not_forgotten_without_force(synced, settings):
    settings.CONVOY_SYNC_INTERVAL = 10
    with pytest.raises(CommandError) as refused:
        forget(synced, synced_ago=5)
    assert str(refused.value).startswith(
        f"{synced} was synced 5 s ago by a running process: stop it first, or wait"
    )
    assert SourcedRecord.objects.filter(source=str(synced)).count() == 3
    settings.CONVOY_SYNC_INTERVAL = 30  # three intervals when longer than a minute
    with pytest.raises(CommandError, match="was synced 80 s ago"):
        forget(synced, synced_ago=80)
    assert forget(synced, "--force", synced_ago=5).startswith(f"Forgot {synced}")
    assert not SourcedRecord.objects.exists()


def test_every_prints_only_passes_that_changed_something(synced, monkeypatch):
    rounds = iter([None, "change", None, None])

    def stop_after(self, timeout=None):
        step = next(rounds, "stop")
        if step == "change":
            rewrite(synced, "gt-s0", title="Lay the track, faster")
        return step == "stop"

    monkeypatch.setattr(threading.Event, "wait", stop_after)
    out = io.StringIO()
    call_command("beads", "sync", str(synced), "--every", "1", stdout=out)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("Synced")]
    assert len(lines) == 2  # the first pass, and the one that changed a record
    assert "1 updated" in lines[1]


def test_a_failure_is_printed_once_on_the_command_line(db, tmp_path, caplog):
    """The command prints `error: …`; the log line is the cluster's (it would print it too)."""
    nowhere = tmp_path / "nowhere.jsonl"
    with caplog.at_level(logging.DEBUG, logger="convoys.sync"):
        with pytest.raises(CommandError, match="No such file"):
            call_command("beads", "sync", str(nowhere), "--once")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="convoys.sync"):
        with pytest.raises(bdsync.SyncFailed):
            bdsync.sync(bdsync.source_for(str(nowhere)))
    assert [r.levelno for r in caplog.records] == [logging.ERROR]


def test_an_unchanged_pass_logs_at_debug(synced, caplog):
    with caplog.at_level(logging.DEBUG, logger="convoys.sync"):
        bdsync.sync(bdsync.source_for(str(synced)))
    assert [r.levelno for r in caplog.records if "sync pass" in r.getMessage()] == [logging.DEBUG]


def test_show_lists_labels(routes, town):
    rewrite(town, "gt-s0", labels=["urgent", "track"])
    run_sync(town)
    out = io.StringIO()
    call_command("beads", "show", "gt-s0", stdout=out)
    assert "  labels: urgent, track" in out.getvalue().splitlines()


def test_the_cluster_logs_an_unchanged_sync_task_at_debug(caplog):
    """django-q logs each task it ran at INFO: the sync task's (every interval) is at DEBUG."""
    from django_q.conf import logger  # what the cluster's monitor logs with

    with caplog.at_level(logging.INFO, logger="django-q"):
        logger.info("Processed 'convoys.services.bdsync.sync_configured' (sync-tick)")
        logger.info("Processed 'convoys.tasks.feed' (feed)")
    assert [r.getMessage() for r in caplog.records] == ["Processed 'convoys.tasks.feed' (feed)"]
