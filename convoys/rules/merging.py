"""Landed means merged: which closed beads still wait for their merge, and what merge reasons
mean. One rule, read by the projection (the `submitted` segment), landing and the readiness
of `merge-blocks` edges.

A convoy merges by its own `merge_strategy`, or by CONVOY_MERGE_STRATEGY when it names none.
Under `mr` a tracked bead that is closed is *submitted* until a `Merge` row says merged; under
`direct` and `local` the close is the merge. A bead tracked by an unfinished `mr` convoy waits
for its merge wherever it is shown (a bead has one state, whichever convoy shows it).
"""

import re
from collections.abc import Collection
from functools import cache

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet

from convoys.core import merges as core
from convoys.infra import bulk
from convoys.models import CONVOY_CLOSED, Bead, Convoy, Merge, TrackedBead

MR = "mr"
SUBMITTED = "submitted"  # what pages show as a closed bead's status while it waits to merge
Patterns = list[re.Pattern[str]]


def strategy(convoy: Convoy) -> str:
    """How the convoy's work reaches its target: direct, mr or local."""
    return convoy.merge_strategy or settings.CONVOY_MERGE_STRATEGY


def mr_convoys() -> Q:
    """The convoys (a filter on Convoy) that merge by `mr`."""
    if settings.CONVOY_MERGE_STRATEGY == MR:
        return Q(merge_strategy=MR) | Q(merge_strategy="")
    return Q(merge_strategy=MR)


def merged_q() -> Q:
    """The bead (OuterRef('pk')) has a merge recorded, or its own close says it merged."""
    recorded = Merge.objects.filter(bead_id=OuterRef("pk"), state=Merge.MERGED)
    own = Q()
    for prefix in core.SELF_MERGED_PREFIXES:
        own |= Q(close_reason__startswith=prefix)
    return Exists(recorded) | own


def _mr_tracking() -> QuerySet[TrackedBead]:
    """The trackings by a convoy that is not closed and merges by `mr`."""
    return TrackedBead.objects.filter(
        convoy__in=Convoy.objects.filter(mr_convoys()).exclude(status=CONVOY_CLOSED)
    )


def awaiting_q() -> Q:
    """The bead (OuterRef('pk') or a Bead queryset's rows) is closed, tracked by a convoy that
    is not closed and merges by `mr`, and not merged: it is submitted."""
    tracking = _mr_tracking().filter(bead_id=OuterRef("pk"))
    return Q(status="closed") & Exists(tracking) & ~merged_q()


def awaiting(beads: QuerySet[Bead]) -> QuerySet[Bead]:
    """Those of `beads` that are submitted."""
    return beads.filter(awaiting_q())


def awaiting_among(bead_ids: Collection[str]) -> set[str]:
    """Those of `bead_ids` that are submitted."""
    if not bead_ids:
        return set()
    # Most beads no convoy tracks: a plain read of the trackings says so before the whole
    # rule is compiled and asked of those tracked.
    tracked = {row[0] for row in bulk.select_in(TrackedBead, "bead_id", bead_ids)}
    if not tracked:
        return set()
    closed = Bead.objects.filter(pk__in=sorted(tracked), status="closed")
    return set(awaiting(closed).values_list("pk", flat=True))


def merged_among(bead_ids: Collection[str]) -> set[str]:
    """Those of `bead_ids` whose merge is recorded (their own close reason aside)."""
    if not bead_ids:
        return set()
    rows = Merge.objects.filter(bead_id__in=list(bead_ids), state=Merge.MERGED)
    return set(rows.values_list("bead_id", flat=True))


@cache
def _patterns(merged: tuple[str, ...], abandoned: tuple[str, ...]) -> tuple[Patterns, Patterns]:
    return core.compiled(merged), core.compiled(abandoned)


def outcome_of(reason: str) -> str:
    """What a merge request's close reason says by the settings: merged, abandoned or ""."""
    merged, abandoned = _patterns(
        tuple(settings.CONVOY_MERGED_REASONS), tuple(settings.CONVOY_ABANDONED_REASONS)
    )
    return core.outcome_of(reason, merged, abandoned)
