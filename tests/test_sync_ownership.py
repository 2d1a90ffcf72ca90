"""Ownership of synced beads and records missing from their source,
through the admin, the pages, the API and the CLI: a bead its source still has is changed in
bd, read-only here and saying which source; one the source dropped is kept, marked missing
and editable again; beads created here stay editable."""

import html
import io
import json

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.core.management import call_command

from convoys.models import Bead, Dependency, Event
from convoys.services import beads, staging

from .support.admin import bead_url, form_errors, page_data, saved
from .support.sync import drop, run_sync
from .support.users import EDITOR_PERMISSIONS, staff_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def editor(client):
    client.force_login(staff_user("ada", EDITOR_PERMISSIONS))
    return client


def snapshot(bead_id):
    bead = Bead.objects.get(pk=bead_id)
    deps = sorted(Dependency.objects.filter(issue=bead).values_list("depends_on_id", "type"))
    fields = ("title", "description", "status", "issue_type", "priority", "assignee", "labels")
    return {name: getattr(bead, name) for name in fields} | {"deps": deps}


def test_the_admin_shows_a_sourced_bead_read_only_and_names_its_source(editor, synced):
    response = editor.get(bead_url("gt-s1"))
    page = response.content.decode()
    assert html.escape(str(synced)) in page and "change it in bd" in page
    form = response.context["adminform"].form
    assert not {"title", "status", "priority", "assignee", "labels"} & set(form.fields)
    [deps] = response.context["inline_admin_formsets"]
    assert not deps.has_add_permission and not deps.has_change_permission
    assert not deps.has_delete_permission
    assert "Run the train" in page  # still shown, as text


def test_an_edit_posted_to_a_sourced_bead_changes_nothing(editor, synced):
    local = page_data(editor, bead_url("gt-s1"))  # what the read-only page sends
    saved(editor.post(bead_url("gt-s1"), local))  # unchanged: nothing to refuse
    before, events = snapshot("gt-s1"), Event.objects.count()
    forged = {
        **local,
        "title": "Renamed here",
        "status": "closed",
        "close_reason": "Done here",
        "priority": "4",
        "assignee": "someone",
        "labels": "forged",
        "dependencies-TOTAL_FORMS": "2",
        "dependencies-INITIAL_FORMS": "1",
        "dependencies-0-id": "",
        "dependencies-0-depends_on_id": "gt-s0",
        "dependencies-0-DELETE": "on",
        "dependencies-1-depends_on_id": "gt-s2",
        "dependencies-1-type": "blocks",
    }
    forged["dependencies-0-issue"] = "gt-s1"
    errors = form_errors(editor.post(bead_url("gt-s1"), forged))
    assert errors == [f"bead 'gt-s1' comes from {synced}: change it in bd"]
    assert snapshot("gt-s1") == before
    assert Event.objects.count() == events


def test_a_list_action_on_a_sourced_bead_is_refused_naming_the_source(editor, synced):
    response = editor.post(
        "/admin/convoys/bead/",
        {"action": "close_selected", "_selected_action": ["gt-s0", "gt-s2"]},
    )
    assert response.status_code == 302
    notes = [str(m) for m in get_messages(response.wsgi_request)]
    assert f"gt-s0: bead 'gt-s0' comes from {synced}: change it in bd" in notes
    assert {Bead.objects.get(pk=b).status for b in ("gt-s0", "gt-s2")} == {"open"}


def test_beads_created_here_stay_editable_in_the_admin(editor, synced):
    beads.create_bead("Local work", bead_id="gt-local", actor="test")
    response = editor.get(bead_url("gt-local"))
    assert "title" in response.context["adminform"].form.fields
    assert "created in convoyweb" in response.content.decode()
    data = page_data(editor, bead_url("gt-local"))
    data["title"] = "Local work, renamed"
    saved(editor.post(bead_url("gt-local"), data))
    assert Bead.objects.get(pk="gt-local").title == "Local work, renamed"


def test_a_bead_missing_from_its_source_is_editable_and_says_so(editor, synced):
    drop(synced, "gt-s2")
    run_sync(synced)
    response = editor.get(bead_url("gt-s2"))
    assert "missing from its source" in response.content.decode()
    data = page_data(editor, bead_url("gt-s2"))
    data["title"] = "Sold elsewhere"
    saved(editor.post(bead_url("gt-s2"), data))
    assert Bead.objects.get(pk="gt-s2").title == "Sold elsewhere"
    assert LogEntry.objects.filter(object_id="gt-s2").exists()


def test_a_bead_back_in_its_source_takes_the_source_record_again(editor, synced):
    """Missing, edited here, then back byte for byte: the source's record wins again (the
    line's hash was unchanged, so the pass used to skip it and keep the local edit)."""
    original = synced.read_bytes()
    drop(synced, "gt-s2")
    run_sync(synced)
    beads.update_bead("gt-s2", title="Edited while missing", actor="test")
    synced.write_bytes(original)
    (report,) = run_sync(synced)
    assert (report["returned"], report["updated"]) == (1, 1), report
    assert Bead.objects.get(pk="gt-s2").title == "Sell the tickets"
    with pytest.raises(beads.ServiceError, match="change it in bd"):
        beads.update_bead("gt-s2", title="Edited again", actor="test")
    (again,) = run_sync(synced)
    assert again["events"] == 0, again


