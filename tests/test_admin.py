"""Django admin through its real URLs: every save goes through the services (events written,
transitions enforced, a close feeds the next bead); a refusal is a form error, never a 500, and
nothing of the refused save is kept."""

import hashlib
import html
import json

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User

from convoys.admin.base import INLINE_ROWS
from convoys.models import ApiToken, Bead, Convoy, Dependency, Event, Rig, Subscription, TrackedBead
from convoys.services import beads, jsonl, notify, rigs, staging
from convoys.services import convoys as convoy_service
from convoys.services.launch import launch_staged

from .support.admin import bead_url, form_errors, page_data, saved
from .support.factories import bead, blocks
from .support.users import EDITOR_PERMISSIONS, PASSWORD, staff_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def editor(client):
    client.force_login(staff_user("ada", EDITOR_PERMISSIONS))
    return client


def events(**filters):
    return list(Event.objects.filter(**filters).order_by("seq"))


def kinds(**filters):
    return [e.kind for e in events(**filters)]


BEAD_ADD = "/admin/convoys/bead/add/"


def convoy_url(convoy_id):
    return f"/admin/convoys/convoy/{convoy_id}/change/"


def test_bead_add_with_an_inline_dependency(editor, routes):
    bead("gt-base")
    data = page_data(editor, BEAD_ADD)
    data.update(
        {
            "id": "gt-3q6.5-1",  # a dedup suffix after a hierarchical id: odd, but bd's
            "title": "Wire the <relay> & 'friends'",
            "labels": "ops\n  needs-review \nops\n",
            "dependencies-0-depends_on_id": "gt-base",
            "dependencies-0-type": "blocks",
        }
    )
    saved(editor.post(BEAD_ADD, data))
    created = Bead.objects.get(pk="gt-3q6.5-1")
    assert (created.title, created.status, created.issue_type, created.rig_id) == (
        "Wire the <relay> & 'friends'",
        "open",
        "task",
        "gastown",
    )
    assert created.labels == ["ops", "needs-review"]
    assert list(created.dependencies.values_list("depends_on_id", "type")) == [
        ("gt-base", "blocks")
    ]
    logged = events(bead_id="gt-3q6.5-1")
    assert [e.kind for e in logged] == ["bead.created", "bead.updated"]
    assert {e.actor for e in logged} == {"admin:ada"}
    assert logged[1].data["dependency_added"] == {"target": "gt-base", "type": "blocks"}
    entry = LogEntry.objects.get(object_id="gt-3q6.5-1")
    assert entry.get_change_message() == (
        "Added. Added dependency “gt-3q6.5-1 -[blocks]-> gt-base”."
    )


def test_bead_change_adds_one_dependency_and_removes_another(editor, routes):
    for bead_id in ("gt-a", "gt-old", "gt-new"):
        bead(bead_id)
    blocks("gt-old", "gt-a")
    data = page_data(editor, bead_url("gt-a"))
    assert data["dependencies-0-depends_on_id"] == "gt-old"
    data["dependencies-0-DELETE"] = "on"
    data["dependencies-1-depends_on_id"] = "external:beads:bd-elsewhere"  # not in the database
    data["dependencies-1-type"] = "waits-for"
    saved(editor.post(bead_url("gt-a"), data))
    assert list(Dependency.objects.filter(issue="gt-a").values_list("depends_on_id", "type")) == [
        ("bd-elsewhere", "waits-for")
    ]
    changes = [e.data for e in events(bead_id="gt-a", actor="admin:ada")]
    assert changes[0]["dependency_removed"] == {"target": "gt-old"}
    assert changes[1]["dependency_added"] == {"target": "bd-elsewhere", "type": "waits-for"}
    message = LogEntry.objects.get(object_id="gt-a").get_change_message()
    assert message == (
        "Added dependency “gt-a -[waits-for]-> bd-elsewhere”. "
        "Deleted dependency “gt-a -[blocks]-> gt-old”."
    )


