"""API tokens that can end: an expiry, a last-used time, revocation from the command line and
the admin, and every token of a user gone when their password changes."""

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError
from django.test import Client
from django.utils import timezone

from convoys.models import ApiToken
from convoys.services import tokens

from .support.factories import command
from .support.users import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer():
    user = User.objects.create_user("ada", password=PASSWORD)
    user.user_permissions.add(Permission.objects.get(codename="view_convoy"))
    return user


def status_with(token):
    return Client().get("/api/convoys", headers={"Authorization": f"Bearer {token}"}).status_code


def test_a_token_from_the_command_line_works_lists_and_revokes(viewer):
    raw = command("tokens", "create", "ada", "--name", "laptop", "--expires", "30").strip()
    assert raw.startswith("cvw_")
    assert status_with(raw) == 200
    [row] = json.loads(command("tokens", "list", "--json"))
    assert (row["user"], row["name"]) == ("ada", "laptop")
    assert row["last_used_at"] is not None  # the call above
    expires = timezone.datetime.fromisoformat(row["expires_at"])
    assert timedelta(days=29) < expires - timezone.now() <= timedelta(days=30)
    assert raw not in command("tokens", "list") and "laptop" in command("tokens", "list", "ada")
    assert "Revoked token" in command("tokens", "revoke", str(row["id"]))
    assert status_with(raw) == 401
    assert command("tokens", "list") == "No tokens.\n"


def test_an_expired_token_is_refused(viewer):
    raw = tokens.create_token(viewer, "short", expires_at=timezone.now() + timedelta(hours=1))
    assert status_with(raw) == 200
    ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert status_with(raw) == 401


def test_last_used_is_written_at_most_once_a_minute(viewer):
    raw = tokens.create_token(viewer, "busy")
    status_with(raw)
    first = ApiToken.objects.get().last_used_at
    status_with(raw)
    assert ApiToken.objects.get().last_used_at == first
    ApiToken.objects.update(last_used_at=first - timedelta(minutes=2))
    status_with(raw)
    assert ApiToken.objects.get().last_used_at > first


def test_a_password_change_deletes_every_token_of_that_user(viewer):
    other = User.objects.create_user("bob", password=PASSWORD)
    mine = [tokens.create_token(viewer, "a"), tokens.create_token(viewer, "b")]
    theirs = tokens.create_token(other, "c")
    viewer.first_name = "Ada"
    viewer.save()  # not a password change
    assert ApiToken.objects.filter(user=viewer).count() == 2
    viewer.set_password("a-new-pass-456")
    viewer.save()
    assert [status_with(raw) for raw in mine] == [401, 401]
    assert ApiToken.objects.filter(user=other).count() == 1 and status_with(theirs) == 403


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("tokens", "revoke", "999"), "token 999 not found"),
        (("tokens", "create", "nobody"), "user 'nobody' not found"),
        (("tokens", "create", "ada", "--expires", "0"), "--expires must be a positive"),
    ],
)
def test_bad_token_commands_say_what_is_wrong_and_change_nothing(viewer, args, message):
    with pytest.raises(CommandError, match=message):
        command(*args)
    assert not ApiToken.objects.exists()


def test_the_admin_sets_an_expiry_shows_last_use_and_revokes(client):
    root = User.objects.create_superuser("root", password=PASSWORD)
    client.force_login(root)
    later = (timezone.now() + timedelta(days=7)).replace(microsecond=0)
    answer = client.post(
        "/admin/convoys/apitoken/add/",
        {
            "user": root.pk,
            "name": "ci",
            "expires_at_0": later.strftime("%Y-%m-%d"),
            "expires_at_1": later.strftime("%H:%M:%S"),
            "_save": "Save",
        },
    )
    assert answer.status_code == 200, answer.content
    raw = answer.context["token"]
    token = ApiToken.objects.get()
    assert token.expires_at == later
    assert status_with(raw) == 200
    listing = client.get("/admin/convoys/apitoken/").content.decode()
    assert "Last used at" in listing and "Expires at" in listing
    answer = client.post(f"/admin/convoys/apitoken/{token.pk}/delete/", {"post": "yes"})
    assert answer.status_code == 302
    assert status_with(raw) == 401
