"""Users, their rights, and clients logged in as them: the one place a test gets a user."""

from django.contrib.auth.models import Permission, User
from django.test import Client

PASSWORD = "pw-pw-pw-123"

EDITOR_PERMISSIONS = [
    f"{action}_{model}"
    for model in ("bead", "convoy", "rig", "route", "event")
    for action in ("add", "change", "view")
]


def user_with(username, *codenames, email="", staff=False):
    """A new user with these permissions, read back fresh (Django caches a user's permissions
    on the object that first asked)."""
    user = User.objects.create_user(username, email=email, password=PASSWORD, is_staff=staff)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return User.objects.get(pk=user.pk)


def viewer(username, email=""):
    """Someone who may look at convoys and nothing more."""
    return user_with(username, "view_convoy", email=email)


def staff_user(name, codenames):
    """A staff member (the admin lets them in) with these convoys permissions."""
    return user_with(name, *codenames, staff=True)


def full_staff(name):
    """A staff member with every convoys permission: what the browser tests sign in as."""
    codenames = Permission.objects.filter(content_type__app_label="convoys")
    return user_with(name, *codenames.values_list("codename", flat=True), staff=True)


def logged_in(user, csrf=False):
    """A test client with a real session of `user`; `csrf` makes it check CSRF tokens as a
    browser's requests are checked."""
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def signed_in(username, *codenames):
    """A client logged in as a new user with these permissions."""
    return logged_in(user_with(username, *codenames))


def cookie_of(client):
    """The Cookie header of the client's session, for a websocket of the same login."""
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def session_cookie(user):
    """The Cookie header of a new session of `user`."""
    return cookie_of(logged_in(user))
