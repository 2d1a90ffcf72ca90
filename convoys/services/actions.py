"""The bead actions: retry, skip, release, reassign and reopen, on one bead or many, with a
preview.

`run` takes a list of bead ids. Each bead is its own transaction (a refusal leaves the others
applied): the rule (`rules/actions.plan`), the row changes and the event (actor, reason, what
it did in words) commit together. A dry run applies the same steps inside one transaction
that it rolls back, so the preview's words are computed by the code that then does it. After
a real batch the convoys it touched are fed once (landing what is complete), and each worker
that lost a bead is told through the dispatcher's optional `release`.
"""

import logging
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from convoys.core import ids as idrules
from convoys.infra.dispatchers import get_dispatcher, release, tells_workers
from convoys.log.events import record
from convoys.models import CONVOY_OPEN, DONE_STATUSES, Bead, Convoy
from convoys.rules import actions as rules
from convoys.rules import capacity
from convoys.rules.readiness import ready_among
from convoys.services.beads import refuse_sourced
from convoys.services.convoys import close_if_complete, is_complete
from convoys.services.errors import ServiceError
from convoys.services.feeding import feed_convoy, feed_town

log = logging.getLogger("convoys.actions")
REASON_LIMIT = 500
ACTIONS = rules.ACTIONS


class Outcome(NamedTuple):
    id: str
    ok: bool  # applied (or, in a dry run, would be)
    words: str  # what it does, or why it is refused
    effects: rules.Effects | None = None
    told: str = ""  # the release hook's answer, when a worker was told

    def as_json(self) -> dict[str, Any]:
        found = self.effects or rules.Effects()
        return {
            "id": self.id,
            "ok": self.ok,
            "words": self.words,
            "refused": "" if self.ok else self.words,
            "ready": found.ready,
            "lands": found.lands,
            "stays_open": found.stays_open,
            "told": self.told,
        }


class Batch(NamedTuple):
    action: str
    dry_run: bool
    outcomes: list[Outcome]
    fed: list[str]  # beads the feed pass after the batch dispatched

    @property
    def done(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.ok]

    @property
    def refused(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    @property
    def summary(self) -> str:
        """ "3 skipped, 1 refused (gt-x: gt-x is closed)"; a dry run says "would be"."""
        verb = rules.PAST[self.action]
        head = f"{len(self.done)} {'would be ' if self.dry_run else ''}{verb}"
        if not self.refused:
            return head
        why = "; ".join(f"{o.id}: {o.words}" for o in self.refused[:5])
        more = f"; and {len(self.refused) - 5} more" if len(self.refused) > 5 else ""
        return f"{head}, {len(self.refused)} refused ({why}{more})"

    def as_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "dry_run": self.dry_run,
            "done": len(self.done),
            "refused": len(self.refused),
            "summary": self.summary,
            "outcomes": [o.as_json() for o in self.outcomes],
            "fed": self.fed,
        }


class _Refused(Exception):
    """Rolls back one bead's transaction (a refusal found after its rows were locked)."""


def clean_ids(raw: object) -> list[str]:
    """The ids of a request: a list of strings, at most CONVOY_ACTION_MAX_BEADS, duplicates
    dropped in order; anything else is refused with one line naming the field."""
    if not isinstance(raw, list | tuple):
        raise ServiceError("ids: expected a list of bead ids")
    most = settings.CONVOY_ACTION_MAX_BEADS
    if len(raw) > most:
        raise ServiceError(f"ids: at most {most} beads in one action ({len(raw)} given)")
    if not raw:
        raise ServiceError("ids: give at least one bead id")
    for value in raw:
        if not isinstance(value, str):
            raise ServiceError(f"ids: each id is a string ({type(value).__name__} given)")
    return list(dict.fromkeys(raw))


def clean_reason(reason: object) -> str:
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise ServiceError("reason: expected text")
    reason = " ".join(reason.split())
    if len(reason) > REASON_LIMIT:
        raise ServiceError(f"reason: at most {REASON_LIMIT} characters ({len(reason)} given)")
    problem = idrules.text_problem(reason)
    if problem:
        raise ServiceError(f"reason {problem}")
    return reason


def _target(action: str, rig: str, worker: str) -> tuple[str, str]:
    if action not in ACTIONS:
        raise ServiceError(f"action: one of {', '.join(ACTIONS)} ({str(action)[:40]!r} given)")
    if action != rules.REASSIGN:
        if rig or worker:
            raise ServiceError(f"rig and worker go with reassign, not {action}")
        return "", ""
    if bool(rig) == bool(worker):
        raise ServiceError("reassign: give a rig or a worker (one of them)")
    for field, value in (("rig", rig), ("worker", worker)):
        problem = value and idrules.name_problem(value)
        if problem:
            raise ServiceError(f"{field} {problem}")
    return rig, worker


