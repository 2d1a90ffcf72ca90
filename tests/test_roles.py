"""Roles (Viewer, Operator, Admin): the groups migration 0022 makes, `manage.py users` that puts
colleagues in them, and what each role's user then gets from the pages, the API and the admin,
signed in with the password the command printed."""

import io
import json

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from convoys.models import Convoy
from convoys.services import roles, staging
from convoys.services.launch import launch_staged
from convoys.services.tokens import create_token

from .support.factories import bead, blocks

pytestmark = pytest.mark.django_db


def users(*args, stdin=None):
    """`manage.py users …`: its stdout."""
    out = io.StringIO()
    call_command("users", *args, stdout=out, stderr=io.StringIO(), stdin=stdin)
    return out.getvalue()


def added(name, role):
    """A user made by `users add`, signed in with the password it printed."""
    printed = users("add", name, "--role", role).splitlines()
    assert printed[0] == f"Added {name} as {roles.ROLES[role].group}. Password (shown once):"
    client = Client()
    response = client.post("/login/", {"username": name, "password": printed[1], "next": "/"})
    assert response.status_code == 302 and response.headers["Location"] == "/", name
    return client


def perms(group):
    return set(Group.objects.get(name=group).permissions.values_list("codename", flat=True))


@pytest.fixture
def town(routes):
    """A launched convoy (gt-a blocks gt-b) and a staged one (gt-c)."""
    for bead_id in ("gt-a", "gt-b", "gt-c"):
        bead(bead_id)
    blocks("gt-a", "gt-b")
    launched = staging.stage(["gt-a", "gt-b"], actor="test").convoy_id
    launch_staged(launched, force=True)
    staged = staging.stage(["gt-c"], actor="test").convoy_id
    return {"launched": launched, "staged": staged}


# --- the groups ---------------------------------------------------------------------------------
def test_the_migration_made_the_three_groups_with_their_permissions():
    assert set(Group.objects.values_list("name", flat=True)) >= {"Viewer", "Operator", "Admin"}
    viewer, operator, admin = perms("Viewer"), perms("Operator"), perms("Admin")
    assert {"view_convoy", "view_bead", "view_rig", "view_event", "view_subscription"} <= viewer
    assert all(codename.startswith("view_") for codename in viewer)
    assert operator - viewer == {"add_convoy", "change_convoy", "change_bead", "change_rig"}
    assert viewer < operator < admin
    assert {"add_user", "change_user", "delete_user", "add_group", "change_group"} <= admin
    assert {"delete_convoy", "add_bead", "change_subscription"} <= admin
    assert "add_permission" not in admin and "add_user" not in operator


def test_installing_again_or_on_a_database_without_permissions_gives_the_same_groups():
    """As the migration runs on a database migrated from scratch: with the models of 0022's
    state and no permission made yet (Django makes them after migrate ends)."""
    before = {name: perms(name) for name in ("Viewer", "Operator", "Admin")}
    roles.install()  # again: nothing changes
    assert {name: perms(name) for name in before} == before
    Group.objects.filter(name__in=before).delete()
    Permission.objects.all().delete()
    loader = MigrationExecutor(connection).loader
    roles.install(loader.project_state(("convoys", "0022_roles")).apps)
    merges = loader.project_state(("convoys", "0024_merges")).apps
    roles.extend(merges, "default", ["merge", "forgedelivery"])
    webhooks = loader.project_state(("convoys", "0025_webhook_targets")).apps
    roles.extend(webhooks, "default", ["webhooktarget", "webhookdelivery"])
    cockpit = loader.project_state(("convoys", "0028_attempts_logs_views")).apps
    roles.extend(cockpit, "default", ["logline", "savedview"])
    assert {name: perms(name) for name in before} == before


def test_a_deleted_group_comes_back_when_a_user_is_given_its_role():
    Group.objects.filter(name="Operator").delete()
    users("add", "olga", "--role", "operator", "--password-stdin", stdin=io.StringIO("pw-olga-1\n"))
    assert list(User.objects.get(username="olga").groups.values_list("name", flat=True)) == [
        "Operator"
    ]
    assert "change_convoy" in perms("Operator")


# --- what each role gets ------------------------------------------------------------------------
def test_a_viewer_reads_pages_and_the_api_but_changes_nothing(town):
    client = added("vera", "viewer")
    convoy = town["launched"]
    for path in ("/", f"/convoys/{convoy}/", "/beads/gt-a/", "/stranded/", "/subscriptions/"):
        assert client.get(path).status_code == 200, path
    for path in ("/api/beads", "/api/convoys", f"/api/convoys/{convoy}", "/api/beads/gt-a"):
        assert client.get(path).status_code == 200, path
    assert client.post(f"/convoys/{convoy}/subscribe/").status_code == 302  # oneself: viewing
    assert client.post(f"/convoys/{convoy}/pause/", {"reason": "r"}).status_code == 403
    assert client.post(f"/convoys/{town['staged']}/launch/").status_code == 403
    assert client.post("/beads/gt-a/retry/").status_code == 403
    pause = f"/api/convoys/{convoy}/pause"
    assert client.post(pause, "{}", content_type="application/json").status_code == 403
    token = {"HTTP_AUTHORIZATION": f"Bearer {create_token(User.objects.get(username='vera'), 't')}"}
    assert Client().get("/api/beads", **token).status_code == 200
    assert Client().post(pause, "{}", content_type="application/json", **token).status_code == 403
    assert Client().post(pause, "{}", content_type="application/json").status_code == 401
    assert client.get("/admin/").status_code == 302  # to the admin's login: not staff
    assert Convoy.objects.get(pk=convoy).paused_at is None


