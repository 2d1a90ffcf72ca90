"""Route paths name their rig by their first part, relative to the town's root: an absolute
path (which made the rig 'tmp') is refused in one line and changes nothing, from the CLI and
from an imported routes.jsonl; './gastown' is gastown."""

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from convoys.models import Event, Rig, Route


def run(*args):
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_an_absolute_route_path_is_refused_and_changes_nothing(db):
    events = Event.objects.count()
    for path in ("/tmp/gastown/mayor/rig", "~/town/gastown", "~"):
        with pytest.raises(CommandError) as refused:
            run("rigs", "route", "gt-", path)
        message = str(refused.value)
        assert "is absolute" in message and "relative to the town's root" in message
        assert "\n" not in message
    assert not Route.objects.exists() and not Rig.objects.exists()
    assert Event.objects.count() == events


def test_a_relative_route_path_names_its_rig_by_its_first_part(db):
    assert run("rigs", "route", "gt-", "./gastown/mayor/rig").strip() == "Route gt- -> gastown"
    assert run("rigs", "route", "bd-", "beads").strip() == "Route bd- -> beads"
    assert run("rigs", "route", "hq-", ".").strip() == "Route hq- -> (town level)"
    assert set(Rig.objects.values_list("name", flat=True)) == {"gastown", "beads"}


def test_an_imported_absolute_route_is_refused_with_its_line(db, tmp_path):
    routes = tmp_path / "routes.jsonl"
    routes.write_text(
        json.dumps({"prefix": "gt-", "path": "gastown/mayor/rig"})
        + "\n"
        + json.dumps({"prefix": "bd-", "path": "/srv/town/beads"})
        + "\n"
    )
    issues = tmp_path / "issues.jsonl"
    issues.write_text("")
    with pytest.raises(CommandError) as refused:
        run("beads", "import", str(issues), "--routes", str(routes))
    assert "routes.jsonl:2" in str(refused.value) and "is absolute" in str(refused.value)
    assert not Route.objects.exists() and not Rig.objects.exists()
