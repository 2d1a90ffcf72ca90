"""Creating and fixing work in the web UI, through the test client: a bead, an epic with children
and dependencies, a dependency from a bead's page, a staged convoy's warnings, its re-check and
the un-parking of a rig it waits on; permissions and refusals (form errors, nothing written)."""

import html
import re

import pytest
from django.test import Client

from convoys.models import Bead, Convoy, Dependency, Event
from convoys.services import rigs, staging

from .support.factories import bead, blocks, epic_of, staged_on_parked_rig
from .support.users import logged_in, user_with

VIEW = ("view_convoy", "view_bead")


@pytest.fixture
def manager(routes):
    return logged_in(
        user_with("manager", *VIEW, "add_bead", "change_bead", "change_convoy", "change_rig")
    )


@pytest.fixture
def viewer(routes):
    return logged_in(user_with("viewer", *VIEW))


def writes():
    """What a refused request must leave untouched."""
    return Bead.objects.count(), Dependency.objects.count(), Event.objects.count()


def text(response):
    return html.unescape(response.content.decode())


def errors_of(response):
    return re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', text(response), re.S)


def test_create_a_bead_with_an_id_from_the_rigs_prefix(manager):
    assert 'href="/create/"' in manager.get("/").content.decode()  # in the navigation
    page = manager.get("/create/").content.decode()
    assert 'value="gt-"' in page and 'value="bd-"' in page and 'value="hq-"' not in page
    response = manager.post(
        "/create/",
        {
            "kind": "bead",
            "prefix": "gt-",
            "title": "Fix the parser",
            "issue_type": "bug",
            "priority": "1",
            "description": "It drops the last line.",
        },
    )
    created = Bead.objects.get(title="Fix the parser")
    assert response.status_code == 302 and response.url == f"/beads/{created.pk}/"
    assert re.fullmatch(r"gt-[0-9a-z]{5}", created.pk)
    assert (created.rig_id, created.issue_type, created.priority) == ("gastown", "bug", 1)
    event = Event.objects.get(kind="bead.created", bead_id=created.pk)
    assert event.actor == "web:manager"
    assert "Created " + created.pk in manager.get(response.url).content.decode()


def test_create_an_epic_with_children_and_dependencies_then_stage_it(manager):
    bead("gt-old", "Existing groundwork")
    response = manager.post(
        "/create/",
        {
            "kind": "epic",
            "prefix": "gt-",
            "title": "Search rewrite",
            "priority": "2",
            "issue_type": "task",
            "children": "Design\nBuild the index | after 1, gt-old\n\nShip | after 1, 2\n",
        },
    )
    assert response.status_code == 302
    epic = Bead.objects.get(title="Search rewrite")
    assert epic.issue_type == "epic" and epic.pk.startswith("gt-")
    kids = {b.title: b for b in Bead.objects.filter(dependencies__depends_on_id=epic.pk)}
    assert sorted(kids) == ["Build the index", "Design", "Ship"]
    assert all(k.issue_type == "task" and k.rig_id == "gastown" for k in kids.values())
    deps = set(Dependency.objects.filter(type="blocks").values_list("issue_id", "depends_on_id"))
    design, build, ship = kids["Design"].pk, kids["Build the index"].pk, kids["Ship"].pk
    assert deps == {(build, design), (build, "gt-old"), (ship, design), (ship, build)}
    plan = staging.analyze([epic.pk])
    assert plan.waves == [[design], [build], [ship]]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"children": "Design\nBuild | after 2"}, "line 2: 'after 2' must name an earlier line"),
        ({"children": "Design | after 1"}, "line 1: the first child cannot wait for a line"),
        ({"children": "Design\n | after 1"}, "line 2: a child needs a title before '|'"),
        ({"children": "Design\nBuild | before 1"}, "line 2: write '| after 1, 2'"),
        ({"children": "A\nB | after gt-nope"}, "line 2: bead 'gt-nope' not found"),
        ({"kind": "bead", "children": "A"}, "children belong to an epic"),
        ({"prefix": "zz-"}, "Select a valid choice"),
        ({"title": "   "}, "This field is required"),
        ({"title": "bad\x00title"}, "Null characters are not allowed"),
        ({"priority": "9"}, "Select a valid choice"),
        ({"title": "x" * 501}, "at most 500 characters"),
        ({"children": "task\n" * 201}, "at most 200 children at once, got 201"),
        ({"children": "<script>x</script> | after <b>"}, "line 1: bead '<b>' not found"),
        ({"children": "A\nB | after <b>"}, "line 2: bead '<b>' not found"),
    ],
)
def test_create_refusals_are_form_errors_and_write_nothing(manager, data, message):
    before = writes()
    form = {
        "kind": "epic",
        "prefix": "gt-",
        "title": "Epic",
        "priority": "2",
        "issue_type": "task",
        **data,
    }
    response = manager.post("/create/", form)
    assert response.status_code == 400
    assert any(message in e for e in errors_of(response)), errors_of(response)
    assert "<script>x" not in response.content.decode()  # echoed input is escaped
    assert writes() == before