def test_an_operator_pauses_resumes_launches_and_retries(town):
    client = added("otto", "operator")
    convoy, staged = town["launched"], town["staged"]
    assert client.post(f"/convoys/{convoy}/pause/", {"reason": "lunch"}).status_code == 302
    assert Convoy.objects.get(pk=convoy).paused_at is not None
    assert client.post(f"/convoys/{convoy}/resume/").status_code == 302
    assert Convoy.objects.get(pk=convoy).paused_at is None
    assert client.post(f"/convoys/{staged}/launch/", {"force": "1"}).status_code == 302
    assert Convoy.objects.get(pk=staged).status == "open"
    assert client.post("/beads/gt-b/retry/").status_code == 302
    api = f"/api/convoys/{convoy}/pause"
    assert client.post(api, '{"reason": "r"}', content_type="application/json").status_code == 200
    bead("gt-d")
    assert client.post("/stage/", {"ids": "gt-d", "do": "stage"}).status_code == 302
    assert client.get("/admin/").status_code == 302  # not staff: no Django admin
    assert client.get("/create/").status_code == 403  # authoring beads is not operating


def test_an_admin_opens_the_admin_with_its_users_and_groups(town):
    client = added("ada", "admin")
    for path in (
        "/admin/",
        "/admin/auth/user/",
        "/admin/auth/user/add/",
        "/admin/auth/group/",
        f"/admin/auth/group/{Group.objects.get(name='Viewer').pk}/change/",
        "/admin/convoys/convoy/",
        f"/convoys/{town['launched']}/",
    ):
        assert client.get(path).status_code == 200, path
    assert client.post(f"/convoys/{town['launched']}/pause/").status_code == 302


def test_moving_a_user_to_another_role_leaves_exactly_that_one():
    users("add", "mo", "--role", "viewer", "--password-stdin", stdin=io.StringIO("pw-mo-123\n"))
    assert users("role", "mo", "admin") == "mo is now Admin.\n"
    mo = User.objects.get(username="mo")
    assert list(mo.groups.values_list("name", flat=True)) == ["Admin"] and mo.is_staff
    users("role", "mo", "Operator")  # any case
    mo = User.objects.get(username="mo")
    assert list(mo.groups.values_list("name", flat=True)) == ["Operator"] and not mo.is_staff
    assert mo.check_password("pw-mo-123")  # nothing else changed


def test_list_shows_roles_email_active_and_last_login():
    users("add", "li", "--role", "operator", "--email", "li@example.com")
    User.objects.create_superuser("root", "root@example.com", None)
    rows = json.loads(users("list", "--json"))
    assert [(r["name"], r["roles"], r["email"], r["active"]) for r in rows] == [
        ("li", ["operator"], "li@example.com", True),
        ("root", [], "root@example.com", True),
    ]
    assert rows[0]["last_login"] is None and rows[1]["superuser"]
    text = users("list").splitlines()
    assert text[0].split()[:4] == ["li", "operator", "li@example.com", "active"]
    assert "never" in text[0] and text[1].split()[1] == "superuser"


def test_add_with_json_and_a_password_from_stdin_prints_no_password():
    out = users(
        "add",
        "jo",
        "--role",
        "viewer",
        "--password-stdin",
        "--json",
        stdin=io.StringIO("pw-jo-1234\r\n"),
    )
    assert json.loads(out) == {"name": "jo", "role": "viewer"}
    assert User.objects.get(username="jo").check_password("pw-jo-1234")  # line end dropped


# --- hostile input: one line naming what is wrong, nothing written -------------------------------
@pytest.mark.parametrize(
    "args, stdin, message",
    [
        (
            ["add", "eve", "--role", "root"],
            None,
            "unknown role 'root': choose one of viewer, operator, admin",
        ),
        (["add", "taken", "--role", "viewer"], None, "user 'taken' already exists"),
        (["add", "TAKEN", "--role", "viewer"], None, "user 'taken' already exists"),
        (
            ["add", "eve", "--role", "viewer", "--password-stdin"],
            "short\n",
            "password refused: This password is too short",
        ),
        (
            ["add", "eve", "--role", "viewer", "--password-stdin"],
            "",
            "--password-stdin: stdin is empty",
        ),
        (
            ["add", "eve", "--role", "viewer", "--password-stdin"],
            "\n",
            "password refused: This password is too short",
        ),
        (["add", "", "--role", "viewer"], None, "a user name is required"),
        (["add", "   ", "--role", "viewer"], None, "a user name is required"),
        (["add", "eve ev", "--role", "viewer"], None, "user name 'eve ev': Enter a valid username"),
        (
            ["add", "e" * 151, "--role", "viewer"],
            None,
            "Ensure this value has at most 150 characters",
        ),
        (
            ["add", "eve", "--role", "viewer", "--email", "nope"],
            None,
            "e-mail 'nope': Enter a valid email address",
        ),
        (["role", "nobody", "admin"], None, "user 'nobody' not found"),
        (
            ["role", "taken", "god"],
            None,
            "unknown role 'god': choose one of viewer, operator, admin",
        ),
    ],
)
def test_refused_input_is_one_line_and_writes_nothing(args, stdin, message):
    users("add", "taken", "--role", "viewer", "--password-stdin", stdin=io.StringIO("pw-taken-1\n"))
    before = list(User.objects.values_list("username", "is_staff", "groups__name"))
    with pytest.raises(CommandError) as refused:
        users(*args, stdin=io.StringIO(stdin) if stdin is not None else None)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert list(User.objects.values_list("username", "is_staff", "groups__name")) == before
