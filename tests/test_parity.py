"""Parity with the original, through the command line: discovered work joins its
convoys, `convoy close --notify`, `convoy land --dry-run`, `convoy watch/unwatch`,
and RFC 3339 times in every --json output."""

import io
import json
import re
from datetime import datetime

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from convoys.models import Bead, Convoy, Dispatch, Event, Notification, Subscription, TrackedBead
from convoys.services import beads, convoys, jsonl, staging

from .support.factories import bead, blocks
from .support.users import viewer


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue()


def refused(*args, match):
    before = (Event.objects.count(), Subscription.objects.count(), Notification.objects.count())
    with pytest.raises(CommandError, match=match):
        run(*args)
    after = (Event.objects.count(), Subscription.objects.count(), Notification.objects.count())
    assert after == before


def discover(new_id, parent):
    """A worker files work it found while doing `parent` (the CLI, as a worker would)."""
    bead(new_id, f"Found while doing {parent}")
    return run("beads", "dep", "add", new_id, parent, "--type", "discovered-from")


def tracked(convoy):
    return list(TrackedBead.objects.filter(convoy=convoy).values_list("bead_id", flat=True))


# --- discovered work ---------------------------------------------------------------------------


def test_discovered_work_joins_the_open_convoys_of_its_parent(routes):
    bead("gt-a")
    staged = staging.stage(["gt-a"], actor="test").convoy_id
    first = convoys.create("First", ["gt-a"])
    second = convoys.create("Second", ["gt-a"])
    abandoned = convoys.create("Abandoned", ["gt-a"])
    convoys.close(abandoned.pk, force=True, reason="abandoned")
    other = convoys.create("Other", ["gt-x"])
    assert json.loads(run("convoy", "status", first.pk, "--json"))["total"] == 1
    discover("gt-new", "gt-a")
    assert tracked(first) == ["gt-a", "gt-new"] and tracked(second) == ["gt-a", "gt-new"]
    # A staged plan, a convoy closed by hand and an unrelated convoy keep their beads.
    assert tracked(staged) == ["gt-a"] and tracked(abandoned) == ["gt-a"]
    assert tracked(other) == ["gt-x"]
    assert Convoy.objects.get(pk=abandoned.pk).status == "closed"
    joins = Event.objects.filter(kind="convoy.tracked", data__discovered_from__isnull=False)
    assert sorted(joins.values_list("convoy_id", flat=True)) == sorted([first.pk, second.pk])
    assert all(e.data["discovered_from"] == {"gt-new": "gt-a"} for e in joins)
    status = json.loads(run("convoy", "status", first.pk, "--json"))
    assert (status["completed"], status["total"]) == (0, 2)
    # Idempotent: the same edge again (re-added) joins nothing twice.
    beads.remove_dependency("gt-new", "gt-a")
    beads.add_dependency("gt-new", "gt-a", "discovered-from")
    assert tracked(first) == ["gt-a", "gt-new"] and joins.count() == 2


def test_other_dependency_types_do_not_join(routes):
    bead("gt-a")
    convoy = convoys.create("Work", ["gt-a"])
    for dep_type in ("related", "blocks", "parent-child"):
        bead(f"gt-{dep_type}")
        run("beads", "dep", "add", f"gt-{dep_type}", "gt-a", "--type", dep_type)
    assert tracked(convoy) == ["gt-a"]


def test_the_feeder_considers_discovered_work(routes, django_capture_on_commit_callbacks):
    bead("gt-a")
    convoy = convoys.create("Work", ["gt-a"])
    run("sling", convoy.pk)
    discover("gt-new", "gt-a")
    assert Bead.objects.get(pk="gt-new").status == "open"
    with django_capture_on_commit_callbacks(execute=True):
        beads.close_bead("gt-a", actor="worker")
    fed = Dispatch.objects.get(bead_id="gt-new")
    assert (fed.convoy_id, fed.path) == (convoy.pk, "event")
    assert Convoy.objects.get(pk=convoy.pk).status == "open"  # gt-new is still running