def test_closing_in_admin_feeds_the_next_bead_and_reopen_reopens(
    editor, routes, django_capture_on_commit_callbacks
):
    bead("gt-c0")
    bead("gt-c1")
    blocks("gt-c0", "gt-c1")
    plan = staging.stage(["gt-c0", "gt-c1"], actor="test")
    launch_staged(plan.convoy_id, force=True)
    assert Bead.objects.get(pk="gt-c0").status == "hooked"
    data = page_data(editor, bead_url("gt-c0"))
    data.update({"status": "closed", "close_reason": "Done in admin"})
    with django_capture_on_commit_callbacks(execute=True):
        saved(editor.post(bead_url("gt-c0"), data))
    closed = Bead.objects.get(pk="gt-c0")
    assert (closed.status, closed.close_reason) == ("closed", "Done in admin")
    assert closed.closed_at is not None
    close_event = Event.objects.get(kind="bead.closed", bead_id="gt-c0")
    assert close_event.actor == "admin:ada"
    assert Bead.objects.get(pk="gt-c1").status == "hooked"  # fed by the close
    assert Event.objects.filter(kind="bead.dispatched", bead_id="gt-c1").count() == 1

    data = page_data(editor, bead_url("gt-c0"))
    data["status"] = "open"
    saved(editor.post(bead_url("gt-c0"), data))
    reopened = Bead.objects.get(pk="gt-c0")
    assert (reopened.status, reopened.assignee, reopened.closed_at) == ("open", "", None)
    # reopen_bead clears the worker: its own bead.updated event follows the reopen
    assert kinds(bead_id="gt-c0", actor="admin:ada")[:2] == ["bead.closed", "bead.reopened"]


def test_a_refused_save_is_a_form_error_and_nothing_is_written(editor, routes):
    before = Event.objects.count()
    data = page_data(editor, BEAD_ADD)
    data.update(
        {
            "id": "gt-self",
            "title": "Blocks itself",
            "dependencies-0-depends_on_id": "gt-self",
            "dependencies-0-type": "blocks",
        }
    )
    response = editor.post(BEAD_ADD, data)
    assert "bead 'gt-self' cannot block itself" in form_errors(response)
    assert html.escape("bead 'gt-self' cannot block itself") in response.content.decode()
    # the bead was created before the dependency was refused: both are rolled back
    assert not Bead.objects.filter(pk="gt-self").exists()
    assert Event.objects.count() == before
    # the page keeps what was typed, inline row included
    assert 'value="gt-self"' in response.content.decode()


def test_a_refused_change_keeps_nothing_of_the_save(editor, routes):
    bead("gt-r1")
    before = Event.objects.count()
    data = page_data(editor, bead_url("gt-r1"))
    data.update(
        {
            "title": "Renamed, then refused",
            "assignee": "--output=/tmp/x",  # a worker name that would be an option in argv
            "dependencies-0-depends_on_id": "gt-r1",
        }
    )
    errors = form_errors(editor.post(bead_url("gt-r1"), data))
    assert len(errors) == 1 and "must not start with '-'" in errors[0]
    kept = Bead.objects.get(pk="gt-r1")
    assert (kept.title, kept.assignee) == ("Bead gt-r1", "")
    assert not Dependency.objects.exists() and Event.objects.count() == before


def test_text_comes_back_as_stored_from_a_browser_form(editor, routes):
    bead("gt-text")
    beads.update_bead("gt-text", description="line one\n\n  indented\n", actor="test")
    data = page_data(editor, bead_url("gt-text"))
    data["description"] = data["description"].replace("\n", "\r\n")  # what browsers send
    data["priority"] = "1"
    saved(editor.post(bead_url("gt-text"), data))
    assert Bead.objects.get(pk="gt-text").description == "line one\n\n  indented\n"
    [event] = events(bead_id="gt-text", actor="admin:ada")
    assert event.data["changes"] == {"priority": [2, 1]}


