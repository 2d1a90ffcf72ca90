"""`manage.py beads sync`: a bd JSONL file or `cmd:` source mirrored pass by pass,
only what changed written, through the import service, each change with its event."""

import io
import json
import shlex
import signal
import subprocess
import sys
import threading
from unittest.mock import patch

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from convoys.models import Bead, Convoy, Dispatch, Event, SourcedRecord, SyncSource
from convoys.services import bdsync, leases, staging, ticker
from convoys.services.bdsync import memo, run
from convoys.services.launch import launch_staged

from .support.paths import ROOT
from .support.processes import child_env, manage
from .support.sync import FIXTURE, drop, records, rewrite, run_sync


def status(bead_id):
    return Bead.objects.get(pk=bead_id).status


def test_a_pass_creates_the_beads_and_a_second_unchanged_pass_writes_nothing(routes, town):
    [first] = run_sync(town)
    assert first["created"] == 3 and first["records"] == 3
    assert Bead.objects.get(pk="gt-s2").dependencies.get().depends_on_id == "gt-s1"
    assert Event.objects.filter(kind="bead.created").count() == 3
    events = Event.objects.count()
    with patch("convoys.core.beadfile._check", side_effect=AssertionError("a known line was read")):
        [second] = run_sync(town)  # every line known (by its leading id): none parsed
    assert second["changed"] == 0 and second["unchanged"] == 3 and second["events"] == 0
    assert Event.objects.count() == events
    row = SyncSource.objects.get(name=str(town))
    assert row.last_pass_at and row.records == 3 and not row.error


def test_key_order_and_recomputed_counts_are_not_changes(routes, town):
    run_sync(town)
    lines = []
    for record in records(town):
        record["dependent_count"] = 7
        lines.append(json.dumps(dict(reversed(record.items()))))
    town.write_text("\n".join(lines) + "\n")
    [report] = run_sync(town)
    assert report["changed"] == 0 and report["events"] == 0
    # Lines that do not start with their id are known by their hash from now on.
    reordered = dict(SourcedRecord.objects.values_list("id", "line"))
    with patch("convoys.core.beadfile._check", side_effect=AssertionError("a known line was read")):
        [again] = run_sync(town)
    assert again["changed"] == 0 and again["unchanged"] == 3
    assert dict(SourcedRecord.objects.values_list("id", "line")) == reordered
    rewrite(town, "gt-s1", title="Renamed in bd")
    [renamed] = run_sync(town)
    assert renamed["updated"] == 1 and Bead.objects.get(pk="gt-s1").title == "Renamed in bd"


def test_a_close_in_the_source_closes_the_bead_and_feeds_the_convoy(
    routes, town, django_capture_on_commit_callbacks
):
    run_sync(town)
    plan = staging.stage(["gt-s0", "gt-s1", "gt-s2"], actor="test")
    with django_capture_on_commit_callbacks(execute=True):
        launch_staged(plan.convoy_id, force=True)
    assert status("gt-s0") == "hooked"
    # A dispatch of ours stands while the source still shows the bead as it was.
    run_sync(town, capture=django_capture_on_commit_callbacks)
    assert status("gt-s0") == "hooked"

    rewrite(town, "gt-s0", status="closed", closed_at="2026-11-30T10:00:00Z", close_reason="Done")
    [report] = run_sync(town, capture=django_capture_on_commit_callbacks)
    assert report["updated"] == 1 and report["unchanged"] == 2
    closed = Event.objects.get(kind="bead.closed", bead_id="gt-s0")
    assert closed.actor == "sync" and closed.data["convoys"] == [plan.convoy_id]
    assert status("gt-s0") == "closed" and status("gt-s1") == "hooked"
    assert Dispatch.objects.filter(bead_id="gt-s1", path="event").count() == 1

    for bead_id in ("gt-s1", "gt-s2"):
        rewrite(town, bead_id, status="closed", closed_at="2026-11-30T11:00:00Z")
        run_sync(town, capture=django_capture_on_commit_callbacks)
    assert Convoy.objects.get(pk=plan.convoy_id).status == "closed"
    assert Dispatch.objects.filter(bead_id="gt-s2").count() == 1


def test_an_empty_source_is_refused_not_a_town_gone_missing(routes, town):
    run_sync(town)
    before = Event.objects.count()
    town.write_bytes(b"")
    with pytest.raises(CommandError, match=r"no records, where 3 were: nothing changed"):
        run_sync(town)
    assert Event.objects.count() == before
    assert not SourcedRecord.objects.filter(missing_since__isnull=False).exists()


