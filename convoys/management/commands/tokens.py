"""`manage.py tokens create USERNAME [--name NAME]`: an API bearer token (shown once)."""

from argparse import ArgumentParser
from typing import Any

from django.contrib.auth import get_user_model

from ...services.tokens import create_token
from ..base import ServiceCommand, error


class Command(ServiceCommand):
    help = "Create an API token for a user (workers and tools use it as a Bearer token)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        p = sub.add_parser("create")
        p.add_argument("username")
        p.add_argument("--name", default="cli")

    def handle(self, *args: Any, action: str, username: str, name: str, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise error(f"user '{username}' not found")
        self.stdout.write(create_token(user, name))
