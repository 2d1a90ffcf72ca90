"""A bead's log: the lines its worker appends, bounded per line and per bead (the oldest lines
dropped first), and the last line kept on the bead's facts for the convoy page."""

from typing import NamedTuple

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from convoys.core.ids import text_problem
from convoys.log.events import record
from convoys.log.kinds import LOG
from convoys.models import Bead, BeadFacts, LogLine
from convoys.services.errors import NotFound, ServiceError


class Appended(NamedTuple):
    bead_id: str
    appended: int  # lines written (after splitting and keeping the newest)
    dropped: int  # old lines dropped to stay within the bounds
    cut: int  # lines cut to CONVOY_LOG_LINE_CHARS
    last_id: int  # the id of the last line: `beads log --follow` continues after it


def lines_of(value: object, field: str = "lines") -> tuple[list[str], int]:
    """The lines a worker sent (a list of strings), each split at its line breaks and cut to
    CONVOY_LOG_LINE_CHARS; and how many were cut. A wrong type is refused, naming the item."""
    if not isinstance(value, list):
        raise ServiceError(f"{field}: must be a list of strings, not {type(value).__name__}")
    if not value:
        raise ServiceError(f"{field}: give at least one line")
    most = settings.CONVOY_LOG_LINE_CHARS
    out: list[str] = []
    cut = 0
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise ServiceError(f"{field}[{index}]: must be a string, not {type(item).__name__}")
        problem = text_problem(item)
        if problem:
            raise ServiceError(f"{field}[{index}]: {problem}")
        for line in item.splitlines() or [""]:
            if len(line) > most:
                line, cut = line[:most], cut + 1
            out.append(line)
    return out, cut


def append(bead_id: str, lines: object, *, actor: str) -> Appended:
    """Append `lines` to the bead's log; drop its oldest lines past CONVOY_LOG_LINES lines or
    CONVOY_LOG_BYTES bytes, keep its last line on its facts and record `bead.log`, in one
    transaction. Refused (nothing written): not a list of strings, an unknown bead."""
    texts, cut = lines_of(lines)
    keep = settings.CONVOY_LOG_LINES
    skipped = max(len(texts) - keep, 0)  # they would be dropped at once
    texts = texts[skipped:]
    now = timezone.now()
    with transaction.atomic():
        bead = Bead.objects.select_for_update().filter(pk=bead_id).only("pk").first()
        if bead is None:
            raise NotFound(f"bead '{bead_id}' not found")
        rows = LogLine.objects.bulk_create(
            LogLine(bead_id=bead_id, text=t, size=len(t.encode()), actor=actor[:255], at=now)
            for t in texts
        )
        dropped = skipped + _trim(bead_id)
        last = rows[-1]
        BeadFacts.objects.filter(pk=bead_id).update(last_log=last.text)
        record(LOG, bead_id=bead_id, actor=actor, data={"lines": len(texts), "dropped": dropped})
    return Appended(bead_id, len(texts), dropped, cut, last.pk or 0)


def _trim(bead_id: str) -> int:
    """Drop the bead's oldest lines past the bounds (its newest line always stays)."""
    lines, size = settings.CONVOY_LOG_LINES, settings.CONVOY_LOG_BYTES
    kept = LogLine.objects.filter(bead_id=bead_id)
    totals = kept.aggregate(n=Count("id"), bytes=Sum("size"))
    if totals["n"] <= lines and (totals["bytes"] or 0) <= size:
        return 0
    count = total = 0
    cutoff = None
    for pk, bytes_ in kept.order_by("-id").values_list("id", "size"):
        if count and (count + 1 > lines or total + bytes_ > size):
            cutoff = pk
            break
        count, total = count + 1, total + bytes_
    if cutoff is None:
        return 0
    deleted, _ = kept.filter(id__lte=cutoff).delete()
    return deleted
