"""`manage.py users add NAME --role viewer|operator|admin [--email E] [--password-stdin] [--json]
| list [--json] | role NAME ROLE`: colleagues and their roles (convoys.services.roles)."""

import sys
from argparse import ArgumentParser
from typing import Any, TextIO

from convoys.management.base import ServiceCommand, error
from convoys.services import roles

CHOICES = "|".join(roles.ROLES)


class Command(ServiceCommand):
    help = f"Users and their roles ({', '.join(roles.ROLES)}): add, list, change a role."
    stealth_options = ("stdin",)  # call_command(..., stdin=...) in tests

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="a new user in one role; prints its password")
        add.add_argument("name")
        add.add_argument("--role", required=True, metavar=CHOICES)
        add.add_argument("--email", default="")
        add.add_argument(
            "--password-stdin",
            action="store_true",
            help="read the password from the first line of stdin (else one is generated)",
        )
        self.add_json(add)
        listing = sub.add_parser("list", help="every user: roles, e-mail, active, last login")
        self.add_json(listing)
        role = sub.add_parser("role", help="move a user to exactly this role")
        role.add_argument("name")
        role.add_argument("role", metavar=CHOICES)

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        getattr(self, action)(**options)

    def add(
        self, name: str, role: str, email: str, password_stdin: bool, json: bool, **options: Any
    ) -> None:
        password = None
        if password_stdin:
            stdin: TextIO = options.get("stdin") or sys.stdin
            line = stdin.readline()
            if not line:
                raise error("--password-stdin: stdin is empty")
            password = line.rstrip("\r\n")
        user, password = roles.add_user(name, role, email=email, password=password)
        group = roles.role_named(role).group
        if json:
            answer = {"name": user.get_username(), "role": roles.role_named(role).name}
            self.write_json(answer if password_stdin else answer | {"password": password})
        elif password_stdin:
            self.stdout.write(f"Added {user.get_username()} as {group}.")
        else:
            self.stdout.write(f"Added {user.get_username()} as {group}. Password (shown once):")
            self.stdout.write(password)

    def list(self, json: bool, **options: Any) -> None:
        rows = roles.users()
        if json:
            self.write_json(
                [
                    {
                        "name": row.name,
                        "roles": row.roles,
                        "email": row.email,
                        "active": row.active,
                        "staff": row.staff,
                        "superuser": row.superuser,
                        "last_login": row.last_login,
                    }
                    for row in rows
                ]
            )
            return
        if not rows:
            self.stdout.write("No users.")
        width = max((len(row.name) for row in rows), default=0)
        for row in rows:
            held = ",".join(row.roles + (["superuser"] if row.superuser else [])) or "-"
            seen = f"{row.last_login:%Y-%m-%d %H:%M}" if row.last_login else "never"
            self.stdout.write(
                f"{row.name:<{width}}  {held:<16}  {row.email or '-':<24}  "
                f"{'active' if row.active else 'inactive':<8}  last login {seen}"
            )

    def role(self, name: str, role: str, **options: Any) -> None:
        user = roles.set_role(name, role)
        note = " (still a superuser: every permission)" if user.is_superuser else ""
        self.stdout.write(f"{user.get_username()} is now {roles.role_named(role).group}{note}.")
