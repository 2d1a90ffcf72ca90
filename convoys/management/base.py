"""Shared plumbing for the command-line tools: one-line errors, JSON output."""

import datetime
import json
import logging
import os
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from convoys.services.errors import ServiceError


class error(CommandError):  # noqa: N801 - printed by Django as "error: <message>"
    pass


class ServiceCommand(BaseCommand):
    """Turns a ServiceError into `error: <message>` on stderr and exit status 1.

    No system checks before each call: agents run these commands by the thousand, and the
    checks (which load the URLconf, the admin and the API) run in CI and at `serve`.

    What the services log as they go (a feed's "fed …" lines) is a server's record, not the
    command's answer: it is printed with `-v 2` or an explicit LOG_LEVEL, warnings always."""

    requires_system_checks: list[str] = []

    def execute(self, *args: Any, **options: Any) -> str | None:
        logger = logging.getLogger("convoys")
        level = logger.level
        if options.get("verbosity", 1) < 2 and "LOG_LEVEL" not in os.environ:
            logger.setLevel(max(level, logging.WARNING))
        try:
            return super().execute(*args, **options)
        except ServiceError as exc:
            raise error(exc.explained("cli"))
        finally:
            logger.setLevel(level)

    def write_json(self, data: object) -> None:
        self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=json_value))

    def add_json(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="machine-readable output")


def json_value(value: object) -> str:
    """Times as RFC 3339 (`2026-12-01T05:04:32.709107+00:00`), anything else as text."""
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    return str(value)