def test_add_a_dependency_from_the_bead_page(manager, viewer):
    bead("gt-a")
    bead("gt-b")
    page = manager.get("/beads/gt-a/").content.decode()
    assert 'id="dependency-form"' in page and 'action="/beads/gt-a/dependencies/add/"' in page
    assert 'id="dependency-form"' not in viewer.get("/beads/gt-a/").content.decode()
    response = manager.post("/beads/gt-a/dependencies/add/", {"target": "gt-b", "type": "blocks"})
    assert response.status_code == 302 and response.url == "/beads/gt-a/"
    assert Dependency.objects.filter(issue_id="gt-a", depends_on_id="gt-b", type="blocks").exists()
    assert Event.objects.filter(bead_id="gt-a", data__dependency_added__target="gt-b").exists()
    assert "gt-a now depends on gt-b (blocks)." in manager.get("/beads/gt-a/").content.decode()
    before = writes()
    for target, message in (
        ("gt-b", "already depends on"),
        ("gt-a", "cannot block itself"),
        ("", "This field is required"),
    ):
        response = manager.post(
            "/beads/gt-a/dependencies/add/", {"target": target, "type": "blocks"}
        )
        assert response.status_code == 400
        assert any(message in e for e in errors_of(response)), errors_of(response)
    bead("gt-epic", "Epic", type="epic")
    manager.post("/beads/gt-a/dependencies/add/", {"target": "gt-epic", "type": "parent-child"})
    assert staging.analyze(["gt-epic"]).dag.slingable_ids() == ["gt-a"]
    before = writes()
    response = manager.post("/beads/gt-a/dependencies/add/", {"target": "gt-b", "type": "x"})
    assert response.status_code == 400
    assert manager.post("/beads/gt-nope/dependencies/add/", {"target": "gt-b"}).status_code == 404
    assert writes() == before


def test_view_only_users_get_403_and_anonymous_users_the_login(viewer, routes):
    assert 'href="/create/"' not in viewer.get("/").content.decode()
    bead("gt-a")
    bead("gt-b")
    plan = staging.stage(["gt-a", "gt-b"], actor="test")
    rigs.set_rig_state("gastown", "parked", actor="test")
    before = writes(), Convoy.objects.get(pk=plan.convoy_id).status
    attempts = [
        ("get", "/create/", {}),
        (
            "post",
            "/create/",
            {"kind": "bead", "prefix": "gt-", "title": "X", "priority": "2", "issue_type": "task"},
        ),
        ("post", "/beads/gt-a/dependencies/add/", {"target": "gt-b"}),
        ("post", f"/convoys/{plan.convoy_id}/staging/recheck/", {}),
        ("post", "/rigs/gastown/restore/", {}),
    ]
    for method, url, data in attempts:
        assert getattr(viewer, method)(url, data).status_code == 403, url
        response = getattr(Client(), method)(url, data)
        assert response.status_code == 302 and "/login/" in response.url, url
    # change_convoy alone does not restore a rig: that needs change_rig
    convoy_only = logged_in(user_with("lead", *VIEW, "change_convoy"))
    assert convoy_only.post("/rigs/gastown/restore/").status_code == 403
    assert "Un-park gastown" not in convoy_only.get(f"/convoys/{plan.convoy_id}/").content.decode()
    assert (writes(), Convoy.objects.get(pk=plan.convoy_id).status) == before


def test_forms_need_the_csrf_token(routes):
    client = logged_in(user_with("csrf", *VIEW, "add_bead"), csrf=True)
    form = {"kind": "bead", "prefix": "gt-", "title": "X", "priority": "2", "issue_type": "task"}
    assert client.post("/create/", form).status_code == 403
    assert not Bead.objects.exists()


@pytest.fixture
def parked_epic(routes):
    return staged_on_parked_rig().convoy_id


def test_convoy_page_shows_warnings_and_unparking_the_rig_makes_it_ready(manager, parked_epic):
    page = text(manager.get(f"/convoys/{parked_epic}/"))
    warnings = re.search(r'id="staging-warnings">(.*?)</ul>', page, re.S).group(1)
    assert "blocked-rig" in warnings and 'target parked rig "gastown"' in warnings
    assert "gastown</strong> is parked: 2 beads of this convoy wait for it" in page
    assert "Un-park gastown" in page
    before = Event.objects.latest("seq").seq
    response = manager.post("/rigs/gastown/restore/", {"next": f"/convoys/{parked_epic}/"})
    assert response.status_code == 302 and response.url == f"/convoys/{parked_epic}/"
    convoy = Convoy.objects.get(pk=parked_epic)
    assert convoy.status == "staged_ready"
    kinds = list(Event.objects.filter(seq__gt=before).values_list("kind", flat=True))
    assert kinds == ["rig.state", "convoy.restaged"]
    page = manager.get(response.url).content.decode()
    assert "Rig gastown is active; 1 staged convoy now ready to launch." in page
    assert "No warnings at the last check" in page and "Un-park" not in page