@pytest.mark.parametrize("bad_id", ["-rf", "gt-$(id)", "gt-a/b", "gt a", "gt-x:y", "x" * 256])
def test_a_bead_id_outside_the_id_rule_is_a_form_error(editor, routes, bad_id):
    before = Event.objects.count()
    data = page_data(editor, BEAD_ADD)
    data.update({"id": bad_id, "title": "Hostile id"})
    response = editor.post(BEAD_ADD, data)
    assert form_errors(response)
    assert Bead.objects.count() == 0 and Event.objects.count() == before


def test_an_imported_unknown_status_and_type_are_kept_and_shown(editor, routes, tmp_path):
    record = {
        "id": "gt-odd1",
        "title": "From a newer bd",
        "status": "review",
        "issue_type": "spell",
        "priority": 2,
        "created_at": "2026-01-05T10:00:00Z",
        "updated_at": "2026-01-05T10:00:00Z",
        "extra_key": {"nested": [1, 2], "note": "<script>alert(1)</script>"},
    }
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps(record) + "\n")
    jsonl.import_file(path)
    response = editor.get(bead_url("gt-odd1"))
    page = response.content.decode()
    assert '<option value="review" selected>review (imported)</option>' in page
    assert '<option value="spell" selected>spell (imported)</option>' in page
    assert "&quot;nested&quot;" in page  # the unknown field, read-only
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    data = page_data(editor, bead_url("gt-odd1"))
    data["title"] = "Renamed"
    saved(editor.post(bead_url("gt-odd1"), data))
    kept = Bead.objects.get(pk="gt-odd1")
    assert (kept.title, kept.status, kept.issue_type) == ("Renamed", "review", "spell")
    assert kept.extra == {"extra_key": record["extra_key"]}
    [event] = events(bead_id="gt-odd1", actor="admin:ada")
    assert event.data["changes"] == {"title": ["From a newer bd", "Renamed"]}


@pytest.fixture
def convoy(routes):
    for bead_id in ("gt-t1", "gt-t2", "gt-t3"):
        bead(bead_id)
    return convoy_service.create("Batch", ["gt-t1", "gt-t2"], actor="test")


def test_convoy_change_of_title_owner_and_max_in_flight(editor, convoy):
    data = page_data(editor, convoy_url(convoy.pk))
    data.update({"title": "Renamed batch", "owner": "grace", "max_in_flight": "3"})
    saved(editor.post(convoy_url(convoy.pk), data))
    changed = Convoy.objects.get(pk=convoy.pk)
    assert (changed.title, changed.owner, changed.max_in_flight, changed.status) == (
        "Renamed batch",
        "grace",
        3,
        "open",
    )
    [event] = events(convoy_id=convoy.pk, actor="admin:ada")
    assert event.kind == "convoy.updated"
    assert event.data["changes"] == {
        "title": ["Batch", "Renamed batch"],
        "owner": ["test", "grace"],
        "max_in_flight": [None, 3],
    }


def test_convoy_tracked_bead_added_and_removed(editor, convoy):
    data = page_data(editor, convoy_url(convoy.pk))
    assert data["tracked-0-bead_id"] == "gt-t1"
    data["tracked-0-DELETE"] = "on"
    data["tracked-2-bead_id"] = "gt-t3"
    saved(editor.post(convoy_url(convoy.pk), data))
    assert list(TrackedBead.objects.filter(convoy=convoy).values_list("bead_id", flat=True)) == [
        "gt-t2",
        "gt-t3",
    ]
    logged = events(convoy_id=convoy.pk, actor="admin:ada")
    assert [(e.kind, e.data.get("removed"), e.data.get("added")) for e in logged] == [
        ("convoy.untracked", ["gt-t1"], None),
        ("convoy.tracked", None, ["gt-t3"]),
    ]


