"""The bead page's read model: a bead's state, relations (paged) and history."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from convoys.models import (
    Bead,
    Convoy,
    Dependency,
    Dispatch,
    Event,
    Merge,
)
from convoys.rules import causes as causemod
from convoys.rules import merging
from convoys.rules.causes import WAITING_TO_MERGE
from convoys.rules.readiness import blocked_by, is_ready

# --- the bead page, the stage page's epics, the subscriptions page -----------------------------
DEPS_PER_PAGE = 200


@dataclass
class BeadState:
    """Whether a bead moves and why not: the bead page and the API's bead detail."""

    ready: bool
    blocked_by: list[str]  # its unfinished blockers (all of them)
    cause: dict[str, Any] | None  # None when it is done


def bead_state(bead: Bead, now: datetime | None = None) -> BeadState:
    return BeadState(
        ready=is_ready(bead, now),
        blocked_by=blocked_by([bead.pk]).get(bead.pk, []),
        cause=causemod.for_bead(bead.pk, now),
    )


@dataclass
class BeadPage:
    bead: Bead
    ready: bool
    cause: dict[str, Any] | None
    blocked_by: list[str]  # the first DEPS_PER_PAGE
    blocked_by_more: int
    deps: dict[str, int]  # page, pages, per_page, outgoing, incoming (totals)
    outgoing: list[tuple[Dependency, Bead | None]]  # this page of its dependencies
    incoming: list[tuple[Dependency, Bead | None]]  # this page of its dependents
    convoys: list[Convoy]
    events: list[Event]
    dispatches: list[Dispatch]
    watch: str  # the live topics of what the page shows
    status: str = ""  # as pages show it: "submitted" for a closed bead waiting to merge
    merge: Merge | None = None  # its change, when a source reported one


def bead_page(bead_id: str, deps_page: int, now: datetime) -> BeadPage | None:
    """The bead page's read model (None: no such bead). Dependencies a page at a time both
    ways: a bead with 140,000 of them was a 13 MB page."""
    bead = Bead.objects.filter(pk=bead_id).select_related("rig").first()
    if bead is None:
        return None
    window = slice((deps_page - 1) * DEPS_PER_PAGE, deps_page * DEPS_PER_PAGE)
    outgoing_all = bead.dependencies.order_by("depends_on_id")
    incoming_all = Dependency.objects.filter(depends_on_id=bead.pk).order_by("issue_id")
    outgoing, incoming = list(outgoing_all[window]), list(incoming_all[window])
    totals = {"outgoing": outgoing_all.count(), "incoming": incoming_all.count()}
    related = [d.depends_on_id for d in outgoing] + [d.issue_id for d in incoming]
    others = Bead.objects.in_bulk(related)
    state = bead_state(bead, now)
    convoys = list(Convoy.objects.filter(tracked__bead_id=bead.pk).distinct())
    # The page shows its neighbours' states, its convoys' statuses and its rig's state.
    watch = [f"bead:{bead.pk}", "kind:rig.state"]
    watch += [f"bead:{i}" for i in sorted(set(related))] + [f"convoy:{c.pk}" for c in convoys]
    return BeadPage(
        bead=bead,
        ready=state.ready,
        cause=state.cause,
        blocked_by=state.blocked_by[:DEPS_PER_PAGE],
        blocked_by_more=max(len(state.blocked_by) - DEPS_PER_PAGE, 0),
        deps={
            "page": deps_page,
            "pages": max(-(-max(totals.values()) // DEPS_PER_PAGE), 1),
            "per_page": DEPS_PER_PAGE,
            **totals,
        },
        outgoing=[(d, others.get(d.depends_on_id)) for d in outgoing],
        incoming=[(d, others.get(d.issue_id)) for d in incoming],
        convoys=convoys,
        events=list(Event.objects.filter(bead_id=bead.pk).order_by("-seq")[:100]),
        dispatches=list(Dispatch.objects.filter(bead_id=bead.pk)[:20]),
        watch=",".join(watch),
        status=merging.SUBMITTED if _waits(state.cause) else bead.status,
        merge=Merge.objects.filter(pk=bead.pk).first(),
    )


def _waits(cause: dict[str, Any] | None) -> bool:
    return bool(cause) and cause is not None and cause["kind"] == WAITING_TO_MERGE