def test_a_record_the_source_drops_is_marked_missing_not_deleted(routes, town, client):
    run_sync(town)
    drop(town, "gt-s2")
    [report] = run_sync(town)
    assert report["missing"] == 1
    assert Bead.objects.filter(pk="gt-s2").exists()
    assert SourcedRecord.objects.get(pk="gt-s2").missing_since is not None
    event = Event.objects.filter(bead_id="gt-s2").latest("seq")
    assert event.data["missing_from_source"] is True
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    page = client.get("/beads/gt-s2/").content.decode()
    assert "missing from its source" in page and str(town) in page
    assert "missing from its source" not in client.get("/beads/gt-s1/").content.decode()

    town.write_bytes(FIXTURE.read_bytes())
    [report] = run_sync(town)
    assert report["returned"] == 1 and report["missing"] == 0
    assert SourcedRecord.objects.get(pk="gt-s2").missing_since is None
    [again] = run_sync(town)
    assert again["changed"] == 0

    drop(town, "gt-s2")
    run_sync(town)
    town.write_bytes(FIXTURE.read_bytes())
    rewrite(town, "gt-s2", title="Sold again")  # back, and changed meanwhile
    [report] = run_sync(town)
    assert report["returned"] == 1 and report["updated"] == 1
    assert SourcedRecord.objects.get(pk="gt-s2").missing_since is None
    assert Bead.objects.get(pk="gt-s2").title == "Sold again"


def test_a_bad_line_changes_nothing_and_names_the_line(routes, town, caplog):
    run_sync(town)
    rewrite(town, "gt-s0", status="closed")
    with town.open("a") as stream:
        stream.write('{"id": "gt-s9", "title": "Bad", "priority": 9}\n')
    events = Event.objects.count()
    for _ in range(2):  # as the cluster runs it: logged (once)
        with pytest.raises(bdsync.SyncFailed, match=rf"{town}:4: field 'priority'"):
            bdsync.sync(bdsync.source_for(str(town)))
    with pytest.raises(CommandError, match=rf"{town}:4: field 'priority': expected 0\.\.4"):
        run_sync(town)  # the command line prints its error, and does not log it too
    assert status("gt-s0") == "open" and not Bead.objects.filter(pk="gt-s9").exists()
    assert Event.objects.count() == events
    row = SyncSource.objects.get(name=str(town))
    assert ":4: field 'priority'" in row.error and row.failing_since and row.last_pass_at
    # Logged once for the streak, not once per pass.
    assert [r.message for r in caplog.records if r.name == "convoys.sync"] == [
        f"sync failed, nothing changed: {row.error}"
    ]
    rewrite(town, "gt-s9", priority=2)
    [report] = run_sync(town)
    assert report["created"] == 1 and report["updated"] == 1
    assert not SyncSource.objects.get(name=str(town)).error


def test_an_unreadable_file_changes_nothing(db, tmp_path):
    with pytest.raises(CommandError, match="absent.jsonl: No such file or directory"):
        run_sync(tmp_path / "absent.jsonl")
    assert not Bead.objects.exists()


def python_source(script):
    return "cmd:" + shlex.join([sys.executable, "-c", script])


def test_a_command_source_is_read_from_its_standard_output(routes):
    script = f"import sys; sys.stdout.write(open({str(FIXTURE)!r}).read())"
    [report] = run_sync(python_source(script))
    assert report["created"] == 3
    assert SyncSource.objects.get().name.startswith("cmd:")


def test_a_failing_command_changes_nothing_and_keeps_its_stderr(routes, town):
    run_sync(town)
    script = "import sys; print('{}'); sys.stderr.write('bd: database is locked\\n'); sys.exit(3)"
    with pytest.raises(CommandError, match="exited with status 3: bd: database is locked"):
        run_sync(python_source(script))
    with pytest.raises(CommandError, match="cannot run 'no-such-bd-here'"):
        run_sync("cmd:no-such-bd-here export")
    assert Bead.objects.count() == 3


def test_a_command_that_never_answers_is_stopped(db, settings):
    settings.CONVOY_SYNC_TIMEOUT = 0.5
    with pytest.raises(CommandError, match=r"no answer within 0\.5 s"):
        run_sync(python_source("import time; time.sleep(30)"))


def test_a_source_another_holder_is_syncing_is_skipped(routes, town):
    name = bdsync.lease_name(str(town))
    assert leases.acquire(name, "other-cluster", ttl=60)
    err = io.StringIO()
    call_command("beads", "sync", str(town), stderr=err)
    assert "another process is syncing it" in err.getvalue()
    assert not Bead.objects.exists()
    leases.release(name, "other-cluster")
    [report] = run_sync(town)
    assert report["created"] == 3


