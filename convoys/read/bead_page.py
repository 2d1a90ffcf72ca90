"""The bead page's read model: a bead's state, relations (paged) and history."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from convoys.core.formatting import person
from convoys.log.kinds import LOG
from convoys.models import (
    Bead,
    Convoy,
    Dependency,
    Dispatch,
    Event,
    LogLine,
    Merge,
)
from convoys.rules import actions as actionrules
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
    attempts: list["Attempt"]  # newest first, the first ATTEMPTS_SHOWN
    attempts_total: int
    log: "Log"
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
        events=list(Event.objects.filter(bead_id=bead.pk).exclude(kind=LOG).order_by("-seq")[:100]),
        attempts=attempts(bead.pk, ATTEMPTS_SHOWN),
        attempts_total=Dispatch.objects.filter(bead_id=bead.pk).count(),
        log=bead_log(bead.pk),
        watch=",".join(watch),
        status=merging.SUBMITTED if _waits(state.cause) else bead.status,
        merge=Merge.objects.filter(pk=bead.pk).first(),
    )


def _waits(cause: dict[str, Any] | None) -> bool:
    return bool(cause) and cause is not None and cause["kind"] == WAITING_TO_MERGE


# --- every dispatch attempt ---------------------------------------------------------------
ATTEMPTS_SHOWN = 200
# Dispatch.PATHS as people call them.
PATH_WORDS = {
    "launch": "launch",
    "event": "feeder",
    "stranded": "stranded scan",
    "manual": "sling",
    "batch": "sling (several beads)",
}


@dataclass
class Attempt:
    """One dispatch attempt as the bead page, the API and `beads show` tell it."""

    number: int  # 1 for the bead's first attempt
    at: datetime
    path: str  # Dispatch.PATHS
    path_words: str
    retry: bool  # an attempt after one that did not take
    forced: bool
    rig: str
    worker: str
    convoy_id: str
    duration_ms: float | None
    outcome: str  # ok | confirmed | failed | abandoned | released | pending | taken-back
    outcome_words: str
    error: str
    output: str

    def as_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["at"] = self.at.isoformat()
        return out


# What an attempt tells as its dispatch row holds it.
COPIED = ("path", "forced", "rig", "worker", "convoy_id", "duration_ms", "error", "output")
OUTCOME_WORDS = {
    "ok": "taken by its worker",
    "confirmed": "no answer, but its worker reported",
    "failed": "failed",
    "abandoned": "abandoned: its process stopped before sending it",
    "released": "released: no answer and no word from its worker",
    "pending": "unknown outcome: no answer yet",
}
# The operators' actions that take a bead from the worker an attempt gave it to end
# that attempt, and the next one is a retry.
TAKEN_BACK = {
    actionrules.KINDS[actionrules.RELEASE]: "released",
    actionrules.KINDS[actionrules.REASSIGN]: "reassigned",
    actionrules.KINDS[actionrules.SKIP]: "skipped",
}


def _outcome(d: Dispatch) -> str:
    if d.resolution in ("abandoned", "released", "confirmed"):
        return d.resolution
    if d.ok is None:
        return "pending"
    return "ok" if d.ok else "failed"


def attempts(bead_id: str, limit: int = ATTEMPTS_SHOWN) -> list[Attempt]:
    """The bead's newest `limit` dispatch attempts, newest first, numbered from its first."""
    rows = Dispatch.objects.filter(bead_id=bead_id).order_by("-created_at", "-pk")
    newest = list(rows[: limit + 1])  # one more: whether the oldest shown is a retry
    total = len(newest) if len(newest) <= limit else rows.count()
    ends = _taken_back(bead_id, newest)
    out = []
    for index, d in enumerate(newest[:limit]):
        before = newest[index + 1] if index + 1 < len(newest) else None
        outcome, words = ends.get(d.pk) or (_outcome(d), OUTCOME_WORDS[_outcome(d)])
        out.append(
            Attempt(
                number=total - index,
                at=d.created_at,
                path_words=PATH_WORDS.get(d.path, d.path),
                retry=before is not None
                and (before.pk in ends or _outcome(before) not in ("ok", "confirmed")),
                outcome=outcome,
                outcome_words=words,
                **{name: getattr(d, name) for name in COPIED},
            )
        )
    return out


def _taken_back(bead_id: str, newest: list[Dispatch]) -> dict[int, tuple[str, str]]:
    """{dispatch pk: (outcome, words)} of the attempts (newest first) whose bead an operator
    took back before the next attempt: the first release or reassign after each, from the
    event log (one query)."""
    if not newest:
        return {}
    found = Event.objects.filter(
        bead_id=bead_id, kind__in=TAKEN_BACK, created_at__gte=newest[-1].created_at
    ).order_by("seq")
    actions = list(found.values_list("kind", "actor", "data", "created_at"))
    out: dict[int, tuple[str, str]] = {}
    until = None
    for d in newest:  # newest first: each attempt lasts until the one after it
        if _outcome(d) in ("ok", "confirmed"):
            for kind, actor, data, at in actions:
                if at >= d.created_at and (until is None or at < until):
                    why = data.get("reason") if isinstance(data, dict) else ""
                    words = f"taken back: {TAKEN_BACK[kind]} by {person(actor) or 'someone'}"
                    out[d.pk] = ("taken-back", f"{words} ({why})" if why else words)
                    break
        until = d.created_at
    return out


# --- the worker's log ----------------------------------------------------------------------
LOG_SHOWN = 200


@dataclass
class Log:
    lines: list[LogLine]  # the newest LOG_SHOWN, oldest first
    total: int  # lines kept


def bead_log(bead_id: str, shown: int = LOG_SHOWN) -> Log:
    kept = LogLine.objects.filter(bead_id=bead_id)
    lines = list(kept.order_by("-id")[:shown])
    lines.reverse()
    total = len(lines) if len(lines) < shown else kept.count()
    return Log(lines, total)


def log_after(bead_id: str, after: int = 0, limit: int | None = None) -> list[LogLine]:
    """The bead's kept lines after line id `after`, oldest first (all of them: at most
    CONVOY_LOG_LINES)."""
    rows = LogLine.objects.filter(bead_id=bead_id, id__gt=after).order_by("id")
    return list(rows[: limit or settings.CONVOY_LOG_LINES])


def exists(bead_id: str) -> bool:
    return Bead.objects.filter(pk=bead_id).exists()


def only_log_since(seq: int, upto: int) -> bool:
    """Whether every event after `seq` (up to `upto`) is a log append: a live bead page then
    redraws its log alone."""
    return not Event.objects.filter(seq__gt=seq, seq__lte=upto).exclude(kind=LOG).exists()