def test_a_large_convoy_shows_its_first_rows_and_still_saves(editor, routes):
    ids = [f"gt-big{i:03d}" for i in range(INLINE_ROWS + 5)]  # unknown beads: tracked anyway
    big = convoy_service.create("Big", ids, actor="test")
    page = editor.get(convoy_url(big.pk)).content.decode()
    assert f"{INLINE_ROWS + 5} beads; the first {INLINE_ROWS} are editable below" in page
    data = page_data(editor, convoy_url(big.pk))
    assert data["tracked-INITIAL_FORMS"] == INLINE_ROWS
    data[f"tracked-{INLINE_ROWS}-bead_id"] = "gt-one-more"
    saved(editor.post(convoy_url(big.pk), data))
    assert big.tracked.count() == INLINE_ROWS + 6
    [event] = events(convoy_id=big.pk, actor="admin:ada")
    assert (event.kind, event.data["added"]) == ("convoy.tracked", ["gt-one-more"])


def test_convoy_close_and_reopen_through_the_transition_table(editor, convoy):
    data = page_data(editor, convoy_url(convoy.pk))
    data.update({"status": "closed", "close_reason": "Cancelled"})
    saved(editor.post(convoy_url(convoy.pk), data))
    assert Convoy.objects.get(pk=convoy.pk).close_reason == "Cancelled"
    data = page_data(editor, convoy_url(convoy.pk))
    data["status"] = "open"
    saved(editor.post(convoy_url(convoy.pk), data))
    reopened = Convoy.objects.get(pk=convoy.pk)
    assert (reopened.status, reopened.closed_at, reopened.close_reason) == ("open", None, "")
    assert kinds(convoy_id=convoy.pk, actor="admin:ada") == ["convoy.closed", "convoy.reopened"]


def test_an_illegal_convoy_transition_is_a_form_error_and_changes_nothing(editor, convoy):
    before = Event.objects.count()
    data = page_data(editor, convoy_url(convoy.pk))
    data.update({"status": "staged_ready", "title": "Not saved either"})  # a forged choice
    response = editor.post(convoy_url(convoy.pk), data)
    message = "A convoy that is open can only become closed here."
    assert message in form_errors(response)
    assert html.escape(message) in response.content.decode()
    assert "staged_ready" not in response.content.decode()
    unchanged = Convoy.objects.get(pk=convoy.pk)
    assert (unchanged.status, unchanged.title) == ("open", "Batch")
    assert Event.objects.count() == before


def test_the_status_field_offers_only_legal_moves_in_words(editor, convoy, routes):
    def offered(convoy_id):
        form = editor.get(convoy_url(convoy_id)).context["adminform"].form
        return form.fields["status"].choices

    assert offered(convoy.pk) == [("open", "open"), ("closed", "closed")]
    bead("gt-s9")
    staged = staging.stage(["gt-s9"], actor="test").convoy_id
    assert offered(staged) == [("closed", "closed"), ("staged_ready", "staged, ready to launch")]
    convoy_service.close(convoy.pk, force=True, actor="test")
    assert offered(convoy.pk) == [("open", "open"), ("closed", "closed")]
    Convoy.objects.filter(pk=convoy.pk).update(status="parked_by_bd")  # imported, unknown
    assert offered(convoy.pk) == [("parked_by_bd", "parked_by_bd (imported)")]


def test_a_staged_convoy_is_launched_elsewhere_not_by_a_status_change(editor, routes):
    bead("gt-s1")
    plan = staging.stage(["gt-s1"], actor="test")
    data = page_data(editor, convoy_url(plan.convoy_id))
    data["status"] = "open"
    errors = form_errors(editor.post(convoy_url(plan.convoy_id), data))
    assert any("convoy launch" in e for e in errors)
    assert Convoy.objects.get(pk=plan.convoy_id).status == "staged_ready"
    assert Bead.objects.get(pk="gt-s1").status == "open"