def run(
    action: str,
    bead_ids: object,
    *,
    actor: str,
    reason: object = "",
    dry_run: bool = False,
    rig: str = "",
    worker: str = "",
) -> Batch:
    """Apply `action` to each of `bead_ids` in order (or, with `dry_run`, say what it would do
    and change nothing). A bad request (unknown action, no list, too many ids) is refused as a
    whole (ServiceError); a bead the rule refuses is an outcome, and the rest go on."""
    rig, worker = _target(action, rig or "", worker or "")
    wanted = clean_ids(bead_ids)
    why = clean_reason(reason)
    tells = tells_workers(get_dispatcher())  # one answer for the batch
    if dry_run:
        with transaction.atomic():
            outcomes = [_one(action, i, actor, why, rig, worker, tells, real=False) for i in wanted]
            transaction.set_rollback(True)
        return Batch(action, True, outcomes, [])
    outcomes = [_one(action, i, actor, why, rig, worker, tells, real=True) for i in wanted]
    applied = [o.id for o in outcomes if o.ok]
    return Batch(action, False, outcomes, _feed(applied, actor))


def _one(
    action: str,
    bead_id: str,
    actor: str,
    reason: str,
    rig: str,
    worker: str,
    tells: bool,
    *,
    real: bool,
) -> Outcome:
    """One bead's step in its own transaction (a savepoint within a dry run's); `tells`:
    whether the dispatcher tells a worker it lost its bead."""
    if idrules.id_problem(bead_id):
        return Outcome(bead_id[:80], False, "not a bead id")
    try:
        with transaction.atomic():
            bead = Bead.objects.select_for_update().filter(pk=bead_id).first()
            if bead is None:
                raise _Refused(f"bead '{bead_id}' not found")
            change = rules.plan(action, bead, rig=rig, worker=worker)
            if isinstance(change, str):
                raise _Refused(change)
            if action in (rules.SKIP, rules.REOPEN):  # a bd edit: the source's to make
                try:
                    refuse_sourced(bead.pk)
                except ServiceError as exc:
                    raise _Refused(str(exc)) from exc
            before = ready_among(rules.neighbours(bead.pk))
            old = _apply(bead, change, reason)
            found = rules.effects(bead, before, is_complete)
            words = rules.words(action, old, change, found, tells)
            record(
                rules.KINDS[action],
                bead_id=bead.pk,
                actor=actor,
                data={
                    "title": bead.title,
                    "status": bead.status,
                    "old_status": old.status,
                    "assignee": bead.assignee,
                    "rig": bead.rig_id,
                    "action": action,
                    "reason": reason,
                    "words": words,
                    **({"close_reason": bead.close_reason} if action == rules.SKIP else {}),
                    **({"previous_assignee": change.tell} if change.tell else {}),
                },
            )
    except _Refused as exc:
        return Outcome(bead_id, False, str(exc))
    told = _tell(bead, change.tell) if real and change.tell else ""
    return Outcome(bead_id, True, words, found, told)


def _apply(bead: Bead, change: rules.Change, reason: str) -> Bead:
    """Write `change` to the locked `bead`; returns a copy of the bead as it was."""
    old = Bead(**{f.attname: getattr(bead, f.attname) for f in Bead._meta.concrete_fields})
    now = timezone.now()
    if change.clear_failures:
        bead.dispatch_failures = 0
    if change.rig is not None:
        bead.rig_id = change.rig
    if change.assignee is not None:
        bead.assignee = change.assignee
    if change.status is not None:
        bead.status = change.status
        if bead.status in DONE_STATUSES:
            bead.closed_at = now
            bead.close_reason = f"Skipped: {reason}" if reason else "Skipped"
        else:
            bead.closed_at = None
            bead.close_reason = ""
    bead.updated_at = now
    bead.save()
    return old


def _tell(bead: Bead, worker: str) -> str:
    """Tell `worker` it lost `bead` (after the commit); the answer in words, for the outcome."""
    convoy = Convoy.objects.filter(tracked__bead_id=bead.pk, status=CONVOY_OPEN).first()
    try:
        outcome = release(
            get_dispatcher(), bead.pk, bead.rig_id or "", convoy.pk if convoy else "", worker
        )
    except Exception as exc:  # the bead is released either way; the worker may not know
        log.exception("release hook for %s failed", bead.pk)
        return f"release hook failed: {exc}"[:300]
    if outcome is None:
        return ""
    return "worker told" if outcome.ok else f"worker not told: {outcome.error}"[:300]


def _feed(bead_ids: Sequence[str], actor: str) -> list[str]:
    """Feed the open convoys tracking `bead_ids` once (a close's feed: it lands a complete
    convoy and dispatches what became ready). Returns the dispatched bead ids."""
    if not bead_ids:
        return []
    convoys = rules.convoys_of(bead_ids)
    open_ = [c for c in convoys if c.status == CONVOY_OPEN]
    fed: list[str] = []
    if capacity.cap():
        for convoy in open_:
            close_if_complete(convoy, actor=actor)
        return [r["id"] for r in feed_town("event")]
    for convoy in open_:
        fed += [r["id"] for r in feed_convoy(convoy, "event")]
    return fed


def ids_of(text: Iterable[str]) -> list[str]:
    """Bead ids from a form's fields (one per value, or several split by spaces/commas)."""
    found: list[str] = []
    for value in text:
        found += [part for part in value.replace(",", " ").split() if part]
    return found
