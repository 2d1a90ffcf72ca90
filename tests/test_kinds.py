"""The event kinds registry: every recorded kind is registered, and an unregistered one is
refused before anything is written."""

import ast
from pathlib import Path

import pytest
from django.db import transaction

from convoys.log import events, kinds
from convoys.models import Event

PACKAGE = Path(__file__).resolve().parent.parent / "convoys"


def _kind_literals():
    """(file, line, text) of every string passed as an event's kind in the package: the first
    argument of `record(...)`, a `kind=` keyword, a `"kind":` key of an event item."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            values = []
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                if name in ("record", "EventItem") and node.args:
                    values.append(node.args[0])
                values += [kw.value for kw in node.keywords if kw.arg == "kind"]
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found.append((path.name, value.lineno, value.value))
    return found


def test_every_kind_the_package_records_is_registered():
    literals = _kind_literals()
    assert len(literals) > 10  # the walk finds the recorders
    event_like = [(f, n, v) for f, n, v in literals if "." in v or v in ("spin", "notification")]
    missing = [(f, n, v) for f, n, v in event_like if v not in kinds.REGISTRY]
    assert missing == []


@pytest.mark.django_db
def test_an_unregistered_kind_is_refused_and_nothing_is_written():
    before = events.last_seq()
    with pytest.raises(ValueError, match="bead.exploded"):
        with transaction.atomic():
            events.record_many(
                [{"kind": "bead.closed", "bead_id": "x-1"}, {"kind": "bead.exploded"}]
            )
    assert events.last_seq() == before
    assert not Event.objects.exists()


def test_each_kind_says_what_it_touches():
    for name, kind in kinds.REGISTRY.items():
        assert kind.touches, name
        assert kind.touches <= set(kinds.TOUCHES), name
        assert kind.doc, name
    with pytest.raises(ValueError, match="unknown touches"):
        kinds._kind("x.y", "doc", "nonsense")


def test_the_derived_sets_follow_the_touches():
    assert "bead.closed" in kinds.BEAD_KINDS and "convoy.tracked" not in kinds.BEAD_KINDS
    assert "bead.closed" not in kinds.ROW_ONLY_KINDS
    assert kinds.NOTE_KINDS == {
        "spin",
        "stranded.found",
        "notification",
        "process.restarted",
        "bead.log",
    }
    assert "convoy.paused" in kinds.FEEDING_KINDS and "convoy.paused" not in kinds.LISTING_KINDS
