"""Queries compiled once per shape (`convoys.compiled`) answer as the ORM does.

The readiness rule and a bead's "failed" mark run through `Shaped` for a few ids (a live
update); these tests drive random towns (statuses, assignees, live and silent workers,
blockers of every kind, failed and good dispatches) and compare each answer with the same
query compiled by the ORM, at several times, on SQLite and on PostgreSQL (CI runs both)."""

import random
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from convoys import compiled, readiness, rows
from convoys.models import Bead, Dispatch, Event, Worker
from convoys.readiness import ready_among, ready_beads
from convoys.rows import failed_among, failed_beads
from convoys.services import beads

from .factories import bead, blocks

STATUSES = ["open", "open", "open", "in_progress", "hooked", "closed", "blocked", "tombstone"]


@pytest.fixture
def town(routes):
    rng = random.Random(7)
    now = timezone.now()
    ids = [
        bead(f"gt-c{i:02d}", type=rng.choice(["task", "task", "bug", "epic"])).id for i in range(40)
    ]
    Worker.objects.create(name="alive", last_seen=now)
    Worker.objects.create(name="silent", last_seen=now - timedelta(hours=3))
    for bead_id in ids:
        status = rng.choice(STATUSES)
        assignee = rng.choice(["", "", "alive", "silent", "never-seen"])
        fields = {"assignee": assignee} if status != "closed" else {}
        reason = rng.choice(["done", "Merged in 1a2b"])
        if status in ("in_progress", "hooked") and not assignee:  # as only an import has it
            Bead.objects.filter(pk=bead_id).update(status=status)
        else:
            beads.update_bead(bead_id, status=status, close_reason=reason, actor="test", **fields)
        if rng.random() < 0.3:
            Dispatch.objects.create(
                bead_id=bead_id, rig="gastown", ok=rng.random() < 0.5, created_at=now
            )
    for _ in range(40):
        a, b = rng.sample(ids, 2)
        kind = rng.choice(["blocks", "merge-blocks", "waits-for", "related"])
        if not Bead.objects.get(pk=b).dependencies.filter(depends_on_id=a).exists():
            blocks(a, b, kind)
    return ids


def test_the_compiled_rules_answer_as_the_orm(town):
    rng = random.Random(11)
    now = timezone.now()
    for _ in range(30):
        ids = rng.sample(town, rng.randrange(1, 12))
        at = now + timedelta(minutes=rng.choice([-30, 0, 5, 60, 600]))
        assert ready_among(ids, at) == set(
            ready_beads(Bead.objects.filter(pk__in=ids), at).values_list("pk", flat=True)
        )
        assert failed_among(ids) == failed_beads(Bead.objects.filter(pk__in=ids))
    assert ready_among(["gt-none", town[0], town[0]], now) <= {town[0]}
    # and it was the compiled SQL that answered, not the ORM's fallback
    for shaped in (readiness._READY_AMONG, rows._FAILED_AMONG):
        assert shaped._shapes and all(s is not None for s in shaped._shapes.values())


def test_a_shape_is_compiled_once_per_number_of_ids(town, monkeypatch):
    calls = []
    real = compiled.Shaped._compile
    monkeypatch.setattr(
        compiled.Shaped, "_compile", lambda self, *a: calls.append(a) or real(self, *a)
    )
    shaped = compiled.Shaped(
        Bead, lambda ids, at: Bead.objects.filter(pk__in=ids, updated_at__lt=at).values_list("pk")
    )
    now = timezone.now()
    for ids in ([town[0], town[1]], [town[2], town[3]], [town[4]]):
        with CaptureQueriesContext(connection) as queries:
            got = {r[0] for r in shaped.rows(ids, now)}
        assert got == set(ids) and len(queries) == 1
    assert [count for _, count in calls] == [2, 1]


def test_what_the_orm_converts_is_left_to_it(town):
    """Rows with dates (and anything the ORM converts) are not read raw: they run as usual."""
    shaped = compiled.Shaped(
        Event, lambda ids, at: Event.objects.filter(bead_id__in=ids).values_list("created_at")
    )
    rows = shaped.rows(town[:2], timezone.now())
    assert rows and all(isinstance(r[0], type(timezone.now())) for r in rows)


def test_a_setting_the_sql_keeps_is_part_of_its_shape(routes, settings):
    """The worker timeout is compiled into the SQL as a constant: a new value, a new shape."""
    bead("gt-held", assignee="silent")
    Worker.objects.create(name="silent", last_seen=timezone.now() - timedelta(minutes=30))
    settings.CONVOY_WORKER_TIMEOUT = 60
    assert ready_among(["gt-held"]) == {"gt-held"}  # silent for longer than a minute: dead
    settings.CONVOY_WORKER_TIMEOUT = 3600
    assert ready_among(["gt-held"]) == set()  # an hour's timeout: alive
    settings.CONVOY_WORKER_TIMEOUT = 60
    assert ready_among(["gt-held"]) == {"gt-held"}
