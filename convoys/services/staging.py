"""Staging: classify the input, collect beads and dependencies, analyse the DAG, then create
or update a staged convoy. `analyze` writes nothing (the stage page previews with it).

Collecting an epic uses one recursive query, so the number of queries does not grow with
the size of the epic.
"""

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from convoys.core import dag as dagmod
from convoys.core import formatting
from convoys.core.ids import text_problem
from convoys.infra import bulk
from convoys.log.events import record
from convoys.models import (
    CONVOY_OPEN,
    DONE_STATUSES,
    SLINGABLE_TYPES,
    STAGED_STATUSES,
    Bead,
    Convoy,
    Dependency,
    Rig,
    TrackedBead,
)
from convoys.services.convoys import due_time_of, get_convoy, new_convoy_id, set_status
from convoys.services.errors import ServiceError

log = logging.getLogger("convoys.staging")


Edge = tuple[str, str, str]  # (issue id, the id it depends on, dependency type)


class Classified(NamedTuple):
    kind: str  # dag.EPIC, dag.TASKS or dag.CONVOY
    ids: list[str]  # sorted, unique
    restage: Convoy | None  # the staged convoy named to re-stage


class Collected(NamedTuple):
    nodes: list[dagmod.Node]
    edges: list[Edge]


@dataclass
class Plan:
    input_kind: str
    ids: list[str]
    dag: dagmod.DAG
    root: str = ""
    errors: list[dagmod.Finding] = field(default_factory=list)
    warnings: list[dagmod.Finding] = field(default_factory=list)
    waves: list[list[str]] = field(default_factory=list)
    gated: list[dagmod.Gated] = field(default_factory=list)
    status: str = ""
    convoy_id: str = ""
    restaged: bool = False
    title: str = ""
    moved: dict[str, list[int | None]] = field(default_factory=dict)  # {id: [old wave, new]}

    @property
    def refusal(self) -> str:
        """Why nothing was staged ("" when the plan has no errors): one line, as every exit says it."""
        return f"convoy staging failed: {len(self.errors)} error(s) found" if self.errors else ""

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "status": self.status or "error",
            "convoy_id": self.convoy_id,
            "restaged": self.restaged,
            "errors": [f.as_dict() for f in self.errors],
            "warnings": [f.as_dict() for f in self.warnings],
            "waves": formatting.waves_json(self.dag, self.waves) if self.waves else [],
            "tree": formatting.tree_json(self.dag, self.input_kind, self.root) if self.dag else [],
        }
        if self.gated:
            data["gated"] = [
                {
                    "id": g.id,
                    "title": self.dag.nodes[g.id].title,
                    "type": self.dag.nodes[g.id].type,
                    "gated_by": g.gated_by or None,
                }
                for g in self.gated
            ]
        return data

    def render(self) -> tuple[str, str]:
        """(the tree and wave table, the errors block: "" when there are none)."""
        text = formatting.render_tree(self.dag, self.input_kind, self.root) if self.dag else ""
        if self.errors:
            return text, formatting.render_findings("Errors", self.errors)
        text += "\n" + formatting.render_wave_table(self.dag, self.waves)
        text += formatting.render_gated(self.dag, self.gated)
        if self.warnings:
            text += "\n" + formatting.render_findings("Warnings", self.warnings)
        return text, ""


def classify(ids: Sequence[str]) -> Classified:
    """-> (kind, ids, restage convoy or None). Errors name the offending argument."""
    if not ids:
        raise ServiceError(
            "convoy stage requires at least one bead ID\n\nUsage: convoy stage "
            "<epic-id | task-id... | convoy-id>"
        )
    for arg in ids:
        if arg.startswith("-"):
            raise ServiceError(f'invalid bead ID "{arg}": looks like a CLI flag, not a bead ID')
        if problem := text_problem(arg):  # no row holds one; PostgreSQL cannot even look
            raise ServiceError(f"invalid bead ID {arg[:40]!r}: {problem}")
    unique = sorted(set(ids))
    convoys = Convoy.objects.in_bulk(unique)
    beads = Bead.objects.in_bulk([i for i in unique if i not in convoys])
    parts: dict[str, list[str]] = {"convoy": [], "epic": [], "task": []}
    for arg in unique:
        if arg in convoys:
            parts["convoy"].append(arg)
        elif arg in beads:
            parts["epic" if beads[arg].issue_type == "epic" else "task"].append(arg)
        else:
            raise ServiceError(f"cannot resolve bead {arg}: not found")
    present = sorted(k for k, v in parts.items() if v)
    if len(present) > 1:
        text = " + ".join(f"{k} ({', '.join(parts[k])})" for k in present)
        raise ServiceError(
            f"mixed input types: {text}\n  Use separate invocations for different input types"
        )
    kind = present[0]
    if kind == "epic" and len(parts["epic"]) > 1:
        raise ServiceError(
            f"only one epic ID allowed, got {len(unique)}: {', '.join(unique)}\n"
            "  To stage multiple epics, run convoy stage once per epic"
        )
    if kind == "convoy":
        if len(unique) > 1:
            raise ServiceError(
                f"only one convoy ID allowed, got {len(unique)}: {', '.join(unique)}"
            )
        convoy = convoys[unique[0]]
        if convoy.status not in STAGED_STATUSES:
            raise ServiceError(
                f"cannot stage convoy {convoy.id}: it is {convoy.status} "
                "(only staged convoys can be re-staged)"
            )
        return Classified(dagmod.CONVOY, unique, convoy)
    return Classified(dagmod.EPIC if kind == "epic" else dagmod.TASKS, unique, None)


