"""Launch: every check first, then open the convoy and claim each ready Wave 1 task in one
transaction, then run the dispatcher for each claim (a failure releases only its own claim).
With a town cap, Wave 1 beads past the free slots are skipped with the reason and wait in
the town's queue (rules/capacity.py).
An epic or a task list is staged and launched in one step.
"""

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from django.db import transaction

from convoys.core import dag as dagmod
from convoys.core.ids import text_problem
from convoys.models import CONVOY_CLOSED, CONVOY_OPEN, CONVOY_STAGED_WARNINGS, Bead, Convoy, Rig
from convoys.rules import breaker, capacity
from convoys.rules.readiness import blocked_by, ready_beads
from convoys.services import dispatch, staging
from convoys.services.convoys import get_convoy, set_status
from convoys.services.errors import NeedsForce, ServiceError


class Skipped(TypedDict):
    id: str
    reason: str  # why Wave 1 did not dispatch it, in words


@dataclass
class LaunchResult:
    convoy_id: str
    status: str
    waves: list[list[str]]
    dispatched: list[dispatch.DispatchResult] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    plan: staging.Plan | None = None  # an epic or task list staged on the way

    def as_json(self) -> dict[str, Any]:
        return {
            "convoy_id": self.convoy_id,
            "status": self.status,
            "dispatched": [
                {
                    "id": r["id"],
                    "rig": r["rig"],
                    "worker": r["worker"],
                    "ok": r["ok"],
                    "error": r["error"],
                }
                for r in sorted(self.dispatched, key=lambda r: r["id"])
            ],
            "skipped": self.skipped,
        }

    def as_report(self) -> dict[str, Any]:
        return {
            "convoy_id": self.convoy_id,
            "status": self.status,
            "waves": self.waves,
            "dispatched": self.dispatched,
            "skipped": self.skipped,
        }


def launch(
    ids: Sequence[str],
    *,
    force: bool = False,
    actor: str = "cli",
    title: str | None = None,
    merge: str = "",
) -> LaunchResult:
    """Stage (an epic or beads, with `merge` its merge strategy) and launch, or launch a
    staged convoy."""
    # An id no row can hold (a NUL) is refused by name by staging, not looked up here.
    if len(ids) == 1 and not text_problem(ids[0]) and Convoy.objects.filter(pk=ids[0]).exists():
        convoy = Convoy.objects.get(pk=ids[0])
        if convoy.status == CONVOY_OPEN:
            raise ServiceError(f"convoy {convoy.id} is already launched")
        if convoy.status == CONVOY_CLOSED:
            raise ServiceError(f"convoy {convoy.id} is closed")
        return launch_staged(convoy.id, force=force, actor=actor)
    plan = staging.analyze(ids, title)
    if plan.errors:
        raise ServiceError(
            plan.refusal + "\n" + "\n".join(f"  [{f.category}] {f.message}" for f in plan.errors)
        )
    _preflight(plan.status, plan.dag, force, plan.convoy_id or "(new)")
    plan = staging.stage(ids, title, actor=actor, merge=merge)
    result = launch_staged(plan.convoy_id, force=force, actor=actor)
    result.plan = plan
    return result


def _preflight(status: str, dag: dagmod.DAG, force: bool, convoy_id: str) -> dict[str, list[str]]:
    """{parked or docked rig: its slingable beads}; refuses unless `force`."""
    if status not in (CONVOY_STAGED_WARNINGS, "staged_ready"):
        raise ServiceError(f'convoy {convoy_id} has unexpected status "{status}"')
    # Parked rigs first: parking re-checks a staged convoy into staged_warnings, and the rig
    # is what the user must act on.
    states = dict(Rig.objects.values_list("name", "state"))
    blocked: dict[str, list[str]] = {}
    for node_id in dag.slingable_ids():
        rig = dag.nodes[node_id].rig
        if rig and states.get(rig, "active") != "active":
            blocked.setdefault(rig, []).append(node_id)
    if blocked and not force:
        lines = "\n".join(f"  {rig}: {', '.join(ids)}" for rig, ids in sorted(blocked.items()))
        refused = NeedsForce(
            f"cannot launch: {len(blocked)} target rig(s) are parked or docked:\n{lines}",
            "launch",
            cli="\n\nUse `python manage.py rigs unpark` or `rigs undock` to restore, or --force "
            "to proceed anyway",
        )
        refused.how["web"] = ": un-park them (Waiting on rigs), or tick the confirmation."
        refused.how["admin"] = ": un-park them, or use “…even with warnings or parked rigs”."
        raise refused
    if status == CONVOY_STAGED_WARNINGS and not force:
        refused = NeedsForce(
            f"convoy {convoy_id} has warnings", "launch", cli=", use --force to launch"
        )
        refused.how["admin"] = ": use the action “…even with warnings or parked rigs”."
        raise refused
    return blocked


