"""Roles: the three groups a colleague is put in, Viewer, Operator and Admin, stated here once.
Migration 0022 creates them (`install`, with the migration's models), and a later migration
that adds a table gives them its permissions (`extend`); after any later
migrate, or a test's flush, a missing one is made again (`connect`). `manage.py users` adds
users to them and moves users between them (`add_user`, `set_role`, `users`).

What each role may do is the permissions the pages, the API and the websocket check:
  Viewer    every view_* of the convoys app (pages and the socket check view_convoy, the
            API's bead reads view_bead); acknowledging an escalation and subscribing
            oneself need no more.
  Operator  also add_convoy (stage), change_convoy (launch, pause, resume, close, land, add
            beads, re-check), change_bead (retry, close and reopen beads, dependencies,
            the workers' heartbeat) and change_rig (un-park a rig).
  Admin     every convoys permission and auth's user and group ones, with is_staff: the
            Django admin, Users and Groups included (subscribing others is done there).
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from django.apps import apps as global_apps
from django.apps.registry import Apps
from django.contrib.auth import get_user_model
from django.contrib.auth.management import create_permissions
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models.signals import post_migrate
from django.utils.crypto import get_random_string

from convoys.services.errors import NotFound, ServiceError

if TYPE_CHECKING:
    from django.contrib.auth.models import User


@dataclass(frozen=True)
class Role:
    name: str  # as typed on the command line
    group: str  # the auth group that carries its permissions
    staff: bool  # may sign in to the Django admin
    grants: dict[str, tuple[str, ...]]  # app label -> codename patterns (fnmatch)


OPERATES = ("add_convoy", "change_convoy", "change_bead", "change_rig")
ROLES = {
    "viewer": Role("viewer", "Viewer", False, {"convoys": ("view_*",)}),
    "operator": Role("operator", "Operator", False, {"convoys": ("view_*", *OPERATES)}),
    "admin": Role("admin", "Admin", True, {"convoys": ("*",), "auth": ("*_user", "*_group")}),
}
APPS = ("auth", "convoys")  # whose permissions the roles are made of
PASSWORD_LENGTH = 20  # a generated password: letters and digits


def role_named(name: str) -> Role:
    role = ROLES.get(name.lower())
    if role is None:
        raise ServiceError(f"unknown role '{name}': choose one of {', '.join(ROLES)}")
    return role


def permissions_of(role: Role, available: Iterable[tuple[int, str, str]]) -> list[int]:
    """The pks of the permissions `role` grants among (pk, app label, codename) rows."""
    return [
        pk
        for pk, app_label, codename in available
        if any(fnmatchcase(codename, pattern) for pattern in role.grants.get(app_label, ()))
    ]


def install(apps: Apps = global_apps, using: str = DEFAULT_DB_ALIAS, *, reset: bool = True) -> None:
    """The three groups with their permissions, in the models of `apps` (a migration's own).
    The permissions are made first: Django makes them only after a migrate ends. `reset`:
    each group gets exactly its role's permissions; else only a missing group is made.
    Running it again changes nothing."""
    for label in APPS:
        # create_permissions reads the models from `apps`, but wants the installed app's
        # config (a migration's stand-in has no models module and would be skipped).
        create_permissions(global_apps.get_app_config(label), verbosity=0, using=using, apps=apps)
    group_model: Any = apps.get_model("auth", "Group")
    permission_model: Any = apps.get_model("auth", "Permission")
    available = list(
        permission_model.objects.using(using)
        .filter(content_type__app_label__in=APPS)
        .values_list("pk", "content_type__app_label", "codename")
    )
    for role in ROLES.values():
        group, created = group_model.objects.using(using).get_or_create(name=role.group)
        if created or reset:
            group.permissions.set(permissions_of(role, available))


def extend(apps: Apps, using: str, models: Iterable[str]) -> None:
    """Give each existing group what its role grants on `models` (a later migration's new
    tables), leaving the rest of what an admin may have changed as it is."""
    for label in APPS:
        create_permissions(global_apps.get_app_config(label), verbosity=0, using=using, apps=apps)
    group_model: Any = apps.get_model("auth", "Group")
    permission_model: Any = apps.get_model("auth", "Permission")
    available = list(
        permission_model.objects.using(using)
        .filter(content_type__app_label__in=APPS, content_type__model__in=list(models))
        .values_list("pk", "content_type__app_label", "codename")
    )
    for role in ROLES.values():
        group = group_model.objects.using(using).filter(name=role.group).first()
        if group is not None:
            group.permissions.add(*permissions_of(role, available))


def _after_migrate(sender: Any, using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    install(kwargs.get("apps") or global_apps, using, reset=False)


def connect() -> None:
    """Called once from the app's ready(): a flushed database (tests) or a deleted group gets
    its role back at the next migrate; a group an admin changed keeps its permissions."""
    post_migrate.connect(_after_migrate, sender=global_apps.get_app_config("convoys"))


def group_of(role: Role) -> Group:
    group = Group.objects.filter(name=role.group).first()
    if group is None:  # deleted since the last migrate
        install(reset=False)
        group = Group.objects.get(name=role.group)
    return group


def _refused(what: str, exc: ValidationError) -> ServiceError:
    return ServiceError(f"{what}: {' '.join(exc.messages)}")


def add_user(
    name: str, role_name: str, *, email: str = "", password: str | None = None
) -> tuple["User", str]:
    """A new active user in one role, and the password it signs in with (generated when
    `password` is None). Refused, with nothing written, for a taken or malformed name, a
    malformed e-mail address or a password the validators refuse."""
    role = role_named(role_name)
    users = get_user_model()
    if not name.strip():
        raise ServiceError("a user name is required")
    try:
        users._meta.get_field("username").clean(name, None)
    except ValidationError as exc:
        raise _refused(f"user name '{name}'", exc)
    taken = users.objects.filter(username__iexact=name).first()
    if taken is not None:
        raise ServiceError(f"user '{taken.get_username()}' already exists")
    if email:
        try:
            validate_email(email)
        except ValidationError as exc:
            raise _refused(f"e-mail '{email}'", exc)
    if password is None:
        password = get_random_string(PASSWORD_LENGTH)
    try:
        validate_password(password, users(username=name, email=email))
    except ValidationError as exc:
        raise _refused("password refused", exc)
    with transaction.atomic():
        user = users.objects.create_user(name, email, password)
        _move(user, role)
    return user, password


def _move(user: "User", role: Role) -> None:
    others = Group.objects.filter(name__in=[r.group for r in ROLES.values() if r is not role])
    user.groups.remove(*others)
    user.groups.add(group_of(role))
    if user.is_staff != role.staff:
        user.is_staff = role.staff
        user.save(update_fields=["is_staff"])


def set_role(name: str, role_name: str) -> "User":
    """`name` in exactly this role: out of the other two, is_staff only for admin."""
    role = role_named(role_name)
    user = get_user_model().objects.filter(username=name).first()
    if user is None:
        raise NotFound(f"user '{name}' not found")
    with transaction.atomic():
        _move(user, role)
    return user


@dataclass(frozen=True)
class UserRow:
    name: str
    roles: list[str]  # role names, in ROLES' order
    email: str
    active: bool
    staff: bool
    superuser: bool
    last_login: datetime | None


def users() -> list[UserRow]:
    """Every user with the roles its groups give it."""
    names = {role.group: role.name for role in ROLES.values()}
    order = list(ROLES)
    rows = []
    for user in get_user_model().objects.prefetch_related("groups").order_by("username"):
        roles = sorted(
            (names[g.name] for g in user.groups.all() if g.name in names), key=order.index
        )
        rows.append(
            UserRow(
                user.get_username(),
                roles,
                user.email,
                user.is_active,
                user.is_staff,
                user.is_superuser,
                user.last_login,
            )
        )
    return rows