def _descendants_sql(epic_id: str) -> tuple[str, list[str]]:
    table = Dependency._meta.db_table
    sql = (
        f"WITH RECURSIVE tree(id) AS (SELECT CAST(%s AS VARCHAR(255)) UNION "
        f"SELECT d.issue_id FROM {table} d JOIN tree ON d.depends_on_id = tree.id "
        f"WHERE d.type = 'parent-child') SELECT id FROM tree"
    )
    return sql, [epic_id]


def collect(kind: str, ids: Sequence[str], convoy: Convoy | None = None) -> Collected:
    """-> (nodes, deps) with a constant number of queries."""
    if kind == dagmod.EPIC:
        return _collect_epic(ids[0])
    deps = Dependency.objects.filter(issue_id__in=ids)
    if kind == dagmod.CONVOY:
        assert convoy is not None  # a convoy's input is the convoy (classify)
        tracked = TrackedBead.objects.filter(convoy=convoy).values("bead_id")
        if not tracked.exists():
            raise ServiceError(f"convoy {convoy.id} tracks no beads")
        deps = Dependency.objects.filter(issue_id__in=tracked)
        # The gates of tracked beads (a decision, say) are not tracked: read them too, so a
        # re-staged or launched convoy still knows what gates its tasks.
        gates = Bead.objects.filter(id__in=deps.values("depends_on_id")).exclude(
            issue_type__in=SLINGABLE_TYPES
        )
        beads = Bead.objects.filter(Q(id__in=tracked) | Q(id__in=gates.values("id")))
    else:
        beads = Bead.objects.filter(id__in=ids)
    nodes = [
        dagmod.Node(id=b[0], title=b[1], type=b[2] or "", status=b[3], rig=b[4] or "")
        for b in beads.values_list("id", "title", "issue_type", "status", "rig_id")
    ]
    return Collected(nodes, list(deps.values_list("issue_id", "depends_on_id", "type")))


def _collect_epic(epic_id: str) -> Collected:
    """The epic and every parent-child descendant, and their dependencies: two queries, each
    a recursive CTE joined to its table (an IN over the CTE is re-evaluated per row)."""
    cte, params = _descendants_sql(epic_id)
    cte = cte.removesuffix(" SELECT id FROM tree")
    bead_table, dep_table = Bead._meta.db_table, Dependency._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"{cte} SELECT b.id, b.title, b.issue_type, b.status, b.rig_id FROM {bead_table} b "
            "JOIN tree ON b.id = tree.id",
            params,
        )
        nodes = [
            dagmod.Node(id=r[0], title=r[1], type=r[2] or "", status=r[3], rig=r[4] or "")
            for r in cursor.fetchall()
        ]
        cursor.execute(
            f"{cte} SELECT d.issue_id, d.depends_on_id, d.type FROM {dep_table} d "
            "JOIN tree ON d.issue_id = tree.id",
            params,
        )
        edges: list[Edge] = cursor.fetchall()
    return Collected(nodes, edges)