def test_a_lease_whose_holder_died_on_this_host_is_taken_over(routes, town):
    import socket
    import subprocess

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    name = bdsync.lease_name(str(town))
    host = socket.gethostname()
    assert leases.acquire(name, f"{host}:{gone.pid}:1", ttl=600)  # killed mid-pass
    [report] = run_sync(town)
    assert report["created"] == 3
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert leases.acquire(name, f"{host}:{alive.pid}:1", ttl=600)
        err = io.StringIO()
        call_command("beads", "sync", str(town), stderr=err)
        assert "another process is syncing it" in err.getvalue()
        assert leases.acquire(name, f"elsewhere:{gone.pid}:1", ttl=600) is False
    finally:
        alive.kill()
        alive.wait()
    leases.release(name, f"{host}:{alive.pid}:1")
    assert leases.acquire(name, f"elsewhere:{gone.pid}:1", ttl=600)  # another host's: kept
    err = io.StringIO()
    call_command("beads", "sync", str(town), stderr=err)
    assert "another process is syncing it" in err.getvalue()


def test_the_cluster_ticker_syncs_the_configured_sources(routes, town, settings):
    settings.CONVOY_SYNC_SOURCES = [str(town), "cmd:"]
    assert ticker.SYNC_JOB in ticker.jobs()
    _, func, setting = ticker.SYNC_JOB
    assert func == "convoys.services.bdsync.sync_configured" and setting == "CONVOY_SYNC_INTERVAL"
    bdsync.sync_configured()  # what the enqueued task runs
    assert Bead.objects.count() == 3
    assert SyncSource.objects.get(name="cmd:").error == "cmd: source names no command"


def test_no_sync_job_without_sources(settings):
    settings.CONVOY_SYNC_SOURCES = []
    assert ticker.SYNC_JOB not in ticker.jobs()


def test_a_known_line_repeated_is_a_duplicate(routes, town):
    run_sync(town)
    with town.open("a") as stream:
        stream.write(FIXTURE.read_text().splitlines()[0] + "\n")
    with pytest.raises(CommandError, match=rf"{town}:4: duplicate id 'gt-s0' \(first on line 1\)"):
        run_sync(town)


@pytest.mark.parametrize("filler", [0, 1500])  # the two lines in one batch, or in two
def test_an_id_twice_changes_nothing_and_names_both_lines(routes, town, filler):
    run_sync(town)
    with town.open("a") as stream:
        for i in range(filler):
            stream.write(json.dumps({"id": f"gt-f{i}", "title": "Filler"}) + "\n")
        stream.write(json.dumps({**records(town)[2], "id": "gt-s1", "title": "Again"}) + "\n")
    events = Event.objects.count()
    line = 4 + filler
    with pytest.raises(
        CommandError, match=rf"{town}:{line}: duplicate id 'gt-s1' \(first on line 2\)"
    ):
        run_sync(town)
    assert Bead.objects.get(pk="gt-s1").title == "Run the train"
    assert Event.objects.count() == events and Bead.objects.count() == 3


def test_an_id_twice_in_a_first_pass_creates_nothing(routes, town):
    with town.open("a") as stream:
        stream.write(json.dumps({**records(town)[0], "title": "Again"}) + "\n")
    with pytest.raises(CommandError, match=rf"{town}:4: duplicate id 'gt-s0' \(first on line 1\)"):
        run_sync(town)
    assert not Bead.objects.exists() and not SourcedRecord.objects.exists()


def test_a_pass_with_many_unknown_lines_reads_the_source_again_as_it_writes(
    routes, town, monkeypatch
):
    monkeypatch.setattr(run, "SCAN_KEPT", 1)  # more than this: read again in the transaction
    [first] = run_sync(town)
    assert first["created"] == 3
    rewrite(town, "gt-s0", status="closed", closed_at="2026-11-30T10:00:00Z")
    rewrite(town, "gt-s1", title="Renamed in bd")
    drop(town, "gt-s2")
    [report] = run_sync(town)
    assert (report["updated"], report["missing"], report["unchanged"]) == (2, 1, 0)
    assert status("gt-s0") == "closed" and Bead.objects.get(pk="gt-s1").title == "Renamed in bd"
    with town.open("a") as stream:
        stream.write(json.dumps({**records(town)[0], "title": "Again"}) + "\n")
        stream.write(json.dumps({**records(town)[1], "title": "Again"}) + "\n")
    with pytest.raises(CommandError, match=rf"{town}:3: duplicate id 'gt-s0' \(first on line 1\)"):
        run_sync(town)
    assert Bead.objects.get(pk="gt-s0").title == "Lay the track"