def test_staged_convoys_launch_from_the_list_warnings_only_when_forced(editor, routes):
    bead("gt-w1")
    ready = staging.stage(["gt-w1"], actor="test").convoy_id
    rigs.upsert_route("bd-", "beads")
    rigs.set_rig_state("beads", "parked")
    bead("bd-p1")
    parked = staging.stage(["bd-p1"], actor="test").convoy_id
    assert Convoy.objects.get(pk=parked).status == "staged_warnings"
    action = {"action": "launch_selected", "_selected_action": [ready, parked]}
    response = editor.post("/admin/convoys/convoy/", action, follow=True)
    notes = [str(m) for m in response.context["messages"]]
    assert notes[0] == "Launched 1 convoy."
    assert notes[1].startswith(f"{parked}: ") and "even with warnings or parked rigs" in notes[1]
    assert "--force" not in notes[1]
    assert Bead.objects.get(pk="gt-w1").status == "hooked"
    assert kinds(convoy_id=ready, actor="admin:ada")[0] == "convoy.launched"
    assert Convoy.objects.get(pk=parked).status == "staged_warnings"
    action = {"action": "launch_selected_forced", "_selected_action": [parked]}
    editor.post("/admin/convoys/convoy/", action)
    assert Convoy.objects.get(pk=parked).status == "open"
    assert kinds(convoy_id=parked, actor="admin:ada")[0] == "convoy.launched"
    assert Bead.objects.get(pk="bd-p1").status == "open"  # its rig is parked: it waits


def test_rig_added_and_its_state_changed(editor):
    data = page_data(editor, "/admin/convoys/rig/add/")
    data.update({"name": "frontend", "state": "active"})
    saved(editor.post("/admin/convoys/rig/add/", data))
    assert Rig.objects.get(pk="frontend").state == "active"
    data = page_data(editor, "/admin/convoys/rig/frontend/change/")
    data["state"] = "parked"
    saved(editor.post("/admin/convoys/rig/frontend/change/", data))
    assert Rig.objects.get(pk="frontend").state == "parked"
    logged = [(e.kind, e.data) for e in events(actor="admin:ada")]
    assert logged == [
        ("rig.created", {"rig": "frontend", "state": "active"}),
        ("rig.state", {"rig": "frontend", "state": "parked"}),
    ]


def test_a_rig_name_that_would_be_an_option_is_a_form_error(editor):
    data = page_data(editor, "/admin/convoys/rig/add/")
    for name, says in (("-rf", "must start with a letter or a digit"), ("a;b", "';'")):
        data.update({"name": name, "state": "active"})
        errors = form_errors(editor.post("/admin/convoys/rig/add/", data))
        assert any(says in e for e in errors), errors
    assert not Rig.objects.exists() and not Event.objects.exists()


def test_route_upsert_reroutes_the_prefix_beads_with_events(editor):
    bead("zz-a1")
    bead("zz-a2")
    bead("zzz-other")
    data = page_data(editor, "/admin/convoys/route/add/")
    data.update({"prefix": "zz-", "path": "zoo/mayor/rig"})
    saved(editor.post("/admin/convoys/route/add/", data))
    assert dict(Bead.objects.values_list("id", "rig_id")) == {
        "zz-a1": "zoo",
        "zz-a2": "zoo",
        "zzz-other": None,
    }
    rerouted = events(kind="bead.updated", actor="admin:ada")
    assert [(e.bead_id, e.data["changes"]) for e in rerouted] == [
        ("zz-a1", {"rig": [None, "zoo"]}),
        ("zz-a2", {"rig": [None, "zoo"]}),
    ]
    assert kinds(actor="admin:ada") == ["rig.created", "route.changed", *["bead.updated"] * 2]
    data = page_data(editor, "/admin/convoys/route/zz-/change/")
    data["path"] = "."
    saved(editor.post("/admin/convoys/route/zz-/change/", data))
    assert set(Bead.objects.filter(id__startswith="zz-").values_list("rig_id", flat=True)) == {None}
    moved_back = [e.data["changes"] for e in events(kind="bead.updated", actor="admin:ada")][2:]
    assert moved_back == [{"rig": ["zoo", None]}] * 2