def launch_staged(convoy_id: str, *, force: bool = False, actor: str = "cli") -> LaunchResult:
    convoy = get_convoy(convoy_id)
    nodes, edges = staging.collect(dagmod.CONVOY, [convoy.id], convoy)
    dag = dagmod.build_dag(nodes, edges)
    staging.refuse_all_closed(dag)
    blocked_rigs = _preflight(convoy.status, dag, force, convoy.id)
    try:
        waves, _ = dagmod.compute_waves(dag)
    except dagmod.NoSlingableTasks:
        waves = []
    if not waves:
        raise ServiceError(f"convoy {convoy.id}: no waves to dispatch")
    wave1 = waves[0]
    claims: list[dispatch.Claim] = []
    skipped: list[Skipped] = []
    with transaction.atomic():
        if capacity.cap():
            capacity.lock_town()  # before the convoy's row lock, as every claim takes them
        convoy = get_convoy(convoy.id, lock=True)
        if convoy.status not in ("staged_ready", CONVOY_STAGED_WARNINGS):
            raise ServiceError(
                f"convoy {convoy.id} is {convoy.status}; launch needs a staged convoy"
            )
        set_status(
            convoy,
            CONVOY_OPEN,
            actor=actor,
            kind="convoy.launched",
            data={"waves": len(waves), "wave1": len(wave1)},
        )
        beads = Bead.objects.in_bulk(wave1)
        ready = {b.pk: b for b in ready_beads(Bead.objects.filter(pk__in=wave1))}
        blockers = blocked_by(wave1)
        cooling = breaker.cooling_down(wave1)
        for bead_id in wave1:
            bead = beads.get(bead_id)
            if bead_id in ready and bead_id not in cooling:
                won = dispatch.claim(
                    ready[bead_id], convoy_id=convoy.id, path="launch", actor=actor
                )
                if won:
                    claims.append(won)
                    continue
                reason = dispatch.refusal(ready[bead_id], convoy.id)
                skipped.append({"id": bead_id, "reason": reason})
            else:
                skipped.append({"id": bead_id, "reason": why_not_ready(bead, blockers, cooling)})
    result = LaunchResult(convoy.id, convoy.status, waves, skipped=skipped)
    if blocked_rigs:
        result.warnings.append(
            f"Warning: {len(blocked_rigs)} non-operational rig(s) in convoy: "
            f"{', '.join(sorted(blocked_rigs))}\n  Proceeding with --force (tasks may fail)"
        )
    # The claims wait their turn: renewed now and then, so none is settled as abandoned.
    renewed = time.monotonic()
    for n, claim in enumerate(claims):
        if time.monotonic() - renewed > dispatch.claim_grace().total_seconds() / 3:
            dispatch.hold(claims[n:])
            renewed = time.monotonic()
        result.dispatched.append(dispatch.run(claim))
    return result


def why_not_ready(
    bead: Bead | None, blockers: Mapping[str, Sequence[str]], cooling: Collection[str]
) -> str:
    if bead is None:
        return "not in the database"
    if bead.status in ("closed", "tombstone"):
        return f"already {bead.status}"
    if not bead.is_slingable:
        return f'non-slingable type "{bead.issue_type}"'
    if bead.dispatch_failures >= breaker.max_failures():
        return (
            f"parked after {bead.dispatch_failures} failed dispatches in a row "
            f"(`beads retry {bead.pk}` once the cause is fixed)"
        )
    if bead.pk in cooling:
        return "dispatch failed recently (cooling down)"
    if bead.assignee:
        return f"already {bead.status} ({bead.assignee})"
    if bead.status != "open":
        return f"status is {bead.status}"
    if blockers.get(bead.pk):
        return f"blocked by {', '.join(blockers[bead.pk])}"
    if not bead.rig_id:
        return "no rig"
    rig = Rig.objects.filter(pk=bead.rig_id).first()
    if rig and rig.state != "active":
        return f"rig {rig.name} is {rig.state}"
    return "not ready"
