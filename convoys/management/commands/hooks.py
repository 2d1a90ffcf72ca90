"""`manage.py hooks add URL (--user U | --convoy ID | --town) [--kinds K,…] [--secret S] |
list [--json] | remove ID | test ID | deliveries ID [--json]`: outbound webhooks and chat
targets (docs/notifications.md#webhooks-and-chat)."""

from argparse import ArgumentParser
from json import dumps
from typing import Any

from convoys.core import webhooks
from convoys.management.base import ServiceCommand, error
from convoys.models import WebhookDelivery, WebhookTarget
from convoys.services import hooks


def _delivery(row: WebhookDelivery) -> dict[str, Any]:
    return {
        "id": row.pk,
        "event_id": row.event_id,
        "kind": row.kind,
        "created_at": row.created_at,
        "last_attempt_at": row.last_attempt_at,
        "status_code": row.status_code,
        "latency_ms": row.latency_ms,
        "attempts": row.attempts,
        "state": row.state,
        "error": row.error,
        "next_attempt_at": row.next_attempt_at,
        "body": row.body,
    }


def _target(row: WebhookTarget) -> dict[str, Any]:
    return {
        "id": row.pk,
        "url": row.url,
        "scope": row.scope,
        "for": row.owner,
        "kinds": list(webhooks.kinds_of(row.kinds)),
        "chat": webhooks.is_chat(row.url),
        "active": row.active,
        "created_by": row.created_by,
        "created_at": row.created_at,
    }


class Command(ServiceCommand):
    help = "Outbound webhooks and chat: add, list, remove, test a target; its deliveries."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="a new target (prints its id, and a generated secret)")
        add.add_argument("url", help="an http(s) URL (signed webhook) or an Apprise URL (chat)")
        scope = add.add_mutually_exclusive_group(required=True)
        scope.add_argument("--user", metavar="USERNAME", help="that user's own convoys")
        scope.add_argument("--convoy", metavar="ID", help="one convoy")
        scope.add_argument("--town", action="store_true", help="every convoy of the town")
        add.add_argument(
            "--kinds",
            help=f"comma-separated, of {', '.join(webhooks.KINDS)} (default: all but dispatched)",
        )
        add.add_argument("--secret", help="whsec_… (default: a new one, printed once)")
        self.add_json(sub.add_parser("list", help="every target"))
        remove = sub.add_parser("remove", help="delete a target and its deliveries")
        remove.add_argument("id", type=int)
        test = sub.add_parser("test", help="send a test event now; prints status and latency")
        test.add_argument("id", type=int)
        shown = sub.add_parser("deliveries", help="a target's recent deliveries")
        shown.add_argument("id", type=int)
        shown.add_argument("--limit", type=int, default=50)
        self.add_json(shown)

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        getattr(self, action)(**options)

    def add(
        self,
        url: str,
        user: str | None,
        convoy: str | None,
        town: bool,
        kinds: str | None,
        secret: str | None,
        **options: Any,
    ) -> None:
        owner = hooks.users_named(user) if user else None
        added = hooks.add_target(
            url,
            user=owner,
            convoy_id=convoy,
            town=town,
            kinds=kinds,
            secret=secret,
            actor="cli",
        )
        target = added.target
        kinds_shown = ",".join(webhooks.kinds_of(target.kinds))
        whose = target.scope if target.scope == target.TOWN else f"{target.scope} {target.owner}"
        self.stdout.write(f"Added target {target.pk} ({whose}): {kinds_shown}")
        if added.secret:
            self.stdout.write(f"secret: {added.secret}")

    def list(self, json: bool, **options: Any) -> None:
        rows = hooks.targets()
        if json:
            self.write_json([_target(row) for row in rows])
            return
        if not rows:
            self.stdout.write("No targets.")
        for row in rows:
            state = "" if row.active else "  (inactive)"
            self.stdout.write(
                f"{row.pk:>5}  {row.scope:<6} {row.owner or '-':<16} {row.url}  "
                f"{','.join(webhooks.kinds_of(row.kinds))}{state}"
            )

    def remove(self, id: int, **options: Any) -> None:  # noqa: A002 - the argument's name
        row = hooks.remove_target(id)
        self.stdout.write(f"Removed target {id} ({row.url})")

    def test(self, id: int, **options: Any) -> None:  # noqa: A002
        row = hooks.send_test(hooks.get_target(id))
        status = row.status_code if row.status_code is not None else "-"
        latency = f"{row.latency_ms:.0f} ms" if row.latency_ms is not None else "-"
        if row.delivered_at is None:
            raise error(f"test to target {id} failed: status {status}, {latency}: {row.error}")
        self.stdout.write(f"Delivered: status {status}, {latency}")

    def deliveries(self, id: int, limit: int, json: bool, **options: Any) -> None:  # noqa: A002
        if limit <= 0:
            raise error(f"--limit must be a positive number, got {limit}")
        rows = hooks.deliveries(hooks.get_target(id), limit)
        if json:
            self.write_json([_delivery(row) for row in rows])
            return
        if not rows:
            self.stdout.write("No deliveries.")
        for row in rows:
            status = row.status_code if row.status_code is not None else "-"
            latency = f"{row.latency_ms:.0f}ms" if row.latency_ms is not None else "-"
            when = row.last_attempt_at or row.created_at
            self.stdout.write(
                f"{when:%Y-%m-%d %H:%M:%S}  {row.kind:<13} status {status}  {latency}  "
                f"attempts {row.attempts}  {row.state}"
                + (f"  {row.error}" if row.error and not row.delivered_at else "")
            )
            self.stdout.write(f"    {hooks_body(row)}")


def hooks_body(row: WebhookDelivery) -> str:
    return dumps(row.body, ensure_ascii=False, separators=(",", ":"))