def test_a_landed_convoy_that_gains_work_reopens(routes, django_capture_on_commit_callbacks):
    bead("gt-a")
    convoy = convoys.create("Work", ["gt-a"])
    with django_capture_on_commit_callbacks(execute=True):
        beads.close_bead("gt-a")
    convoy.refresh_from_db()
    assert convoy.status == "closed" and convoy.completion_notified_at is not None
    bead("gt-done", status="closed")
    run("beads", "dep", "add", "gt-done", "gt-a", "--type", "discovered-from")
    assert Convoy.objects.get(pk=convoy.pk).status == "closed"  # finished work: no reopen
    discover("gt-new", "gt-a")
    convoy.refresh_from_db()
    assert convoy.status == "open" and convoy.completion_notified_at is None
    assert tracked(convoy) == ["gt-a", "gt-new"]
    assert Event.objects.filter(kind="convoy.reopened", convoy_id=convoy.pk).count() == 1
    stranded = json.loads(run("convoy", "stranded", "--json"))
    assert [(s["id"], s["ready_issues"]) for s in stranded] == [(convoy.pk, ["gt-new"])]
    run("convoy", "feed", "--once")
    assert Dispatch.objects.get(bead_id="gt-new").convoy_id == convoy.pk
    with django_capture_on_commit_callbacks(execute=True):
        beads.close_bead("gt-new")
    convoy.refresh_from_db()
    assert convoy.status == "closed" and convoy.completion_notified_at is not None
    assert Event.objects.filter(kind="convoy.landed", convoy_id=convoy.pk).count() == 2
    owned = convoys.create("Owned", ["gt-new"], owned=True)
    convoys.land(owned.pk)
    discover("gt-more", "gt-new")  # landed by its owner: it gained work too
    assert Convoy.objects.get(pk=owned.pk).status == "open" and "gt-more" in tracked(owned)


def test_discovered_joins_can_be_turned_off(routes, settings):
    settings.CONVOY_DISCOVERED_JOINS = False
    bead("gt-a")
    convoy = convoys.create("Work", ["gt-a"])
    discover("gt-new", "gt-a")
    assert tracked(convoy) == ["gt-a"]
    assert not Event.objects.filter(kind="convoy.tracked", data__has_key="discovered_from")


def test_imported_discovered_edges_join_once(routes, tmp_path):
    bead("gt-a")
    bead("gt-b")
    convoy = convoys.create("Work", ["gt-a", "gt-b"])
    line = {
        "id": "gt-new",
        "title": "Found while importing",
        "status": "open",
        "issue_type": "task",
        "created_at": "2026-11-30T10:00:00Z",
        "updated_at": "2026-11-30T10:00:00Z",
        "dependencies": [
            {"issue_id": "gt-new", "depends_on_id": "gt-a", "type": "discovered-from"}
        ],
    }
    path = tmp_path / "found.jsonl"
    path.write_text(json.dumps(line) + "\n")
    run("beads", "import", str(path))
    assert tracked(convoy) == ["gt-a", "gt-b", "gt-new"]
    untracked = convoys.untrack(convoy.pk, ["gt-new"])  # someone decides it does not belong
    assert untracked == ["gt-new"]
    run("beads", "import", str(path))  # the same edge again is not new: nothing joins
    assert tracked(convoy) == ["gt-a", "gt-b"]
    line["dependencies"].append(
        {"issue_id": "gt-new", "depends_on_id": "gt-b", "type": "discovered-from"}
    )
    path.write_text(json.dumps(line) + "\n")
    jsonl.import_file(path)  # an existing bead's new edge joins
    assert tracked(convoy) == ["gt-a", "gt-b", "gt-new"]
    join = Event.objects.filter(kind="convoy.tracked", convoy_id=convoy.pk).last()
    assert join.data["discovered_from"] == {"gt-new": "gt-b"} and join.actor == "import"


# --- close --notify, land --dry-run ------------------------------------------------------------


