"""The dispatch circuit breaker and the retry cooldown: which beads no path tries now.

A bead whose dispatch failed CONVOY_MAX_DISPATCH_FAILURES times in a row is parked (its
breaker is open) until an operator retries it (`controls.retry`); one whose dispatch failed
within CONVOY_RETRY_COOLDOWN seconds cools down. `dispatch.claim` refuses a parked bead, the
feeders and the capacity queue skip both, and the read models (stranding, causes, the bead
page) say so. The failure that reaches the limit trips the breaker: `dispatch` records it and
asks the people of each open convoy tracking the bead to act.
"""

from collections.abc import Collection, Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from convoys.models import Bead, Dispatch


def max_failures() -> int:
    limit: int = settings.CONVOY_MAX_DISPATCH_FAILURES
    return limit


def parked_beads() -> QuerySet[Bead]:
    """Beads whose breaker is open (failed dispatches in a row at the limit)."""
    return Bead.objects.filter(dispatch_failures__gte=max_failures())


def cooling_down(bead_ids: Collection[str], now: datetime | None = None) -> set[str]:
    """The beads among `bead_ids` not to try now: a dispatch failed within the cooldown, or
    the breaker parked them."""
    now, ids = now or timezone.now(), list(bead_ids)
    if not ids:
        return set()
    since = now - timedelta(seconds=settings.CONVOY_RETRY_COOLDOWN)
    failed = Dispatch.objects.filter(bead_id__in=ids, ok=False, created_at__gte=since)
    parked = parked_beads().filter(pk__in=ids)
    return set(failed.values_list("bead_id", flat=True)) | set(parked.values_list("pk", flat=True))


def recent_failures(now: datetime | None = None) -> set[str]:
    """Every bead whose dispatch failed within the cooldown, or that the breaker parked: one
    range scan of the (few) recent attempts, cheaper than a long IN list when many beads are
    ready."""
    now = now or timezone.now()
    since = now - timedelta(seconds=settings.CONVOY_RETRY_COOLDOWN)
    failed = Dispatch.objects.filter(created_at__gte=since, ok=False)
    return set(failed.values_list("bead_id", flat=True)) | set(
        parked_beads().values_list("pk", flat=True)
    )


def parked_among(bead_ids: Iterable[str]) -> dict[str, int]:
    """{bead id: failed dispatches in a row} of the parked beads among `bead_ids`."""
    return dict(parked_beads().filter(pk__in=bead_ids).values_list("pk", "dispatch_failures"))


def is_parked(bead: Bead) -> bool:
    return bead.dispatch_failures >= max_failures()


def last_error(bead: Bead) -> str:
    failed = Dispatch.objects.filter(bead_id=bead.pk, ok=False).order_by("-created_at").first()
    return failed.error if failed else ""