@pytest.mark.parametrize(
    ("prefix", "path", "says"),
    [
        ("zz", "zoo", "must end with '-'"),
        ("zz-", "-rf/mayor", "must not start with '-'"),
        ("zz-", "../etc", "must start with a letter or a digit, not '.'"),
        ("zz-", "zoo;reboot/mayor", "character ';'"),
        ("z$(id)-", "zoo", "character '$'"),
    ],
)
def test_a_route_the_rules_refuse_is_a_form_error(editor, prefix, path, says):
    bead("zz-a1")
    before = Event.objects.count()
    data = page_data(editor, "/admin/convoys/route/add/")
    data.update({"prefix": prefix, "path": path})
    errors = form_errors(editor.post("/admin/convoys/route/add/", data))
    assert len(errors) == 1 and says in errors[0]
    assert not Rig.objects.exists() and Event.objects.count() == before
    assert Bead.objects.get(pk="zz-a1").rig_id is None


def test_admin_cannot_delete_rows_behind_the_services(client):
    client.force_login(User.objects.create_superuser("root", password=PASSWORD))
    bead("gt-keep")
    assert client.get("/admin/convoys/bead/gt-keep/delete/").status_code == 403
    assert "delete_selected" not in client.get("/admin/convoys/bead/").content.decode()


@pytest.fixture
def token_admin(client):
    """A staff user who may add and change API tokens, and a superuser beside them."""
    mallory = staff_user("mallory", ["add_apitoken", "change_apitoken", "view_apitoken"])
    root = User.objects.create_superuser("root", password=PASSWORD)
    client.force_login(mallory)
    return client, mallory, root


def test_a_token_cannot_be_pointed_at_another_user(token_admin):
    client, mallory, root = token_admin
    from convoys.services.tokens import create_token

    raw = create_token(mallory, "laptop")
    token = ApiToken.objects.get()
    url = f"/admin/convoys/apitoken/{token.pk}/change/"
    response = client.post(url, {"user": root.pk, "name": "desk", "_save": "Save"})
    assert response.status_code == 302  # the name saves; the user field is not even read
    assert (ApiToken.objects.get().user, ApiToken.objects.get().name) == (mallory, "desk")
    # the token still acts as mallory, who may not list convoys (root could)
    me = client.get("/api/convoys", headers={"Authorization": f"Bearer {raw}"})
    assert me.status_code == 403
    assert 'name="user"' not in client.get(url).content.decode()  # shown, not editable


def test_a_non_superuser_creates_tokens_only_for_themselves(token_admin):
    client, mallory, root = token_admin
    response = client.post(
        "/admin/convoys/apitoken/add/", {"user": root.pk, "name": "stolen", "_save": "Save"}
    )
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()
    assert not ApiToken.objects.exists()
    response = client.post(
        "/admin/convoys/apitoken/add/", {"user": mallory.pk, "name": "ci", "_save": "Save"}
    )
    assert response.status_code == 200
    raw = response.context["token"]
    assert raw in response.content.decode()  # shown once, here
    token = ApiToken.objects.get()
    assert (token.user, token.name) == (mallory, "ci")
    assert token.digest == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in client.get(f"/admin/convoys/apitoken/{token.pk}/change/").content.decode()


def test_a_superuser_creates_a_token_for_someone_else(client):
    root = User.objects.create_superuser("root", password=PASSWORD)
    worker = User.objects.create_user("worker")
    client.force_login(root)
    response = client.post(
        "/admin/convoys/apitoken/add/", {"user": worker.pk, "name": "swarm", "_save": "Save"}
    )
    assert response.status_code == 200 and "token" in response.context
    assert ApiToken.objects.get().user == worker