def _overlapping(
    kind: str, ids: Sequence[str], slingable: Collection[str]
) -> dict[tuple[str, str], int]:
    """Open or staged convoys tracking any of the slingable beads: {convoy: count}."""
    queryset = TrackedBead.objects.filter(convoy__status__in=(CONVOY_OPEN, *STAGED_STATUSES))
    if len(slingable) <= 5000:
        # Above that, read the (few) open convoys' tracking rows rather than a huge IN list.
        queryset = queryset.filter(bead_id__in=slingable)
    counts: dict[tuple[str, str], int] = {}
    wanted = set(slingable)
    for convoy_id, status, bead_id in queryset.values_list(
        "convoy_id", "convoy__status", "bead_id"
    ):
        if bead_id in wanted:
            counts.setdefault((convoy_id, status), 0)
            counts[(convoy_id, status)] += 1
    return counts


def refuse_all_closed(dag: dagmod.DAG) -> None:
    """Every way in (page, API, CLI, launch) refuses a DAG whose tasks are all done."""
    slingable = dag.slingable_ids()
    if slingable and all(dag.nodes[i].status in DONE_STATUSES for i in slingable):
        raise ServiceError(f"nothing to stage: all {len(slingable)} tasks are closed")


def analyze(ids: Sequence[str], title: str | None = None) -> Plan:
    """Everything staging decides, without writing."""
    kind, unique, restage = classify(ids)
    nodes, edges = collect(kind, unique, restage)
    plan = Plan(
        input_kind=kind,
        ids=unique,
        dag=dagmod.build_dag(nodes, edges),
        root=unique[0] if kind == dagmod.EPIC else "",
    )
    slingable = plan.dag.slingable_ids()
    refuse_all_closed(plan.dag)
    if restage is None:
        overlap = _overlapping(kind, unique, slingable)
        open_ = sorted((cid, n) for (cid, status), n in overlap.items() if status == CONVOY_OPEN)
        staged = sorted(cid for (cid, status) in overlap if status in STAGED_STATUSES)
        if open_:
            cid, count = open_[0]
            raise ServiceError(
                f"cannot stage: open convoy {cid} already tracks {count} of these beads — close "
                "it first or wait for completion",
                {"cli": f'\n  python manage.py convoy close {cid} --reason "re-staging"'},
            )
        if len(staged) > 1:
            raise ServiceError(
                f"ambiguous: {len(staged)} staged convoys overlap with these beads "
                f"({', '.join(staged)})\n  Specify which convoy to re-stage: "
                "python manage.py convoy stage <convoy-id>"
            )
        if staged:
            restage = Convoy.objects.get(pk=staged[0])
    if restage is not None:
        plan.restaged = True
        plan.convoy_id = restage.id
    plan.errors = dagmod.detect_errors(plan.dag)
    if plan.errors:
        return plan
    rig_states = dict(Rig.objects.values_list("name", "state"))
    # A re-staged convoy is checked as what it was staged from (an epic's orphans, say).
    staged_from = (restage.extra or {}).get("plan", {}).get("input") if restage else None
    plan.warnings = dagmod.detect_warnings(plan.dag, staged_from or kind, rig_states)
    try:
        plan.waves, plan.gated = dagmod.compute_waves(plan.dag)
    except dagmod.NoSlingableTasks as exc:
        raise ServiceError(str(exc))
    plan.warnings = plan.warnings + dagmod.gated_warnings(plan.gated)
    plan.status = dagmod.choose_status(plan.errors, plan.warnings)
    if title:
        plan.title = title
    elif kind == dagmod.EPIC:
        plan.title = "Convoy: " + plan.dag.nodes[plan.root].title
    elif restage is not None:
        plan.title = restage.title
    else:
        rigs = {plan.dag.nodes[i].rig for i in slingable if plan.dag.nodes[i].rig}
        plan.title = f"Staged: {len(slingable)} beads across {len(rigs)} rigs"
    if restage is not None:
        previous = dagmod.wave_of((restage.extra or {}).get("plan", {}).get("waves", []))
        current = dagmod.wave_of(plan.waves)
        plan.moved = {
            i: [previous.get(i), current.get(i)]
            for i in set(previous) | set(current)
            if previous.get(i) != current.get(i)
        }
    return plan


