"""One control over several convoys at once (the dashboard's selection, `POST
/api/convoys/actions`): pause, resume or acknowledge each through its own service
(services/controls.py, services/escalation.py), one transaction per convoy, so a refusal of
one (closed, not escalated, no such convoy) changes nothing of it and leaves the others done.
"""

from typing import NamedTuple

from convoys.core.ids import text_problem
from convoys.services import controls, escalation
from convoys.services.errors import ServiceError

ACTIONS = ("pause", "resume", "acknowledge")
MAX_IDS = 500
# What each action needs (the single controls' permissions: anyone told of a stuck convoy
# may say they are on it).
PERMISSIONS = {
    "pause": "change_convoy",
    "resume": "change_convoy",
    "acknowledge": "view_convoy",
}
DONE_WORDS = {"pause": "paused", "resume": "resumed", "acknowledge": "acknowledged"}
UNCHANGED_WORDS = {
    "pause": "already paused",
    "resume": "not paused",
    "acknowledge": "already acknowledged",
}


class Outcome(NamedTuple):
    id: str
    result: str  # "done", "unchanged" (a repeat: nothing to do) or "refused"
    detail: str  # why it was refused, "" otherwise

    def as_json(self) -> dict[str, str]:
        return self._asdict()


class Batch(NamedTuple):
    action: str
    outcomes: list[Outcome]

    def ids(self, result: str) -> list[str]:
        return [o.id for o in self.outcomes if o.result == result]

    @property
    def summary(self) -> str:
        """One line: how many were done, left as they were, and refused and why."""
        done, same = self.ids("done"), self.ids("unchanged")
        parts = [f"{DONE_WORDS[self.action].capitalize()} {_count(done)}{_listed(done)}"]
        if same:
            parts.append(f"{len(same)} {UNCHANGED_WORDS[self.action]}{_listed(same)}")
        refused = [o for o in self.outcomes if o.result == "refused"]
        if refused:
            why = "; ".join(o.detail for o in refused[:5])
            more = f"; and {len(refused) - 5} more" if len(refused) > 5 else ""
            parts.append(f"{len(refused)} refused: {why}{more}")
        return "; ".join(parts) + "."


def _count(ids: list[str]) -> str:
    return f"{len(ids)} convoy{'s' if len(ids) != 1 else ''}"


def _listed(ids: list[str]) -> str:
    if not ids:
        return ""
    more = f" and {len(ids) - 10} more" if len(ids) > 10 else ""
    return f" ({', '.join(ids[:10])}{more})"


def check(action: str, ids: list[str], reason: str = "") -> list[str]:
    """The ids to act on, in order, each once; refuses (nothing done) an unknown action, no
    ids, too many, or a reason the pause would refuse."""
    if action not in ACTIONS:
        raise ServiceError(f"action: one of {', '.join(ACTIONS)} ({action[:40]!r} given)")
    wanted = list(dict.fromkeys(i.strip() for i in ids if i.strip()))
    if not wanted:
        raise ServiceError("ids: select at least one convoy")
    if len(wanted) > MAX_IDS:
        raise ServiceError(f"ids: at most {MAX_IDS} convoys at once ({len(wanted)} given)")
    reason = " ".join((reason or "").split())
    if len(reason) > controls.REASON_LIMIT:
        raise ServiceError(
            f"reason: at most {controls.REASON_LIMIT} characters ({len(reason)} given)"
        )
    return wanted


def run(action: str, ids: list[str], *, actor: str, reason: str = "") -> Batch:
    """Do `action` to each convoy of `ids`, each in its own transaction; a refusal is
    reported beside the others, not raised."""
    outcomes = []
    for convoy_id in check(action, ids, reason):
        problem = text_problem(convoy_id) or (
            "longer than a convoy id" if len(convoy_id) > 64 else None
        )
        if problem:  # no row holds it (and the database would refuse the lookup)
            outcomes.append(Outcome(convoy_id[:64], "refused", f"convoy id {problem}"))
            continue
        try:
            changed = _one(action, convoy_id, actor, reason)
        except ServiceError as exc:
            outcomes.append(Outcome(convoy_id, "refused", str(exc)))
        else:
            outcomes.append(Outcome(convoy_id, "done" if changed else "unchanged", ""))
    return Batch(action, outcomes)


def _one(action: str, convoy_id: str, actor: str, reason: str) -> bool:
    if action == "pause":
        return controls.pause(convoy_id, actor=actor, reason=reason).changed
    if action == "resume":
        return controls.resume(convoy_id, actor=actor).changed
    return escalation.acknowledge(convoy_id, actor=actor).changed
