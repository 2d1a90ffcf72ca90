"""What a convoy page reads per bead, read afresh for every request in whichever process
answers.

The convoy page (`convoy_page.convoy_page`) is derived from a `Snapshot` by the same code for a
full render and for a live update; a big convoy's overview (`overview.page`) reads one for the
window of beads it draws (`load_window`). Nothing is kept between requests: what a convoy's
page shows as counts, waves, causes and verdicts is the read model the writers keep
(`projection`); this is the rows the page lists and draws.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from convoys.core.dag import EXECUTION_TYPES
from convoys.models import SLINGABLE_TYPES, Bead, Convoy, Dependency, Rig, TrackedBead
from convoys.rules import capacity
from convoys.rules.readiness import blocked_by, ready_beads
from convoys.rules.rows import Edge, TrackedRow, failed_beads, read_rows, tracked_beads

Gate = tuple[str, str, str, str]  # (id, title, issue type, status)


@dataclass(frozen=True)
class Snapshot:
    convoy_id: str
    tracked: list[str]  # tracked bead ids in position order
    beads: dict[str, TrackedRow]
    edges: list[Edge]  # (issue, target, type) of every dependency of a tracked bead
    gates: list[Gate]  # untracked gates that hold tracked beads
    ready: frozenset[str]  # tracked beads ready by the one rule
    failed: frozenset[str]  # tracked beads whose last dispatch failed
    blockers: dict[str, list[str]]  # {tracked id: [unfinished blocker ids]}
    target_types: dict[str, str]  # {blocker id: issue type}
    rigs: dict[str, str]  # {rig: state}
    cap: int  # CONVOY_MAX_IN_FLIGHT or its override; 0: none


def load(convoy: Convoy, now: datetime) -> Snapshot:
    """Everything, from the database."""
    tracked, beads, edges = tracked_beads(convoy, shown=True)
    subset = Bead.objects.filter(pk__in=_tracking(convoy))
    ready = frozenset(ready_beads(subset, now).values_list("pk", flat=True))
    blockers = blocked_by(_tracking(convoy))
    return Snapshot(
        convoy_id=convoy.pk,
        tracked=tracked,
        beads=beads,
        edges=edges,
        gates=_gates(edges, beads),
        ready=ready,
        failed=frozenset(failed_beads(subset)),
        blockers=blockers,
        target_types=_types({t for ts in blockers.values() for t in ts}, beads),
        rigs=dict(Rig.objects.values_list("name", "state")),
        cap=capacity.cap(),
    )


def load_window(convoy: Convoy, bead_ids: list[str], now: datetime) -> Snapshot:
    """What a page drawing only `bead_ids` of a big convoy reads: the same, for those beads
    (their rows, dependencies, readiness, blockers), by id. Never kept: an overview page
    reads the kept read model and these rows."""
    beads = read_rows(Bead.objects.filter(pk__in=bead_ids), shown=True)
    edges = list(
        Dependency.objects.filter(issue_id__in=bead_ids)
        .order_by("issue_id", "depends_on_id")
        .values_list("issue_id", "depends_on_id", "type")
    )
    subset = Bead.objects.filter(pk__in=bead_ids)
    blockers = blocked_by(bead_ids)
    return Snapshot(
        convoy_id=convoy.pk,
        tracked=bead_ids,
        beads=beads,
        edges=edges,
        gates=_gates(edges, beads),
        ready=frozenset(ready_beads(subset, now).values_list("pk", flat=True)),
        failed=frozenset(failed_beads(subset)),
        blockers=blockers,
        target_types=_types({t for ts in blockers.values() for t in ts}, beads),
        rigs=dict(Rig.objects.values_list("name", "state")),
        cap=capacity.cap(),
    )


def _tracking(convoy: Convoy) -> Any:
    return TrackedBead.objects.filter(convoy=convoy).values("bead_id")


def _gates(edges: list[Edge], beads: dict[str, TrackedRow]) -> list[Gate]:
    """Untracked non-slingable blockers (a decision): the page draws and names them."""
    outside = {t for _, t, kind in edges if t not in beads and kind in EXECUTION_TYPES}
    if not outside:
        return []
    rows = Bead.objects.filter(pk__in=sorted(outside)).exclude(issue_type__in=SLINGABLE_TYPES)
    return list(rows.values_list("id", "title", "issue_type", "status"))


def _types(ids: Iterable[str], beads: dict[str, TrackedRow]) -> dict[str, str]:
    """{id: issue type}: from `beads` (the rows re-read) where they hold the id, else read."""
    known = {i: beads[i].issue_type for i in ids if i in beads}
    rest = sorted(set(ids) - known.keys())
    if rest:
        known.update(Bead.objects.filter(pk__in=rest).values_list("id", "issue_type"))
    return known