def stage(
    ids: Sequence[str],
    title: str | None = None,
    actor: str = "cli",
    merge: str = "",
    due: str | datetime | None = None,
) -> Plan:
    """Analyse, then create or update the staged convoy (nothing is written on errors).
    `merge`: its merge strategy (direct, mr, local; "" keeps it, or the town's default);
    `due`: when it should land (None keeps it)."""
    if merge and merge not in Convoy.MERGE_STRATEGIES:
        raise ServiceError(f'invalid --merge value "{merge}": must be direct, mr, or local')
    due_at = due_time_of(due)
    plan = analyze(ids, title)
    if plan.errors:
        return plan
    slingable = plan.dag.slingable_ids()
    stamp = timezone.now()
    summary = f"Staged convoy: {len(slingable)} tasks, {len(plan.waves)} waves."
    extra_plan: dict[str, Any] = {
        "waves": plan.waves,
        "gated": [[g.id, g.gated_by] for g in plan.gated],
        "input": plan.input_kind,
        "root": plan.root,
        # What the convoy page shows until the next re-check.
        "warnings": [f.as_dict() for f in plan.warnings],
        "checked_at": stamp.isoformat(),
    }
    with transaction.atomic():
        if plan.restaged:
            convoy = get_convoy(plan.convoy_id, lock=True)
            if convoy.status not in STAGED_STATUSES:
                raise ServiceError(
                    f"convoy {convoy.id} is {convoy.status}; it can no longer be re-staged"
                )
            set_status(
                convoy,
                plan.status,
                actor=actor,
                kind="convoy.restaged",
                data={"moved": plan.moved, "waves": len(plan.waves)},
            )
            convoy.title = plan.title or convoy.title
            convoy.description = f"{summary} Re-staged at {stamp.isoformat()}"
            if plan.input_kind == dagmod.CONVOY:  # re-staged by id: keep what it came from
                previous = convoy.extra.get("plan", {})
                extra_plan["input"] = previous.get("input", extra_plan["input"])
                extra_plan["root"] = previous.get("root", extra_plan["root"])
            convoy.extra = {**convoy.extra, "plan": extra_plan}
            convoy.merge_strategy = merge or convoy.merge_strategy
            convoy.due_at = due_at or convoy.due_at
            convoy.save(update_fields=["title", "description", "extra", "merge_strategy", "due_at"])
            wanted = set(slingable)
            tracked = dict(TrackedBead.objects.filter(convoy=convoy).values_list("bead_id", "pk"))
            stale = [pk for bead_id, pk in tracked.items() if bead_id not in wanted]
            if stale:
                TrackedBead.objects.filter(pk__in=stale).delete()
            bulk.insert(
                TrackedBead,
                [
                    {"convoy_id": convoy.id, "bead_id": b, "position": i}
                    for i, b in enumerate(slingable)
                    if b not in tracked
                ],
            )
        else:
            convoy = Convoy.objects.create(
                id=new_convoy_id(),
                title=plan.title,
                status=plan.status,
                created_by=actor,
                owner=actor if actor not in ("cli", "api") else "",
                created_at=stamp,
                updated_at=stamp,
                description=f"{summary} Staged at {stamp.isoformat()}",
                extra={"plan": extra_plan},
                merge_strategy=merge,
                due_at=due_at,
            )
            bulk.insert(
                TrackedBead,
                [
                    {"convoy_id": convoy.id, "bead_id": b, "position": i}
                    for i, b in enumerate(slingable)
                ],
            )
            record(
                "convoy.staged",
                convoy_id=convoy.id,
                actor=actor,
                data={
                    "status": convoy.status,
                    "title": convoy.title,
                    "tasks": len(slingable),
                    "waves": len(plan.waves),
                },
            )
            plan.convoy_id = convoy.id
    return plan


def recheck(convoy_id: str, actor: str = "cli") -> Plan:
    """Re-stage a staged convoy in place: its warnings are computed again (staged_warnings
    becomes staged_ready once they are gone), with a convoy.restaged event."""
    convoy = get_convoy(convoy_id)
    if convoy.status not in STAGED_STATUSES:
        raise ServiceError(
            f"cannot re-check convoy {convoy.id}: it is {convoy.status} "
            "(only a staged convoy is re-checked)"
        )
    return stage([convoy.id], actor=actor)


def recheck_rig(rig_name: str, actor: str = "") -> list[Plan]:
    """Re-check the staged convoys with a task on this rig (it was parked or un-parked).
    A convoy that can no longer be staged keeps its status; its reason is logged."""
    on_rig = Bead.objects.filter(rig_id=rig_name).values("id")
    convoy_ids = list(
        Convoy.objects.filter(status__in=STAGED_STATUSES, tracked__bead_id__in=on_rig)
        .distinct()
        .order_by("id")
        .values_list("id", flat=True)
    )
    plans: list[Plan] = []
    for convoy_id in convoy_ids:
        try:
            plans.append(stage([convoy_id], actor=actor))
        except ServiceError as exc:
            log.info("re-check of %s after rig %s changed: %s", convoy_id, rig_name, exc)
    return plans