def test_unsafe_next_after_restoring_a_rig_goes_to_the_dashboard(manager, parked_epic):
    response = manager.post("/rigs/gastown/restore/", {"next": "https://evil.example/"})
    assert response.status_code == 302 and response.url == "/"
    assert manager.post("/rigs/nope/restore/").status_code == 404


def test_recheck_button_restages_in_place(manager, routes):
    epic_of("gt-epic", ["gt-x", "gt-y", "gt-lone"])
    blocks("gt-x", "gt-y")
    convoy_id = staging.stage(["gt-epic"], actor="test").convoy_id
    page = manager.get(f"/convoys/{convoy_id}/").content.decode()
    assert "orphan" in page and 'id="recheck"' in page
    # fix the warning from the bead page, then re-check from the convoy page
    manager.post("/beads/gt-lone/dependencies/add/", {"target": "gt-y", "type": "blocks"})
    before = Convoy.objects.count()
    response = manager.post(f"/convoys/{convoy_id}/staging/recheck/")
    assert response.status_code == 302 and response.url == f"/convoys/{convoy_id}/"
    assert Convoy.objects.count() == before
    convoy = Convoy.objects.get(pk=convoy_id)
    assert convoy.status == "staged_ready"
    event = Event.objects.filter(kind="convoy.restaged", convoy_id=convoy_id).get()
    assert (event.actor, event.data["old_status"]) == ("web:manager", "staged_warnings")
    page = manager.get(response.url).content.decode()
    assert f"Re-checked {convoy_id}: no warnings, ready to launch." in page
    # on a launched convoy the same button checks it and says what it waits for
    assert manager.post(f"/convoys/{convoy_id}/launch/").status_code == 302
    response = manager.post(f"/convoys/{convoy_id}/staging/recheck/", follow=True)
    assert "0/3 done, not complete: 1 in progress." in text(response)


def test_check_button_on_a_staged_convoy_rechecks_it(manager):
    epic_of("gt-epic", ["gt-x", "gt-lone"])
    convoy_id = staging.stage(["gt-epic"], actor="test").convoy_id
    assert Convoy.objects.get(pk=convoy_id).status == "staged_warnings"  # two orphans
    manager.post("/beads/gt-lone/dependencies/add/", {"target": "gt-x", "type": "blocks"})
    response = manager.post(f"/convoys/{convoy_id}/check/", follow=True)
    assert f"Re-checked {convoy_id}: no warnings, ready to launch." in text(response)
    assert Convoy.objects.get(pk=convoy_id).status == "staged_ready"


def test_a_new_epic_goes_from_create_to_stage_to_launch_without_a_detour(routes):
    operator = logged_in(user_with("op", *VIEW, "add_bead", "add_convoy", "change_convoy"))
    created = operator.post(
        "/create/",
        {
            "kind": "epic",
            "prefix": "gt-",
            "title": "Search rewrite",
            "priority": "2",
            "issue_type": "task",
            "children": "Design\nBuild | after 1\n",
        },
        follow=True,
    )
    page = created.content.decode()
    epic = Bead.objects.get(title="Search rewrite")
    link = re.search(r'<a class="button" id="stage-epic" href="([^"]+)">Stage this epic</a>', page)
    assert link, "an epic's page offers to stage it"
    preview = operator.get(html.unescape(link.group(1))).content.decode()
    assert "not staged yet: it would be staged, ready to launch" in preview
    assert not Convoy.objects.exists()  # a preview writes nothing
    staged = operator.post("/stage/", {"epic": epic.pk, "do": "stage"}, follow=True)
    convoy = Convoy.objects.get()
    assert convoy.status == "staged_ready" and f"Staged {convoy.pk}" in staged.content.decode()
    operator.post(f"/convoys/{convoy.pk}/launch/")
    assert Convoy.objects.get().status == "open"
    # Viewers are not offered what they may not do; a done epic has nothing to stage.
    viewer = logged_in(user_with("vi", *VIEW))
    assert 'id="stage-epic"' not in viewer.get(f"/beads/{epic.pk}/").content.decode()


def test_a_refusal_about_the_children_names_the_field(manager):
    response = manager.post(
        "/create/",
        {
            "kind": "epic",
            "prefix": "gt-",
            "title": "Epic",
            "priority": "2",
            "issue_type": "task",
            "children": "Design\nBuild\nShip | after 7",
        },
    )
    form = response.context["form"]
    assert form.errors["children"] == ["line 3: 'after 7' must name an earlier line (lines 1 to 2)"]
    assert "Children" in str(form["children"].label)
