"""Discovered work joins its convoys: work found while doing a task (a `discovered-from`
dependency) inherits the parent's convoy, as in Gas Town.

A bead that gains a `discovered-from` dependency on a bead tracked by open convoys is added to
those convoys through `convoys.add`, with its event, so progress counts, the feeder and the
stranded scan see it. A convoy that already landed on completion reopens for unfinished
discovered work, as `convoy add` reopens it. Staged convoys (a plan not yet launched) and
convoys closed by hand (force-closed, cancelled) are left alone. `CONVOY_DISCOVERED_JOINS=0`
turns this off. Callers: `beads.add_dependency` and the JSONL import (new edges only).
"""

from collections.abc import Collection

from django.conf import settings

from convoys.infra import bulk
from convoys.models import CONVOY_OPEN, DONE_STATUSES, Bead, Convoy, TrackedBead
from convoys.services import convoys

DISCOVERED_FROM = "discovered-from"


def join(edges: Collection[tuple[str, str]], actor: str = "") -> dict[str, list[str]]:
    """`edges`: (discovered bead id, parent bead id) pairs. Each discovered bead joins the
    convoys that track its parent. Returns {convoy id: [bead ids added]}."""
    if not settings.CONVOY_DISCOVERED_JOINS or not edges:
        return {}
    by_parent: dict[str, list[str]] = {}
    for bead_id, parent in edges:
        by_parent.setdefault(parent, []).append(bead_id)
    trackers: dict[
        str, dict[str, str]
    ] = {}  # convoy id -> {discovered bead id: its parent tracked by that convoy}
    for parent, convoy_id in bulk.select_in(TrackedBead, "bead_id", by_parent, also="convoy_id"):
        trackers.setdefault(convoy_id, {}).update(dict.fromkeys(by_parent[parent], parent))
    if not trackers:
        return {}
    candidates = {c.pk: c for c in Convoy.objects.filter(pk__in=trackers)}
    joining: set[str] = set().union(*trackers.values())
    unfinished = set(
        Bead.objects.filter(pk__in=joining)
        .exclude(status__in=DONE_STATUSES)
        .values_list("id", flat=True)
    )
    already = set(
        TrackedBead.objects.filter(convoy_id__in=candidates, bead_id__in=joining).values_list(
            "convoy_id", "bead_id"
        )
    )
    joined: dict[str, list[str]] = {}
    for convoy_id in sorted(candidates):
        convoy = candidates[convoy_id]
        landed = convoy.landed
        if convoy.status != CONVOY_OPEN and not landed:
            continue
        wanted = sorted(
            b
            for b in trackers[convoy_id]
            if (convoy_id, b) not in already and (convoy.status == CONVOY_OPEN or b in unfinished)
        )
        if not wanted:
            continue
        _, added, _ = convoys.add(
            convoy_id,
            wanted,
            actor=actor,
            data={"discovered_from": {b: trackers[convoy_id][b] for b in wanted}},
        )
        joined[convoy_id] = added
    return joined