def test_close_notify_tells_that_address_with_the_reason(routes):
    bead("gt-a")
    alice = viewer("alice")
    convoy = convoys.create("Deploy", ["gt-a"])
    out = run(
        "convoy", "close", convoy.pk, "--force", "--reason", "no longer needed", "--notify", "alice"
    )
    assert f"✓ Closed convoy 🚚 {convoy.pk}: Deploy" in out
    note = Notification.objects.get(user=alice)
    assert (note.kind, note.subject) == ("closed", "🚚 Convoy closed: Deploy")
    assert note.body == f"Convoy {convoy.pk} has been closed.\n\nReason: no longer needed"
    assert Event.objects.filter(kind="notification", data__user_id=alice.pk).exists()
    other = convoys.create("Ops", ["gt-a"])
    run("convoy", "close", other.pk, "--force", "--notify", "ops/")
    kept = Notification.objects.get(address="ops/")
    assert kept.user is None and "Reason: Force closed" in kept.body and not kept.email_wanted


def test_close_notify_refusals_change_nothing(routes):
    bead("gt-a")
    User.objects.create_user("mallory")  # may not view convoys
    convoy = convoys.create("Deploy", ["gt-a"])
    refused("convoy", "close", convoy.pk, "--force", "--notify", "mallory", match="may not view")
    refused("convoy", "close", convoy.pk, "--force", "--notify", "x" * 300, match="at most")
    refused("convoy", "close", convoy.pk, "--force", "--notify", "a\x1bb", match="--notify address")
    assert Convoy.objects.get(pk=convoy.pk).status == "open"


def test_land_dry_run_changes_nothing(routes):
    bead("gt-a", status="hooked", assignee="gastown/polecats/nux")
    bead("gt-b", status="closed")
    owned = convoys.create("Owned", ["gt-a", "gt-b"], owned=True)
    before = Event.objects.count()
    with pytest.raises(CommandError, match="convoy has 1 open issue"):
        run("convoy", "land", owned.pk, "--dry-run")
    out = run("convoy", "land", owned.pk, "--dry-run", "--force")
    assert out.splitlines() == [
        f"⚠ Dry run — would land convoy 🚚 {owned.pk}: Owned",
        "",
        "  Tracked: 2 issue(s) (1 closed, 1 open)",
        "  Workers to release: 1",
        "    • gastown/polecats/nux",
        "  Close reason: Landed by owner",
    ]
    assert Event.objects.count() == before and Convoy.objects.get(pk=owned.pk).status == "open"
    plain = convoys.create("Plain", ["gt-b"])
    with pytest.raises(CommandError, match="is not an owned convoy"):
        run("convoy", "land", plain.pk, "--dry-run")
    assert "Landed convoy" in run("convoy", "land", owned.pk, "--force")
    assert "is already closed" in run("convoy", "land", owned.pk, "--dry-run")


# --- watch / unwatch ---------------------------------------------------------------------------


def test_watch_and_unwatch_from_the_cli(routes, django_capture_on_commit_callbacks):
    bead("gt-a")
    alice = viewer("alice", email="alice@example.com")
    convoy = convoys.create("Deploy", ["gt-a"])
    assert run("convoy", "watch", convoy.pk, "--user", "alice") == (
        f"🔔 alice subscribed to convoy {convoy.pk} (inbox notification)\n"
    )
    assert "is already watching" in run("convoy", "watch", convoy.pk, "--user", "alice")
    data = json.loads(run("convoy", "watch", convoy.pk, "--user", "alice", "--email", "--json"))
    assert data == {
        "convoy_id": convoy.pk,
        "user": "alice",
        "watch_type": "mail",
        "status": "updated",
    }
    assert Subscription.objects.get(user=alice, convoy=convoy).email
    with django_capture_on_commit_callbacks(execute=True):
        beads.close_bead("gt-a")
    note = Notification.objects.get(user=alice)
    assert note.kind == "landed" and note.email_wanted and note.emailed_at is not None
    assert run("convoy", "unwatch", convoy.pk, "--user", "alice") == (
        f"🔕 alice unsubscribed from convoy {convoy.pk}\n"
    )
    assert "is not watching" in run("convoy", "unwatch", convoy.pk, "--user", "alice")
    assert not Subscription.objects.exists()