def test_a_bead_becoming_sourced_between_page_and_save_is_a_form_error(editor, synced):
    """Missing from its source (editable here), back in it before the page is saved. (A
    bead created here never becomes sourced: a source's record with its id is not taken.)"""
    original = synced.read_bytes()
    drop(synced, "gt-s0")
    run_sync(synced)
    data = page_data(editor, bead_url("gt-s0"))
    synced.write_bytes(original)
    run_sync(synced)  # the town has gt-s0 again: its record wins
    data["title"] = "Edited on a stale page"
    errors = form_errors(editor.post(bead_url("gt-s0"), data))
    assert errors == [f"bead 'gt-s0' comes from {synced}: change it in bd"]
    assert Bead.objects.get(pk="gt-s0").title == "Lay the track"


def api_get(client, path):
    response = client.get(path)
    assert response.status_code == 200, response.content
    return response.json()


def test_missing_from_source_is_shown_on_pages_api_and_cli(editor, synced):
    from django.contrib.auth.models import User

    plan = staging.stage(["gt-s0", "gt-s1", "gt-s2"], actor="test")
    drop(synced, "gt-s2")
    [report] = run_sync(synced)
    assert report["missing"] == 1
    editor.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))

    page = editor.get(f"/convoys/{plan.convoy_id}/").content.decode()
    row = page.split('id="bead-row-gt-s2"', 1)[1].split("</tr>", 1)[0]
    assert "missing from source" in row
    other = page.split('id="bead-row-gt-s1"', 1)[1].split("</tr>", 1)[0]
    assert "missing from source" not in other

    bead = api_get(editor, "/api/beads/gt-s2")
    assert bead["source"] == str(synced) and bead["missing_since"]
    kept = api_get(editor, "/api/beads/gt-s1")
    assert kept["source"] == str(synced) and kept["missing_since"] is None
    convoy = api_get(editor, f"/api/convoys/{plan.convoy_id}")
    missing = {t["id"]: t["missing_from_source"] for t in convoy["tracked"]}
    assert missing == {"gt-s0": False, "gt-s1": False, "gt-s2": True}

    out = io.StringIO()
    call_command("beads", "show", "gt-s2", stdout=out)
    assert f"source: {synced} (missing from its source since " in out.getvalue()
    out = io.StringIO()
    call_command("beads", "show", "gt-s2", "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert shown["source"] == str(synced) and shown["missing_from_source"] is True
    out = io.StringIO()
    call_command("beads", "show", "gt-s1", stdout=out)
    assert f"source: {synced} (change it in bd)" in out.getvalue()
    out = io.StringIO()
    call_command("convoy", "status", plan.convoy_id, stdout=out)
    line = next(x for x in out.getvalue().splitlines() if "gt-s2" in x)
    assert "missing from source" in line


CONVOY_RECORD = {
    "id": "hq-cv-s",
    "title": "Work: the line",
    "description": "Convoy for the line\nOwner: mayor/",
    "status": "open",
    "priority": 2,
    "issue_type": "convoy",
    "created_at": "2026-11-30T09:03:00Z",
    "labels": ["gt:convoy"],
    "dependencies": [
        {"issue_id": "hq-cv-s", "depends_on_id": bead_id, "type": "tracks"}
        for bead_id in ("gt-s0", "gt-s1")
    ],
}


def test_a_convoy_record_the_source_drops_is_kept_and_shown_missing(editor, routes, town):
    from django.contrib.auth.models import User

    from convoys.models import Convoy

    with town.open("a") as stream:
        stream.write(json.dumps(CONVOY_RECORD) + "\n")
    [report] = run_sync(town)
    assert report["created"] == 4
    drop(town, "hq-cv-s")
    [report] = run_sync(town)
    assert report["missing"] == 1 and Convoy.objects.filter(pk="hq-cv-s").exists()
    event = Event.objects.filter(convoy_id="hq-cv-s").latest("seq")
    assert (event.kind, event.data["missing_from_source"]) == ("convoy.updated", True)

    editor.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    page = editor.get("/convoys/hq-cv-s/").content.decode()
    assert html.escape(str(town)) in page and 'id="convoy-missing"' in page
    convoy = api_get(editor, "/api/convoys/hq-cv-s")
    assert convoy["source"] == str(town) and convoy["missing_from_source"] is True
    out = io.StringIO()
    call_command("convoy", "status", "hq-cv-s", stdout=out)
    assert f"Source: {town}   ⚠ missing from its source" in out.getvalue()

    with town.open("a") as stream:
        stream.write(json.dumps(CONVOY_RECORD) + "\n")
    [report] = run_sync(town)
    assert report["returned"] == 1
    assert 'id="convoy-missing"' not in editor.get("/convoys/hq-cv-s/").content.decode()
    assert api_get(editor, "/api/convoys/hq-cv-s")["missing_from_source"] is False