def test_a_known_line_is_read_again_when_another_pass_changed_its_bead(routes, town):
    run_sync(town)
    # Another pass synced another version of gt-s1 meanwhile (from another line).
    Bead.objects.filter(pk="gt-s1").update(title="Another version")
    SourcedRecord.objects.filter(pk="gt-s1").update(digest="0" * 32, line="f" * 32)
    memo.new_token(str(town))  # as that pass did: the memos of the town no longer hold
    [report] = run_sync(town)
    assert report["updated"] == 1 and Bead.objects.get(pk="gt-s1").title == "Run the train"


def test_the_dashboard_shows_each_source_its_last_pass_and_its_error(routes, town, client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    assert "Sync sources" not in client.get("/").content.decode()
    run_sync(town)
    page = client.get("/").content.decode()
    assert "Sync sources" in page and str(town) in page and "failing since" not in page
    town.write_text("not json\n")
    with pytest.raises(CommandError):
        run_sync(town)
    page = client.get("/").content.decode()
    assert "failing since" in page and f"{town}:1: invalid JSON" in page


def test_passes_repeat_every_interval_until_stopped(routes, town):
    stop, results = threading.Event(), []
    for _source, result in bdsync.passes([bdsync.FileSource(town)], every=0.01, stop=stop):
        results.append(result)
        if len(results) == 3:
            stop.set()
    assert [(r.created, r.changed) for r in results] == [(3, 3), (0, 0), (0, 0)]


def test_a_bead_from_a_source_is_changed_in_bd_not_here(routes, town, client):
    from django.contrib.auth.models import User

    from convoys.services import beads
    from convoys.services.tokens import create_token

    run_sync(town)
    refusal = f"bead 'gt-s0' comes from {town}: change it in bd"
    with pytest.raises(CommandError, match=refusal):
        call_command("beads", "close", "gt-s0")
    with pytest.raises(CommandError, match="comes from .*: change it in bd"):
        call_command("beads", "dep", "remove", "gt-s1", "gt-s0")
    token = create_token(User.objects.create_superuser("root", "r@example.com", "pw"), "sync")
    answer = client.post(
        "/api/beads/gt-s0/close",
        data="{}",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert answer.status_code in (400, 409) and refusal in answer.content.decode()
    assert status("gt-s0") == "open"
    beads.create_bead("Local work", bead_id="gt-local", actor="test")
    beads.close_bead("gt-local", actor="test")  # beads created here stay local
    drop(town, "gt-s2")
    run_sync(town)
    beads.close_bead("gt-s2", actor="test", force=True)  # the source no longer has it
    assert status("gt-s2") == "closed"


def test_the_whole_loop_a_launched_convoy_lands_by_the_towns_closes_alone(
    routes, town, settings, django_capture_on_commit_callbacks
):
    worker = FIXTURE.with_name("sync_worker.py")
    settings.CONVOY_DISPATCHER = "command"
    settings.CONVOY_DISPATCH_COMMAND = f"{sys.executable} {worker} {town} {{bead}}"
    run_sync(town)
    plan = staging.stage(["gt-s0", "gt-s1", "gt-s2"], actor="test")
    with django_capture_on_commit_callbacks(execute=True):
        launch_staged(plan.convoy_id, force=True)
    for _ in range(10):  # a pass sees the town's close; its close event dispatches the next
        if Convoy.objects.get(pk=plan.convoy_id).status == "closed":
            break
        run_sync(town, capture=django_capture_on_commit_callbacks)
    assert Convoy.objects.get(pk=plan.convoy_id).status == "closed"
    assert {status(b) for b in ("gt-s0", "gt-s1", "gt-s2")} == {"closed"}
    dispatched = sorted(Dispatch.objects.filter(ok=True).values_list("bead_id", flat=True))
    assert dispatched == ["gt-s0", "gt-s1", "gt-s2"]


@pytest.mark.slow
def test_ctrl_c_stops_a_continuous_sync_with_one_line(tmp_path):
    town = tmp_path / "town.jsonl"
    town.write_bytes(FIXTURE.read_bytes())
    env = child_env(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    manage("migrate", "-v0", env=env, check=True)
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "beads", "sync", str(town), "--every", "0.2"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    line = proc.stdout.readline()  # the first pass is done
    assert line.startswith(f"Synced {town}: 3 records"), line
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and err.strip() == "sync stopped", err
