"""Shared plumbing for the command-line tools: one-line errors, JSON output."""

import json

from django.core.management.base import BaseCommand, CommandError

from ..services.errors import ServiceError


class error(CommandError):  # noqa: N801 - printed by Django as "error: <message>"
    pass


class ServiceCommand(BaseCommand):
    """Turns a ServiceError into `error: <message>` on stderr and exit status 1."""

    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except ServiceError as exc:
            raise error(str(exc))

    def write_json(self, data):
        self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str))

    def add_json(self, parser):
        parser.add_argument("--json", action="store_true", help="machine-readable output")
