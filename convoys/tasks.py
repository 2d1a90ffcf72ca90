"""django-q2 entry points: each a few lines calling a service. Tasks are enqueued through
convoys/log/queue.py (by dotted name), so nothing below imports this module."""

from convoys.services import deadlines, escalation, feeding, hooks, notify, timekeeping


def feed_town() -> list[str]:
    return [r["id"] for r in feeding.feed_town("event")]


def handle_close(seq: int) -> feeding.CloseHandled:
    return feeding.handle_close_event(seq, path="event")


def catch_up() -> feeding.CatchUp:
    return feeding.catch_up()


def stranded_scan() -> feeding.ScanSummary:
    summary = feeding.stranded_scan()
    summary["escalated"] = escalation.escalate_stuck()  # idempotent: conditional updates
    summary["deadlines"] = [t.state for t in deadlines.check()]  # the same
    return summary


def send_digests() -> int:
    return int(notify.send_digests())


def send_notification_emails(notification_ids: list[int]) -> int:
    return int(notify.send_emails(notification_ids))


def pass_time() -> dict[str, object]:
    return timekeeping.pass_time()


def deliver_webhooks(delivery_ids: list[int]) -> int:
    return hooks.deliver(delivery_ids)


def deliver_due_webhooks() -> int:
    return hooks.deliver_due()
