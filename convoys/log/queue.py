"""The task queue seen from the writers: django-q2 tasks enqueued after the writer's commit.

Zulip's `send_event_on_commit` shape: a writer that commits something the cluster must act on
says so with one call inside its transaction, and the task is enqueued only if the transaction
commits (at once outside one). Tasks are named by their dotted path, so this module imports no
service and no task: `tasks` imports the services, the services import this module, never
`tasks`. A failed enqueue is logged and left to the catch-up feeder (CONVOY_FEED_INTERVAL).

The writers: a `bead.closed` event (`beads.update_bead`, the import and sync) hands its close
to `handle_close`; a failed dispatch under a town cap feeds the town (its freed slot goes to
the queue's head); notifications that want e-mail send them.
"""

import logging
import os
from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django_q.brokers import Broker, get_broker
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.tasks import async_task

log = logging.getLogger("convoys.log.queue")
_brokers: dict[int, Broker] = {}


def enqueue(func: str, *args: Any, **options: Any) -> Any:
    """`async_task` through this process's broker, now. Left to itself, django-q2 builds a
    broker per task, which on Redis means a new connection (a third of a close's cost). On
    the database's own broker the task row is written in a transaction of its own: outside
    one, the broker first closes the caller's connection (`close_old_connections`, meant for
    the cluster's broker thread), and a served request then opens another just for the row."""
    chosen = broker()
    if isinstance(chosen, ORM):
        with transaction.atomic(using=Conf.ORM):
            return async_task(func, *args, broker=chosen, **options)
    return async_task(func, *args, broker=chosen, **options)


def broker() -> Broker:
    """This process's broker (a forked process builds its own)."""
    pid = os.getpid()
    if pid not in _brokers:
        _brokers[pid] = get_broker()
    return _brokers[pid]


def length() -> int:
    """Tasks waiting in the broker's queue (not the ones a worker holds)."""
    size: int = broker().queue_size()
    return size


def _enqueue_logged(what: str, func: str, *args: Any, **options: Any) -> None:
    try:
        enqueue(func, *args, **options)
    except Exception:  # the catch-up feeder (or the next scan) picks it up
        log.exception("could not enqueue %s", what)


def handle_closes_on_commit(seqs: Sequence[int]) -> None:
    """After the caller's transaction commits: hand each `bead.closed` event (by sequence
    number) to the cluster, which feeds the next ready beads."""
    if not seqs:
        return
    wanted = list(seqs)

    def after() -> None:
        for seq in wanted:
            _enqueue_logged(
                f"close event {seq}",
                "convoys.tasks.handle_close",
                seq,
                task_name=f"close-{seq}",
                group="feeder",
            )

    transaction.on_commit(after, robust=True)


def feed_town_on_commit() -> None:
    """After the caller's transaction commits: feed the town (a slot freed under a cap)."""
    transaction.on_commit(
        lambda: _enqueue_logged(
            "a town feed", "convoys.tasks.feed_town", task_name="feed-town", group="feeder"
        ),
        robust=True,
    )


def send_emails_on_commit(notification_ids: Sequence[int]) -> None:
    """After the caller's transaction commits: send these notifications' e-mails."""
    ids = list(notification_ids)
    if ids:
        transaction.on_commit(
            lambda: enqueue("convoys.tasks.send_notification_emails", ids, group="email"),
            robust=True,
        )


def deliver_webhooks_on_commit(delivery_ids: Sequence[int]) -> None:
    """After the caller's transaction commits: try these webhook deliveries. A lost enqueue
    is no loss: the ticker's webhook pass sends whatever is due."""
    ids = list(delivery_ids)
    if ids:
        transaction.on_commit(
            lambda: _enqueue_logged(
                "webhook deliveries", "convoys.tasks.deliver_webhooks", ids, group="webhooks"
            ),
            robust=True,
        )
