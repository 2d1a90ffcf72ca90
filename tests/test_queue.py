"""The close hook is explicit: the writers of `bead.closed` hand each close to the cluster through
convoys/log/queue.py after their commit; recording an event runs nothing else."""

import pytest
from django.core.management import call_command
from django.db import transaction

from convoys.log import events, queue
from convoys.models import Event
from convoys.services import beads

from .support.factories import bead
from .support.paths import FIXTURES


@pytest.fixture
def enqueued(monkeypatch):
    """What the writers enqueue (dotted task name and arguments), instead of running it."""
    calls = []
    monkeypatch.setattr(queue, "enqueue", lambda func, *args, **_: calls.append((func, *args)))
    return calls


def close_seq(bead_id):
    return Event.objects.get(kind="bead.closed", bead_id=bead_id).seq


def test_a_close_enqueues_its_handling_after_the_commit(
    db, enqueued, django_capture_on_commit_callbacks
):
    bead("gt-a")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        beads.close_bead("gt-a", reason="done")
        assert enqueued == []  # nothing before the commit
    assert len(callbacks) == 1
    assert enqueued == [("convoys.tasks.handle_close", close_seq("gt-a"))]


def test_a_close_rolled_back_enqueues_nothing(db, enqueued, django_capture_on_commit_callbacks):
    bead("gt-a")
    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(RuntimeError), transaction.atomic():
            beads.close_bead("gt-a")
            raise RuntimeError("the caller's transaction fails after the close")
    assert enqueued == []
    assert not Event.objects.filter(kind="bead.closed").exists()


def test_recording_a_close_event_runs_nothing_else(
    db, enqueued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks, transaction.atomic():
        events.record("bead.closed", bead_id="gt-x", actor="test")
        events.record_many([dict(kind="bead.closed", bead_id="gt-y")], instances=False)
    assert callbacks == [] and enqueued == []


def test_an_imported_close_enqueues_its_handling(
    db, tmp_path, enqueued, django_capture_on_commit_callbacks
):
    path = FIXTURES / "small.jsonl"
    with django_capture_on_commit_callbacks(execute=True):
        call_command("beads", "import", str(path))
    assert enqueued == []  # a new bead imported closed is created, not closed
    changed = path.read_text().replace(
        '"id":"gt-a2","title":"Build the thing","status":"open"',
        '"id":"gt-a2","title":"Build the thing","status":"closed","closed_at":"2026-01-09T00:00:00Z"',
    )
    target = tmp_path / "changed.jsonl"
    target.write_text(changed)
    with django_capture_on_commit_callbacks(execute=True):
        call_command("beads", "import", str(target))
    assert enqueued == [("convoys.tasks.handle_close", close_seq("gt-a2"))]
