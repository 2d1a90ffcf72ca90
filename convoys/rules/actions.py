"""The bead actions' rules: whether an action may touch a bead, what it changes, and what it
did, in words. Read only: `services/actions.py` applies a `Change` and records its event.

Each action is planned by `plan` (a refusal, or the rows to change) and its effects are said by
`effects`, which asks the readiness rule and the landing rule after the change: the preview
runs the same service in a transaction it rolls back, so what it says is what the action does.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from convoys.models import (
    ACTIVE_WORK_STATUSES,
    BLOCKING_DEP_TYPES,
    CONVOY_OPEN,
    DONE_STATUSES,
    SKIPPED,
    Bead,
    Convoy,
    Dependency,
    Rig,
    TrackedBead,
)
from convoys.rules.readiness import blocked_by, ready_among

RETRY, SKIP, RELEASE, REASSIGN, REOPEN = "retry", "skip", "release", "reassign", "reopen"
ACTIONS = (RETRY, SKIP, RELEASE, REASSIGN, REOPEN)
KINDS = {
    RETRY: "bead.retried",
    SKIP: "bead.skipped",
    RELEASE: "bead.released",
    REASSIGN: "bead.reassigned",
    REOPEN: "bead.reopened",
}
PAST = {
    RETRY: "retried",
    SKIP: "skipped",
    RELEASE: "released",
    REASSIGN: "reassigned",
    REOPEN: "reopened",
}


@dataclass(frozen=True)
class Change:
    """The rows an action changes on one bead (None: left as it is)."""

    status: str | None = None
    assignee: str | None = None
    rig: str | None = None
    clear_failures: bool = False
    close_reason: str | None = None
    tell: str = ""  # the worker that loses the bead: told through the dispatcher's release


@dataclass
class Effects:
    """What an applied change did, as the rules read it after the change."""

    ready: list[str] = field(default_factory=list)  # dependents (or itself) made ready
    unready: list[str] = field(default_factory=list)  # ready before, not after
    lands: list[str] = field(default_factory=list)  # open convoys now complete
    stays_open: list[str] = field(default_factory=list)
    stays_closed: list[str] = field(default_factory=list)
    dispatches_to: str = ""  # its rig, when the bead itself is ready after and a feed sends it
    paused: list[str] = field(default_factory=list)  # ready, but every convoy feeding it paused
    unfed: bool = False  # ready, but no open convoy tracks it (a sling sends it)
    waits_for: list[str] = field(default_factory=list)  # its open blockers after
    not_ready: str = ""  # why it is not ready after, when it is open and nothing blocks it


def state_word(bead: Bead) -> str:
    if bead.status == SKIPPED:
        return "skipped"
    if bead.status in DONE_STATUSES:
        return "closed"
    return bead.status.replace("_", " ")


def plan(action: str, bead: Bead, *, rig: str = "", worker: str = "") -> Change | str:
    """The change `action` makes to `bead`, or why it is refused (one line)."""
    done = bead.status in DONE_STATUSES
    held = bead.assignee if bead.assignee and bead.status in ("open", *ACTIVE_WORK_STATUSES) else ""
    if action == REOPEN:
        if not done:
            return f"{bead.pk} is not closed (status: {state_word(bead)})"
        return Change(status="open", assignee="", close_reason="")
    if done:
        return f"{bead.pk} is {state_word(bead)}"
    if action == RETRY:
        if not bead.dispatch_failures:
            return f"{bead.pk} has no failed dispatches to retry"
        return Change(clear_failures=True)
    if action == SKIP:
        if held and bead.status in ACTIVE_WORK_STATUSES:
            return f"{bead.pk} is {state_word(bead)} by {held}: release it first"
        return Change(status=SKIPPED, assignee="", tell=held)
    if action == RELEASE:
        if not held:
            return f"{bead.pk} is not held by a worker (status: {state_word(bead)})"
        return Change(status="open", assignee="", tell=held)
    if action == REASSIGN:
        return _reassign(bead, held, rig, worker)
    return f"unknown action {action[:40]!r}"


def _reassign(bead: Bead, held: str, rig: str, worker: str) -> Change | str:
    if bool(rig) == bool(worker):
        return "reassign needs a rig or a worker (one of them)"
    if rig:
        if not Rig.objects.filter(pk=rig).exists():
            return f"rig {rig[:80]!r} does not exist"
        if bead.rig_id == rig:
            return f"{bead.pk} is on rig {rig} already"
        # Work under way on the old rig goes back to ready for the new one.
        return Change(rig=rig, status="open" if held else None, assignee="", tell=held)
    if held == worker:
        return f"{bead.pk} is held by {worker} already"
    on = worker.split("/", 1)[0] if "/" in worker else ""
    if on and bead.rig_id and on != bead.rig_id:
        return f"worker {worker} works on rig {on}, not {bead.rig_id}: reassign the rig first"
    status = bead.status if bead.status in ACTIVE_WORK_STATUSES else "hooked"
    return Change(status=status, assignee=worker, tell=held)


def neighbours(bead_id: str) -> list[str]:
    """The bead and the beads it blocks: whose readiness an action on it may change."""
    dependents = Dependency.objects.filter(
        depends_on_id=bead_id, type__in=BLOCKING_DEP_TYPES
    ).values_list("issue_id", flat=True)
    return [bead_id, *sorted(set(dependents))]


def convoys_of(bead_ids: Sequence[str]) -> list[Convoy]:
    tracking = TrackedBead.objects.filter(bead_id__in=list(bead_ids)).values("convoy_id")
    return list(Convoy.objects.filter(pk__in=tracking).order_by("pk"))


def effects(bead: Bead, ready_before: set[str], complete: Callable[[Convoy], bool]) -> Effects:
    """What the change just applied to `bead` did (`ready_before`: the ready set of its
    `neighbours` before it; `complete`: the landing rule)."""
    around = neighbours(bead.pk)
    ready_after = ready_among(around)
    result = Effects(
        ready=sorted(ready_after - ready_before - {bead.pk}),
        unready=sorted(ready_before - ready_after - {bead.pk}),
    )
    convoys = convoys_of([bead.pk])
    if bead.pk in ready_after:
        feeding = [c for c in convoys if c.status == CONVOY_OPEN]
        if any(c.paused_at is None for c in feeding):
            result.dispatches_to = bead.rig_id or ""
        elif feeding:
            result.paused = [c.pk for c in feeding]
        else:
            result.unfed = True
    elif bead.status not in DONE_STATUSES:
        result.waits_for = blocked_by([bead.pk]).get(bead.pk, [])
        if not result.waits_for and bead.status == "open" and not bead.assignee:
            result.not_ready = _not_ready(bead)
    for convoy in convoys:
        if convoy.status != CONVOY_OPEN:
            result.stays_closed.append(convoy.pk)
        elif complete(convoy):
            result.lands.append(convoy.pk)
        else:
            result.stays_open.append(convoy.pk)
    return result


def _not_ready(bead: Bead) -> str:
    if not bead.rig_id:
        return "it has no rig"
    state = Rig.objects.filter(pk=bead.rig_id).values_list("state", flat=True).first()
    if state != Rig.ACTIVE:
        return f"rig {bead.rig_id} is {state or 'missing'}"
    if not bead.is_slingable:
        return f"a {bead.issue_type} is not dispatched"
    return "its worker has it"


def _listed(ids: Sequence[str], most: int = 5) -> str:
    shown = ", ".join(ids[:most])
    if len(ids) > most:
        shown += f" and {len(ids) - most} more"
    if len(ids) > 1 and len(ids) <= most:
        shown = ", ".join(ids[:-1]) + f" and {ids[-1]}"
    return shown


def words(
    action: str, bead: Bead, change: Change, found: Effects, tells_workers: bool = True
) -> str:
    """What happens, in words: "dispatches to rig gastown; makes gt-a and gt-b ready; the
    convoy hq-cv-1 stays open". `tells_workers`: the dispatcher has a release hook."""
    parts: list[str] = []
    if action == SKIP:
        parts.append("closes it as skipped (not done)")
    elif action == RETRY:
        parts.append(f"clears the breaker ({bead.dispatch_failures} failed dispatches)")
    elif action == REOPEN:
        parts.append("opens it again")
    elif action == REASSIGN and change.rig:
        parts.append(f"moves it to rig {change.rig}")
    elif action == REASSIGN:
        parts.append(f"gives it to worker {change.assignee}")
    elif action == RELEASE:
        parts.append("takes it back to open")
    if change.tell and tells_workers:
        parts.append(f"tells worker {change.tell} it lost the bead")
    elif change.tell:
        parts.append(f"worker {change.tell} sees it at its next look (no release hook)")
    if found.dispatches_to:
        parts.append(f"dispatches to rig {found.dispatches_to}")
    elif found.paused:
        parts.append(f"ready, but {_listed(found.paused)} paused: nothing sends it until a resume")
    elif found.unfed:
        parts.append("ready; no open convoy tracks it, so nothing sends it but a sling")
    elif found.waits_for:
        parts.append(f"it waits for {_listed(found.waits_for)}")
    elif found.not_ready:
        parts.append(f"not ready: {found.not_ready}")
    if found.ready:
        parts.append(f"makes {_listed(found.ready)} ready")
    if found.unready:
        parts.append(f"{_listed(found.unready)} no longer ready")
    for convoy_id in found.lands:
        parts.append(f"lands convoy {convoy_id}")
    for convoy_id in found.stays_open:
        parts.append(f"convoy {convoy_id} stays open")
    for convoy_id in found.stays_closed:
        parts.append(f"convoy {convoy_id} stays closed")
    return "; ".join(parts)
