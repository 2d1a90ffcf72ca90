"""Writing bd records: `Importer` takes batches of checked records and writes each change with
its event; `prepare` turns a bead's record into its table rows. The file import
(`reading`) and the continuous sync (convoys/services/bdsync/) both write through it.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

from convoys.core import beadfile, convoy_fields
from convoys.core.beadfile import (
    MemoryLine,
    Record,
    parse_timestamp,
)
from convoys.core.ids import unwrap_external
from convoys.infra import bulk
from convoys.log import queue
from convoys.log.events import CLOSED, EventItem, record_many
from convoys.models import (
    Bead,
    Convoy,
    Dependency,
    Memory,
    TrackedBead,
)
from convoys.services import discovered
from convoys.services.errors import ServiceError
from convoys.services.rigs import rig_for, route_map

BATCH = 1000


Row = tuple[Any, ...]  # a table's stored row, in its columns' order (bulk.Table)


PreparedBead = tuple[Row, list[Row]]  # a bead's row and its dependencies' rows


# (line number, a convoy's record or None, a bead prepared for its table or None)
BatchItem = tuple[int, Record | None, PreparedBead | None]


# (a batch, the memory lines read since the last one, {report field: lines so far})
Batch = tuple[list[BatchItem], list[MemoryLine], dict[str, int]]


class ImportFailed(ServiceError):
    pass


@dataclass
class ImportReport:
    file: str = ""
    lines: int = 0
    beads_created: int = 0
    beads_updated: int = 0
    beads_unchanged: int = 0
    convoys_created: int = 0
    convoys_updated: int = 0
    convoys_unchanged: int = 0
    dependencies: int = 0
    tracked: int = 0
    skipped_tombstones: int = 0
    skipped_wisps: int = 0
    skipped_memories: int = 0
    memories: int = 0
    routes: int = 0
    events: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def beads(self) -> int:
        return self.beads_created + self.beads_updated + self.beads_unchanged

    @property
    def convoys(self) -> int:
        return self.convoys_created + self.convoys_updated + self.convoys_unchanged

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(beads=self.beads, convoys=self.convoys)
        return data


DEPENDENCY_FIELDS = (
    "depends_on_id",
    "raw_target",
    "type",
    "created_at",
    "created_by",
    "metadata",
    "extra",
)


# A convoy record's keys stored in its columns; the others are kept in `extra`.
CONVOY_KEYS = frozenset(
    (
        "id",
        "dependencies",
        "title",
        "description",
        "status",
        "labels",
        "created_at",
        "updated_at",
        "closed_at",
        "close_reason",
        "created_by",
    )
)


def _dependency_keys(beads: Mapping[str, Bead]) -> dict[str, list[Row]]:
    """{bead id: its dependencies as comparable tuples, in the order they were written}."""
    keys: dict[str, list[Row]] = {}
    if beads:
        rows = Dependency.objects.filter(issue_id__in=list(beads)).order_by("id")
        for issue_id, *values in rows.values_list("issue_id", *DEPENDENCY_FIELDS):
            keys.setdefault(issue_id, []).append(tuple(values))
    return keys


def _dependency_keys_of(dep_rows: Iterable[Row]) -> list[Row]:
    values = bulk.table(Dependency).values
    return [tuple(map(values(row).get, DEPENDENCY_FIELDS)) for row in dep_rows]


class Importer:
    def __init__(self, report: ImportReport, actor: str) -> None:
        self.report = report
        self.actor = actor
        self.routes = route_map()
        self.now = timezone.now()
        self.discovered_edges: list[
            tuple[str, str]
        ] = []  # new discovered-from edges: they join convoys at the end

    def add(self, batch: Sequence[BatchItem]) -> None:
        beads = [prepared for _, _, prepared in batch if prepared is not None]
        convoys = [(n, r) for n, r, _ in batch if r is not None]
        if beads:
            self._beads(beads)
        if convoys:
            self._convoys(convoys)

    def _beads(self, batch: Sequence[PreparedBead]) -> None:
        """Insert new beads' stored rows as they are. Existing beads are compared field by
        field and dependency by dependency; only what changed is written, with its event."""
        table = bulk.table(Bead)
        at = table.index
        ids = [row[at["id"]] for row, _ in batch]
        existing = Bead.objects.in_bulk(bulk.existing_keys(Bead, ids))
        old_deps = _dependency_keys(existing)
        creates: list[Row] = []
        updates: list[Bead] = []
        events: list[EventItem] = []
        changed_fields: set[str] = set()
        deps: list[Row] = []
        replaced: list[str] = []
        for row, dep_rows in batch:
            bead = existing.get(row[at["id"]])
            if bead is None:
                creates.append(row)
                deps.extend(dep_rows)
                events.append(
                    dict(
                        kind="bead.created",
                        bead_id=row[at["id"]],
                        actor=self.actor,
                        data={
                            "status": row[at["status"]],
                            "title": row[at["title"]],
                            "source": "import",
                        },
                    )
                )
                continue
            values = table.values(row)
            diff = {k: v for k, v in values.items() if getattr(bead, k) != v}
            changes = sorted(k for k in diff if k != "extra")
            if _dependency_keys_of(dep_rows) != old_deps.get(bead.id, []):
                replaced.append(bead.id)
                deps.extend(dep_rows)
                changes.append("dependencies")
            if not diff and not changes:
                self.report.beads_unchanged += 1
                continue
            self.report.beads_updated += 1
            old_status = bead.status
            if diff:
                for name, value in diff.items():
                    setattr(bead, name, value)
                changed_fields.update(diff)
                updates.append(bead)
            kind = "bead.updated"
            if "status" in diff:
                if bead.status == "closed":
                    kind = CLOSED
                elif old_status in ("closed", "tombstone"):
                    kind = "bead.reopened"
                else:
                    kind = "bead.status"
            events.append(
                dict(
                    kind=kind,
                    bead_id=bead.id,
                    actor=self.actor,
                    data={
                        "status": bead.status,
                        "old_status": old_status,
                        "assignee": bead.assignee,
                        "title": bead.title,
                        "close_reason": bead.close_reason,
                        "source": "import",
                        "changes": changes,
                    },
                )
            )
        table.insert(creates)
        if updates:
            Bead.objects.bulk_update(updates, sorted(changed_fields), batch_size=500)
        self.report.beads_created += len(creates)
        if replaced:
            Dependency.objects.filter(issue_id__in=replaced).delete()
        bulk.table(Dependency).insert(deps)
        self._note_discovered(deps, old_deps)
        self.report.dependencies += sum(len(dep_rows) for _, dep_rows in batch)
        seqs = record_many(events, instances=False)
        self.report.events += len(seqs)
        # An imported close feeds what it unblocked, as a local close does.
        queue.handle_closes_on_commit(
            [seq for seq, event in zip(seqs, events, strict=True) if event["kind"] == CLOSED]
        )

    def _note_discovered(self, deps: Iterable[Row], old_deps: Mapping[str, list[Row]]) -> None:
        at = bulk.table(Dependency).index
        issue, target, kind = at["issue_id"], at["depends_on_id"], at["type"]
        for row in deps:
            if row[kind] == discovered.DISCOVERED_FROM and not any(
                old[0] == row[target] and old[2] == row[kind]
                for old in old_deps.get(row[issue], ())
            ):
                self.discovered_edges.append((row[issue], row[target]))

    def _convoys(self, batch: Sequence[tuple[int, Record]]) -> None:
        existing = Convoy.objects.in_bulk([r["id"] for _, r in batch])
        events: list[EventItem] = []
        for _, record in batch:
            values = beadfile.bead_values(record, self.now)
            fields, text = convoy_fields.split_description(values["description"])
            notified = fields.get("completion_notified_at")
            extra = beadfile.unknown_keys(record, CONVOY_KEYS)
            beadfile.keep_texts(values, extra)
            for name in beadfile.BEAD_TIMESTAMPS:
                if isinstance(values[name], str):
                    values[name] = parse_timestamp(values[name])
            extra["convoy_fields"] = {
                k: v for k, v in fields.items() if k in ("watchers", "nudge_watchers")
            }
            tracks: list[dict[str, Any]] = []
            others: list[dict[str, Any]] = []
            for dep in record.get("dependencies") or []:
                (tracks if (dep.get("type") or "blocks") == "tracks" else others).append(dep)
            if others:
                extra["other_dependencies"] = others
            convoy = existing.get(record["id"]) or Convoy(id=record["id"])
            is_new = convoy.pk not in existing
            before = None if is_new else self._convoy_state(convoy)
            convoy.title = values["title"]
            convoy.description = text
            convoy.status = values["status"]
            convoy.owner = fields.get("owner") or ""
            convoy.notify = fields.get("notify") or ""
            convoy.merge_strategy = fields.get("merge") or ""
            convoy.base_branch = fields.get("base_branch") or ""
            convoy.molecule = fields.get("molecule") or ""
            convoy.labels = values["labels"]
            convoy.owned = "gt:owned" in values["labels"]
            convoy.created_by = values["created_by"]
            convoy.created_at = values["created_at"]
            convoy.updated_at = values["updated_at"]
            convoy.closed_at = values["closed_at"]
            convoy.close_reason = values["close_reason"]
            convoy.completion_notified_at = parse_timestamp(notified) if notified else None
            convoy.extra = extra
            rows: list[TrackedBead] = []
            seen: set[str] = set()
            for position, dep in enumerate(tracks):
                raw = dep["depends_on_id"].strip()
                target = unwrap_external(raw)
                if target in seen:
                    continue
                seen.add(target)
                dep_extra = {
                    k: v for k, v in dep.items() if k not in ("issue_id", "depends_on_id", "type")
                }
                rows.append(
                    TrackedBead(
                        convoy=convoy,
                        bead_id=target,
                        position=position,
                        raw_target=raw if raw != target else "",
                        extra=dep_extra,
                    )
                )
            if before is not None and before == self._convoy_state(convoy, rows):
                self.report.convoys_unchanged += 1
                continue
            convoy.save()
            TrackedBead.objects.filter(convoy=convoy).delete()
            TrackedBead.objects.bulk_create(rows)
            self.report.tracked += len(rows)
            if is_new:
                self.report.convoys_created += 1
            else:
                self.report.convoys_updated += 1
            events.append(
                dict(
                    kind="convoy.imported",
                    convoy_id=convoy.id,
                    actor=self.actor,
                    data={"status": convoy.status, "title": convoy.title, "tracked": len(rows)},
                )
            )
        self.report.events += len(record_many(events))

    def memories(self, memories: Sequence[MemoryLine]) -> None:
        """Memory lines, kept to be exported again (the last line of a key wins, as in bd)."""
        lines = {memory.key: memory for memory in memories}
        stored = dict(Memory.objects.filter(key__in=list(lines)).values_list("key", "line"))
        Memory.objects.bulk_create(
            [
                Memory(key=memory.key, value=memory.value, line=memory.line)
                for key, memory in lines.items()
                if stored.get(key) != memory.line
            ],
            update_conflicts=True,
            unique_fields=["key"],
            update_fields=["value", "line"],
        )
        self.report.memories += len(memories)

    @staticmethod
    def _convoy_state(
        convoy: Convoy, rows: Sequence[TrackedBead] | None = None
    ) -> tuple[list[Any], list[tuple[str, str, int, Any]]]:
        names = (
            "title",
            "description",
            "status",
            "owner",
            "notify",
            "merge_strategy",
            "base_branch",
            "molecule",
            "labels",
            "owned",
            "created_by",
            "created_at",
            "updated_at",
            "closed_at",
            "close_reason",
            "completion_notified_at",
            "extra",
        )
        if rows is None:
            rows = list(convoy.tracked.all())
        return (
            [getattr(convoy, n) for n in names],
            [(r.bead_id, r.raw_target, r.position, r.extra) for r in rows],
        )


def prepare(record: Record, routes: Mapping[str, str | None], now: datetime) -> PreparedBead:
    """A bead record's stored row and its dependencies' stored rows."""
    values = beadfile.bead_values(record, now)
    values["id"] = record["id"]
    values["extra"] = extra = beadfile.unknown_keys(record)
    beadfile.keep_texts(values, extra)
    values["rig_id"] = rig_for(record["id"], routes)
    dependencies = bulk.table(Dependency).row
    return bulk.table(Bead).row(values), [
        dependencies(dep) for dep in beadfile.dependency_values(record)
    ]
