import io
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from convoys.models import Bead, Worker
from convoys.rules.readiness import is_ready, ready_beads
from convoys.services import beads, rigs

from .support.factories import bead, blocks

FIXTURES = Path(__file__).parent / "fixtures"


def ready_ids():
    return [b.id for b in ready_beads()]


@pytest.mark.parametrize("dep_type", ["blocks", "conditional-blocks", "waits-for", "merge-blocks"])
def test_every_blocking_type_blocks_until_done(routes, dep_type):
    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b", dep_type)
    assert ready_ids() == ["gt-a"]
    reason = "Merged in abc123" if dep_type == "merge-blocks" else "done"
    beads.close_bead("gt-a", reason=reason)
    assert ready_ids() == ["gt-b"]


def test_merge_blocks_needs_merged_in_reason(routes):
    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b", "merge-blocks")
    beads.close_bead("gt-a", reason="Closed without merge")
    assert not is_ready(Bead.objects.get(pk="gt-b"))
    beads.reopen_bead("gt-a")
    beads.close_bead("gt-a", reason="Merged in 1f2e3d")
    assert is_ready(Bead.objects.get(pk="gt-b"))


def test_tombstone_target_does_not_block(routes):
    bead("gt-a", status="tombstone")
    bead("gt-b")
    blocks("gt-a", "gt-b", "merge-blocks")
    assert ready_ids() == ["gt-b"]


@pytest.mark.parametrize("dep_type", ["parent-child", "related", "tracks", "discovered-from"])
def test_non_blocking_types_do_not_block(routes, dep_type):
    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b", dep_type)
    assert ready_ids() == ["gt-a", "gt-b"]


def test_missing_and_external_targets_do_not_block(routes):
    bead("gt-b")
    beads.add_dependency("gt-b", "gt-elsewhere")
    beads.add_dependency("gt-b", "external:bd:bd-9")
    assert ready_ids() == ["gt-b"]


def test_parked_and_docked_rigs_and_no_rig(routes):
    bead("gt-a")
    bead("bd-b")
    bead("hq-c")  # town level: no rig
    bead("zz-d")  # no route
    assert ready_ids() == ["bd-b", "gt-a"]
    rigs.set_rig_state("gastown", "parked")
    rigs.set_rig_state("beads", "docked")
    assert ready_ids() == []
    rigs.set_rig_state("gastown", "active")
    assert ready_ids() == ["gt-a"]


def test_only_slingable_types(routes):
    for bead_type in ["task", "bug", "feature", "chore", "epic", "decision", "message", "convoy"]:
        bead(f"gt-{bead_type}", type=bead_type)
    assert ready_ids() == ["gt-bug", "gt-chore", "gt-feature", "gt-task"]


def test_status_and_assignee(routes):
    bead("gt-open")
    bead("gt-mine", assignee="gastown/polecats/nux")
    for status in ["blocked", "deferred", "pinned", "closed"]:
        bead(f"gt-{status}", status=status)
    for status in ["in_progress", "hooked"]:  # with nobody assigned: only an import does that
        bead(f"gt-{status}")
        Bead.objects.filter(pk=f"gt-{status}").update(status=status)
    assert ready_ids() == ["gt-open"]


def test_dead_worker_makes_work_ready_again(routes, settings):
    settings.CONVOY_WORKER_TIMEOUT = 600
    bead("gt-h", assignee="gastown/polecats/nux")
    beads.update_bead("gt-h", status="hooked")
    beads.heartbeat("gastown/polecats/nux")
    assert ready_ids() == []
    Worker.objects.filter(pk="gastown/polecats/nux").update(
        last_seen=timezone.now() - timedelta(minutes=11)
    )
    assert ready_ids() == ["gt-h"]
    beads.heartbeat("gastown/polecats/nux")
    assert ready_ids() == []


def test_order_is_priority_then_id(routes):
    bead("gt-c", priority=1)
    bead("gt-a", priority=2)
    bead("gt-b", priority=1)
    assert ready_ids() == ["gt-b", "gt-c", "gt-a"]


WORKER = "gastown/polecats/nux"


def age_bead(bead_id, minutes):
    """Set the bead's last update back (no service writes a past updated_at; imports do)."""
    Bead.objects.filter(pk=bead_id).update(updated_at=timezone.now() - timedelta(minutes=minutes))


def age_worker(minutes):
    Worker.objects.filter(pk=WORKER).update(last_seen=timezone.now() - timedelta(minutes=minutes))


@pytest.mark.parametrize(
    "status, heartbeat_minutes, updated_minutes, ready",
    [
        ("hooked", None, 5, False),  # never reported, updated 5 min ago: not dead yet
        ("hooked", None, 11, True),  # never reported, untouched for 11 min: dead
        ("in_progress", None, 11, True),
        ("open", None, 11, True),
        ("deferred", None, 11, False),  # held work is never taken over
        ("hooked", 5, 60, False),  # a heartbeat row decides, not the bead's age
        ("hooked", 11, 1, True),
    ],
)
def test_dead_worker_rule_agrees_as_queryset_and_predicate(
    routes, settings, status, heartbeat_minutes, updated_minutes, ready
):
    settings.CONVOY_WORKER_TIMEOUT = 600
    bead("gt-w", assignee=WORKER, status=status)
    if heartbeat_minutes is not None:
        beads.heartbeat(WORKER)
        age_worker(heartbeat_minutes)
    age_bead("gt-w", updated_minutes)
    assert (ready_ids() == ["gt-w"]) is ready
    assert is_ready(Bead.objects.get(pk="gt-w")) is ready


def test_imported_hooked_work_of_silent_workers_is_rescued(routes, settings):
    """bd files carry hooked work whose assignees never report here: once the bead's last
    update is CONVOY_WORKER_TIMEOUT old, it is ready, as queryset and as predicate."""
    call_command("beads", "import", str(FIXTURES / "hooked.jsonl"), stdout=io.StringIO())
    assert not Worker.objects.exists()
    beads.heartbeat("gastown/polecats/alive")
    settings.CONVOY_WORKER_TIMEOUT = 10 * 365 * 24 * 3600  # ten years: nobody is dead yet
    assert ready_ids() == []
    settings.CONVOY_WORKER_TIMEOUT = 600
    # hk3's worker reports, hk4 waits on hk1, hk5 is deferred
    assert ready_ids() == ["gt-hk1", "gt-hk2"]
    for item in Bead.objects.all():
        assert is_ready(item) is (item.pk in ("gt-hk1", "gt-hk2")), item.pk