def test_watch_refusals(routes):
    convoy = convoys.create("Deploy", ["gt-a"])
    User.objects.create_user("mallory")
    inactive = viewer("gone")
    inactive.is_active = False
    inactive.save()
    viewer("alice")
    refused("convoy", "watch", convoy.pk, "--user", "mallory", match="may not view convoys")
    refused("convoy", "watch", convoy.pk, "--user", "gone", match="may not view convoys")
    refused("convoy", "watch", convoy.pk, "--user", "nobody", match="user 'nobody' not found")
    refused(
        "convoy", "watch", "hq-cv-zzzzz", "--user", "alice", match="convoy 'hq-cv-zzzzz' not found"
    )
    refused("convoy", "unwatch", "hq-cv-zzzzz", "--user", "alice", match="not found")
    with pytest.raises(CommandError, match="--user"):
        run("convoy", "watch", convoy.pk)


# --- RFC 3339 ----------------------------------------------------------------------------------

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def times(value):
    """Every string in a JSON document that parses as a date and time."""
    if isinstance(value, dict):
        return [t for v in value.values() for t in times(v)]
    if isinstance(value, list):
        return [t for v in value for t in times(v)]
    if isinstance(value, str) and re.match(r"^\d{4}-\d\d-\d\d[T ]\d", value):
        return [value]
    return []


def test_every_json_time_is_rfc3339(routes):
    bead("gt-a", assignee="gastown/polecats/nux", status="hooked")
    beads.heartbeat("gastown/polecats/nux")
    bead("gt-b")
    blocks("gt-a", "gt-b")
    convoy = convoys.create("Work", ["gt-a", "gt-b"])
    outputs = [
        run("convoy", "status", convoy.pk, "--json"),
        run("convoy", "status", "--json"),
        run("convoy", "list", "--json"),
        run("convoy", "stranded", "--json"),
        run("convoy", "create", "More", "gt-b", "--json"),
        run("convoy", "feed", "--once", "--json"),
        run("beads", "show", "gt-a", "--json"),
        run("beads", "ready", "--json"),
        run("beads", "create", "Fresh", "--id", "gt-fresh", "--json"),
    ]
    found = [t for out in outputs for t in times(json.loads(out))]
    assert len(found) >= 7  # worker_seen, created_at in list and stranded, bead records
    for text in found:
        assert RFC3339.match(text), text
        assert datetime.fromisoformat(text).utcoffset() is not None


def test_the_demo_swarm_files_discovered_work_into_the_convoy(routes, monkeypatch):
    from convoys.management.commands import swarm as swarm_command
    from convoys.management.commands.swarm import Command as Swarm

    # Between requests the swarm drops stale connections; here that would be the test's own.
    monkeypatch.setattr(swarm_command, "close_old_connections", lambda: None)
    bead("gt-a", "Wire the pump", status="hooked", assignee="gastown/polecats/nux")
    convoy = convoys.create("Pumps", ["gt-a"])
    swarm = Swarm(stdout=io.StringIO())
    swarm.discover({"id": "gt-a", "title": "Wire the pump", "assignee": "gastown/polecats/nux"})
    found = Bead.objects.get(title="Follow-up: Wire the pump")
    assert found.id.startswith("gt-") and tracked(convoy) == ["gt-a", found.id]
    assert f"found {found.id} while doing gt-a" in swarm.stdout._out.getvalue()


def test_beads_list_filters_like_the_api(routes):
    bead("gt-a", "Wire the pump", status="hooked", assignee="gastown/polecats/nux")
    bead("gt-b", "Paint the pump")
    bead("gt-c", "Fix the valve", status="closed")
    assert [r["id"] for r in json.loads(run("beads", "list", "--json"))] == ["gt-a", "gt-b", "gt-c"]
    listed = json.loads(run("beads", "list", "--status", "hooked", "--json"))
    assert listed == [
        {
            "id": "gt-a",
            "title": "Wire the pump",
            "priority": 2,
            "issue_type": "task",
            "rig": "gastown",
            "status": "hooked",
            "assignee": "gastown/polecats/nux",
        }
    ]
    assert run("beads", "list", "-q", "pump", "--assignee", "gastown/").split()[:2] == [
        "gt-a",
        "hooked",
    ]
    assert run("beads", "list", "--rig", "nowhere") == "No beads match.\n"
    refused("beads", "list", "--limit", "0", match="--limit must be at least 1")
