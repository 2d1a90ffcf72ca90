"""The rows the read models and their snapshots are made of: a tracked bead's light row, the
beads whose last dispatch failed, and what the events after a sequence number touched.

Below both the page read models (`convoys.read`) and `snapshots` (what a live page carries
forward), so that neither imports the other's internals."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from django.db.models import Case, F, OuterRef, QuerySet, Subquery, Value, When

from convoys.log.kinds import BEAD_KINDS as BEAD_KINDS  # re-exported
from convoys.log.kinds import GRAPH_KINDS, LISTING_KINDS, ROW_ONLY_KINDS
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    DONE_STATUSES,
    Bead,
    Convoy,
    Dependency,
    Dispatch,
    Event,
    TrackedBead,
)
from convoys.rules import merging
from convoys.rules.merging import SUBMITTED


class TrackedRow(NamedTuple):
    """What a convoy's page and API show of each tracked bead: a light row, not a model."""

    pk: str
    title: str
    issue_type: str
    status: str
    rig_id: str | None
    assignee: str
    closed_at: datetime | None
    updated_at: datetime


FIELDS = TrackedRow._fields
Edge = tuple[str, str, str]  # (issue, target, dependency type)


def tracked_beads(
    convoy: Convoy, shown: bool = False
) -> tuple[list[str], dict[str, TrackedRow], list[Edge]]:
    """(tracked ids in position order, {id: TrackedRow}, dependencies of the tracked beads as
    (issue, target, type)): three queries, each bead read once. `shown`: as `read_rows`."""
    tracking = TrackedBead.objects.filter(convoy=convoy)
    ids = list(tracking.values_list("bead_id", flat=True))
    subquery = tracking.values("bead_id")
    beads = read_rows(Bead.objects.filter(pk__in=subquery), shown)
    # In a fixed order: the graph lists blockers in it, and a page must read the same each time.
    edges = (
        Dependency.objects.filter(issue_id__in=subquery)
        .order_by("issue_id", "depends_on_id")
        .values_list("issue_id", "depends_on_id", "type")
    )
    return ids, beads, list(edges)


def read_rows(beads: QuerySet[Bead], shown: bool = False) -> dict[str, TrackedRow]:
    """{id: TrackedRow} of `beads`: one query. `shown`: as pages show them, a closed bead
    waiting for its merge with the status SUBMITTED (`merging.awaiting_q`)."""
    if shown:
        status = Case(When(merging.awaiting_q(), then=Value(SUBMITTED)), default=F("status"))
        beads = beads.annotate(shown_status=status)
        fields = [f if f != "status" else "shown_status" for f in FIELDS]
        return {row[0]: TrackedRow._make(row) for row in beads.values_list(*fields)}
    return {row[0]: TrackedRow._make(row) for row in beads.values_list(*FIELDS)}


def failed_among(bead_ids: Sequence[str]) -> set[str]:
    """`failed_beads` of a few ids."""
    if not bead_ids:
        return set()
    return set(_failed(Bead.objects.filter(pk__in=list(bead_ids))).values_list("pk", flat=True))


def failed_beads(beads: QuerySet[Bead]) -> set[str]:
    """Ids among `beads` whose last dispatch failed and that are neither running nor done
    (the convoy's `failed` count): one query."""
    return set(_failed(beads).values_list("pk", flat=True))


def _failed(beads: QuerySet[Bead]) -> QuerySet[Bead]:
    last_ok = Dispatch.objects.filter(bead_id=OuterRef("pk")).order_by("-created_at", "-pk")
    candidates = beads.exclude(status__in=(*ACTIVE_WORK_STATUSES, *DONE_STATUSES)).filter(
        pk__in=Dispatch.objects.filter(ok=False).values("bead_id")
    )
    return candidates.annotate(last_ok=Subquery(last_ok.values("ok")[:1])).filter(last_ok=False)


CHANGES_LIMIT = 500


@dataclass
class Changes:
    """What the events after a sequence number touched."""

    beads: set[str] = field(default_factory=set)
    convoys: set[str] = field(default_factory=set)  # named by the event or tracking its bead
    kinds: set[str] = field(default_factory=set)
    done_changed: set[str] = field(default_factory=set)  # beads that entered or left "done"
    dependencies: bool = False  # a bead's dependency list changed
    fields: set[str] = field(default_factory=set)  # the bead fields a bead.updated changed
    unlisted: bool = False  # a bead.updated named no field it changed (a sync's presence mark)
    # (bead id, convoy id, time) of each event, in log order
    events: list[tuple[str, str, datetime]] = field(default_factory=list)

    def touches_listing(self) -> bool:
        return bool(self.kinds & LISTING_KINDS)

    def touches_graph(self) -> bool:
        return self.dependencies or bool(self.kinds & GRAPH_KINDS)

    def rows_only(self) -> bool:
        """Only beads' own rows changed: no convoy, rig or route event, no dependency, no bead
        entered or left "done" and none moved rig. What a convoy shows about itself (its
        controls, pause, escalation and staging panels) then stands."""
        return (
            self.kinds <= ROW_ONLY_KINDS
            and not self.done_changed
            and not self.dependencies
            and not self.rigs
        )

    @property
    def rigs(self) -> bool:
        """A bead moved to another rig."""
        return bool({"rig", "rig_id"} & self.fields)


def changes_since(seq: int, upto: int | None = None, dependents: bool = True) -> Changes | None:
    """The `Changes` after `seq` (up to `upto`: the seq a page is drawn at), or None when there
    are too many to tell (answer everything). `dependents`: `convoys` also holds the convoys
    tracking the beads that the named beads block (one query; the dashboard's rows)."""
    after = Event.objects.filter(seq__gt=seq)
    if upto is not None:
        after = after.filter(seq__lte=upto)
    rows = list(
        after.order_by("seq").values_list("kind", "bead_id", "convoy_id", "data", "created_at")[
            : CHANGES_LIMIT + 1
        ]
    )
    if len(rows) > CHANGES_LIMIT:
        return None
    changes = Changes()
    for kind, bead_id, convoy_id, data, at in rows:
        data = data or {}
        changes.kinds.add(kind)
        changes.events.append((bead_id, convoy_id, at))
        if bead_id:
            changes.beads.add(bead_id)
            if kind in ("bead.closed", "bead.reopened") or (
                kind == "bead.status" and data.get("status") in DONE_STATUSES
            ):
                changes.done_changed.add(bead_id)
        if convoy_id:
            changes.convoys.add(convoy_id)
        changes.convoys.update(data.get("convoys") or ())
        # The fields changed: {field: [old, new]} (services) or [field, …] (an import).
        changed = data.get("changes")
        edge = "dependency_added" in data or "dependency_removed" in data
        if edge or "dependencies" in (changed or ()):
            changes.dependencies = True
        if isinstance(changed, dict | list):
            changes.fields.update(f for f in changed if isinstance(f, str))
        elif kind == "bead.updated" and not edge:
            changes.unlisted = True
    if changes.beads and dependents:
        # A close or reopen changes whether the beads it blocks are ready, and so their convoys.
        blocked = Dependency.objects.filter(depends_on_id__in=changes.beads).values("issue_id")
        changes.convoys.update(
            TrackedBead.objects.filter(bead_id__in=blocked).values_list("convoy_id", flat=True)
        )
    return changes
