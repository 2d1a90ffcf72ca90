"""django-q2 entry points: each a few lines calling a service."""

import logging
import os

from django_q.brokers import get_broker
from django_q.tasks import async_task

log = logging.getLogger("convoys.tasks")
_brokers = {}


def enqueue(func, *args, **options):
    """`async_task` through this process's broker. Left to itself, django-q2 builds a broker
    per task, which on Redis means a new connection (a third of a close's cost)."""
    pid = os.getpid()  # a forked process builds its own
    if pid not in _brokers:
        _brokers[pid] = get_broker()
    return async_task(func, *args, broker=_brokers[pid], **options)


def enqueue_close_handling(seq):
    """After a close commits: hand the close event to the cluster."""
    try:
        enqueue("convoys.tasks.handle_close", seq, task_name=f"close-{seq}", group="feeder")
    except Exception:  # the catch-up feeder picks it up within CONVOY_FEED_INTERVAL
        log.exception("could not enqueue close event %s", seq)


def enqueue_town_feed():
    """After a failed dispatch commits under a town cap: its freed slot goes to the queue."""
    try:
        enqueue("convoys.tasks.feed_town", task_name="feed-town", group="feeder")
    except Exception:  # the catch-up feeder fills the slot within CONVOY_FEED_INTERVAL
        log.exception("could not enqueue a town feed")


def feed_town():
    from .services import feeding

    return [r["id"] for r in feeding.feed_town("event")]


def handle_close(seq):
    from .services import feeding

    return feeding.handle_close_event(seq, path="event")


def catch_up():
    from .services import feeding

    return feeding.catch_up()


def stranded_scan():
    from .services import escalation, feeding

    summary = feeding.stranded_scan()
    summary["escalated"] = escalation.escalate_stuck()  # idempotent: conditional updates
    return summary


def send_digests():
    from .services import notify

    return notify.send_digests()


def send_notification_emails(notification_ids):
    from .services import notify

    return notify.send_emails(notification_ids)
