"""When each user last opened each convoy ("since your last visit"): one row per user and
convoy, written when the convoy page's script reports the page was shown. Not an event: a
visit changes nothing anyone else sees."""

from datetime import datetime
from typing import TYPE_CHECKING

from django.db import transaction

from convoys.models import Convoy, ConvoyVisit

if TYPE_CHECKING:
    from django.contrib.auth.models import User


@transaction.atomic
def visit(user: "User", convoy: Convoy, seq: int, now: datetime) -> ConvoyVisit | None:
    """Record that `user` saw `convoy` as of event `seq`; return the previous visit (a
    ConvoyVisit, unsaved copy) or None on a first visit. A report older than the stored
    visit (a stale tab) keeps the newer one."""
    row = ConvoyVisit.objects.select_for_update().filter(user=user, convoy_id=convoy.pk).first()
    if row is None:
        ConvoyVisit.objects.create(user=user, convoy_id=convoy.pk, seq=seq, at=now)
        return None
    previous = ConvoyVisit(user=user, convoy_id=convoy.pk, seq=row.seq, at=row.at)
    if seq > row.seq:
        row.seq, row.at = seq, now
        row.save(update_fields=["seq", "at"])
    return previous
