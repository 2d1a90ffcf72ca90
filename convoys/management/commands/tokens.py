"""`manage.py tokens create USERNAME [--name NAME] [--expires DAYS] | list [USERNAME] [--json] |
revoke ID`: API bearer tokens (the token itself is shown once, at creation)."""

from argparse import ArgumentParser
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone

from convoys.management.base import ServiceCommand, error
from convoys.services import tokens


class Command(ServiceCommand):
    help = "API tokens for workers and tools: create (shown once), list, revoke."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="a new token, printed once")
        create.add_argument("username")
        create.add_argument("--name", default="cli")
        create.add_argument("--expires", type=int, metavar="DAYS", help="stops working after")
        listing = sub.add_parser("list", help="every token (or one user's): never the token")
        listing.add_argument("username", nargs="?")
        self.add_json(listing)
        revoke = sub.add_parser("revoke", help="delete a token: it stops working at once")
        revoke.add_argument("id", type=int)

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        getattr(self, action)(**options)

    def create(self, username: str, name: str, expires: int | None, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise error(f"user '{username}' not found")
        if expires is not None and expires <= 0:
            raise error(f"--expires must be a positive number of days, got {expires}")
        until = timezone.now() + timedelta(days=expires) if expires else None
        self.stdout.write(tokens.create_token(user, name, expires_at=until))

    def list(self, username: str | None, json: bool, **options: Any) -> None:
        rows = tokens.tokens_of(username)
        if json:
            self.write_json(
                [
                    {
                        "id": row.pk,
                        "user": row.user.get_username(),
                        "name": row.name,
                        "created_at": row.created_at,
                        "expires_at": row.expires_at,
                        "last_used_at": row.last_used_at,
                    }
                    for row in rows
                ]
            )
            return
        if not rows:
            self.stdout.write("No tokens.")
        for row in rows:
            used = f"used {row.last_used_at:%Y-%m-%d %H:%M}" if row.last_used_at else "never used"
            ends = f"expires {row.expires_at:%Y-%m-%d %H:%M}" if row.expires_at else "no expiry"
            self.stdout.write(
                f"{row.pk:>5}  {row.user.get_username()}  {row.name}  "
                f"created {row.created_at:%Y-%m-%d %H:%M}  {ends}  {used}"
            )

    def revoke(self, id: int, **options: Any) -> None:  # noqa: A002 - the argument's name
        row = tokens.revoke(id)
        self.stdout.write(f"Revoked token {id} ({row.name}) of {row.user.get_username()}")