def test_closing_beads_from_the_list_goes_through_the_close_service(editor, routes):
    bead("gt-l1")
    bead("gt-l2", status="closed")
    response = editor.post(
        "/admin/convoys/bead/",
        {"action": "close_selected", "_selected_action": ["gt-l1", "gt-l2"]},
    )
    assert response.status_code == 302
    assert Bead.objects.get(pk="gt-l1").status == "closed"
    assert kinds(actor="admin:ada") == ["bead.closed"]  # the closed one is left alone


def test_subscribing_someone_who_may_not_view_convoys_is_a_form_error(client, convoy):
    client.force_login(staff_user("sam", ["add_subscription", "view_subscription"]))
    outsider = User.objects.create_user("outsider")
    viewer = staff_user("viewer", ["view_convoy"])
    url = "/admin/convoys/subscription/add/"
    response = client.post(url, {"user": outsider.pk, "convoy": convoy.pk, "_save": "Save"})
    assert response.status_code == 200
    assert "outsider may not view convoys" in response.content.decode()
    assert not Subscription.objects.exists()
    response = client.post(url, {"user": viewer.pk, "convoy": convoy.pk, "_save": "Save"})
    assert response.status_code == 302
    assert list(Subscription.objects.values_list("user__username", "convoy_id", "email")) == [
        ("viewer", convoy.pk, False)
    ]


def test_a_subscription_moved_to_another_convoy_is_one_subscription(client, convoy):
    client.force_login(staff_user("sam", ["change_subscription", "view_subscription"]))
    viewer = staff_user("viewer", ["view_convoy"])
    other = convoy_service.create("Other", ["gt-t3"], actor="test")
    sub = notify.subscribe(viewer, convoy)
    response = client.post(
        f"/admin/convoys/subscription/{sub.pk}/change/",
        {"user": viewer.pk, "convoy": other.pk, "email": "on", "_save": "Save"},
    )
    assert response.status_code == 302
    assert list(Subscription.objects.values_list("convoy_id", "email")) == [(other.pk, True)]


def test_the_admin_refuses_work_under_way_without_a_worker_and_a_cycle(editor, routes):
    """The edit that once took the whole product down (in progress, nobody assigned) and a
    dependency cycle are refused in the form, naming what is wrong; nothing changes."""
    bead("gt-w1")
    bead("gt-w2")
    blocks("gt-w1", "gt-w2")  # gt-w2 depends on gt-w1
    before = Event.objects.count()
    data = page_data(editor, bead_url("gt-w1"))
    data["status"] = "in_progress"
    errors = form_errors(editor.post(bead_url("gt-w1"), data))
    assert any("needs an assignee" in e for e in errors), errors
    data = page_data(editor, bead_url("gt-w1"))
    data.update(
        {
            "dependencies-0-depends_on_id": "gt-w2",
            "dependencies-0-type": "blocks",
        }
    )
    errors = form_errors(editor.post(bead_url("gt-w1"), data))
    assert any("would make a cycle gt-w1 → gt-w2 → gt-w1" in e for e in errors), errors
    assert Bead.objects.get(pk="gt-w1").status == "open"
    assert Event.objects.count() == before


def test_the_admin_asks_to_confirm_closing_a_bead_with_open_blockers(editor, routes):
    bead("gt-o1")
    bead("gt-o2")
    blocks("gt-o1", "gt-o2")  # gt-o2 depends on gt-o1
    before = Event.objects.count()
    data = page_data(editor, bead_url("gt-o2"))
    data["status"] = "closed"
    errors = form_errors(editor.post(bead_url("gt-o2"), data))
    assert any(
        "gt-o2 is still blocked by gt-o1" in e and "Close even with open blockers" in e
        for e in errors
    ), errors
    assert Bead.objects.get(pk="gt-o2").status == "open"
    assert Event.objects.count() == before
    data["close_anyway"] = "on"
    saved(editor.post(bead_url("gt-o2"), data))
    assert Bead.objects.get(pk="gt-o2").status == "closed"
    assert "close_anyway" not in page_data(editor, bead_url("gt-o2"))  # done: nothing to confirm
