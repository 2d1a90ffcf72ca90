"""django-q2 entry points: each a few lines calling a service."""

import logging

from django_q.tasks import async_task

log = logging.getLogger("convoys.tasks")


def enqueue_close_handling(seq):
    """After a close commits: hand the close event to the cluster."""
    try:
        async_task("convoys.tasks.handle_close", seq, task_name=f"close-{seq}", group="feeder")
    except Exception:  # the catch-up feeder picks it up within CONVOY_FEED_INTERVAL
        log.exception("could not enqueue close event %s", seq)


def handle_close(seq):
    from .services import feeding

    return feeding.handle_close_event(seq, path="event")


def catch_up():
    from .services import feeding

    return feeding.catch_up()


def stranded_scan():
    from .services import feeding

    return feeding.stranded_scan()


def send_notification_emails(notification_ids):
    from .services import notify

    return notify.send_emails(notification_ids)
