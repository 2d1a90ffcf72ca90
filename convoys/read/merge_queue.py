"""The merge queue on a convoy page: its beads that wait for their merge, with their change
(link, branch, target), the forge's CI state and how long each has waited, and those whose
change was abandoned. Drawn for a convoy that merges by `mr`; read afresh for every request."""

from dataclasses import dataclass, field
from datetime import datetime

from convoys.core.formatting import duration
from convoys.models import Bead, Convoy, Merge, TrackedBead
from convoys.read.graph import bead_url_maker
from convoys.rules import merging

SHOWN = 50  # rows listed; the rest counted


@dataclass(frozen=True)
class QueuedChange:
    bead_id: str
    href: str
    title: str
    state: str  # submitted or abandoned
    link: str
    ref: str
    branch: str
    target: str
    ci: str
    reason: str
    since: datetime | None  # closed (submitted) or abandoned at
    waited: str  # how long, in words


@dataclass(frozen=True)
class MergeQueue:
    strategy: str
    rows: list[QueuedChange] = field(default_factory=list)
    submitted: int = 0
    abandoned: int = 0
    merged: int = 0

    @property
    def shown(self) -> bool:
        return self.strategy == merging.MR

    @property
    def hidden(self) -> int:
        return self.submitted + self.abandoned - len(self.rows)


def merge_queue(convoy: Convoy, now: datetime) -> MergeQueue:
    strategy = merging.strategy(convoy)
    if strategy != merging.MR:
        return MergeQueue(strategy)
    tracking = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
    waiting = merging.awaiting(Bead.objects.filter(pk__in=tracking, status="closed"))
    waiting_ids = set(waiting.values_list("pk", flat=True))
    changes = Merge.objects.filter(bead_id__in=tracking)
    by_bead = {m.bead_id: m for m in changes.exclude(state=Merge.MERGED)}
    abandoned = {i for i, m in by_bead.items() if m.state == Merge.ABANDONED} - waiting_ids
    merged = changes.filter(state=Merge.MERGED).count()
    listed = sorted(waiting_ids | abandoned)
    beads = Bead.objects.in_bulk(listed[:SHOWN]) if listed else {}
    href = bead_url_maker()
    rows = [
        _row(beads[i], by_bead.get(i), i in waiting_ids, now, href(i)) for i in listed if i in beads
    ]
    rows.sort(key=lambda r: (r.state != merging.SUBMITTED, r.since or now, r.bead_id))
    return MergeQueue(strategy, rows, len(waiting_ids), len(abandoned), merged)


def _row(bead: Bead, change: Merge | None, waiting: bool, now: datetime, href: str) -> QueuedChange:
    since = (bead.closed_at if waiting else change.updated_at if change else None) or None
    return QueuedChange(
        bead_id=bead.pk,
        href=href,
        title=bead.title,
        state=merging.SUBMITTED if waiting else Merge.ABANDONED,
        link=change.link if change else "",
        ref=change.ref if change else "",
        branch=change.branch if change else "",
        target=change.target if change else "",
        ci=change.ci if change else "",
        reason=change.reason if change else "",
        since=since,
        waited=duration((now - since).total_seconds()) if since else "",
    )
