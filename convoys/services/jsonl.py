"""bd JSONL import and export.

Import streams the file in one transaction: any bad line rolls everything back, and the error
names the file, the line and the problem (convoys/core/beadfile.py reads and checks the lines).
Memory holds one batch of records. Unknown keys are kept in `extra` and exported unchanged;
memory lines (`_type: "memory"`) in the Memory table. Tombstones, wisps (ephemeral) and memory
lines without a key or a value are skipped, as `bd import` does. Large files are read and
turned into table rows in a forked child while this process writes them. The export writes
what bd writes: see the notes above `export_lines` for what may differ from the imported file.
"""

import os
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, TextIO, cast

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from convoys.core import beadfile, convoy_fields
from convoys.core.beadfile import (
    BadLine,
    MemoryLine,
    Record,
    export_timestamp,
    format_timestamp,
    parse_timestamp,
)
from convoys.core.dag import Node, build_dag, find_cycle
from convoys.core.ids import unwrap_external
from convoys.infra import bulk, readahead
from convoys.log import queue
from convoys.log.events import CLOSED, EventItem, record_many, settle
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    BLOCKING_DEP_TYPES,
    Bead,
    Convoy,
    Dependency,
    Memory,
    TrackedBead,
)
from convoys.rules.readiness import blocked_by
from convoys.services import discovered
from convoys.services.errors import ServiceError
from convoys.services.rigs import rig_for, route_map, upsert_route

BATCH = 1000
READ_AHEAD_MIN_BYTES = 1_000_000  # below this, a second process is not worth starting

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


def import_routes(stream: Iterable[bytes | str], name: str) -> int:
    """routes.jsonl lines -> routes and rigs. Returns the number of routes."""
    count = 0
    for _number, record in beadfile.read_routes(stream, name):
        upsert_route(record["prefix"], record["path"])
        count += 1
    return count


def import_file(
    path: str | Path, routes_path: str | Path | None = None, actor: str = "import"
) -> ImportReport:
    """Import a bd JSONL export (and optionally a routes.jsonl) atomically."""
    report = ImportReport(file=str(path))
    try:
        with transaction.atomic():
            if routes_path:
                with open(routes_path, "rb") as routes:
                    report.routes = import_routes(routes, str(routes_path))
            with open(path, "rb") as stream:
                read_ahead = os.fstat(stream.fileno()).st_size >= READ_AHEAD_MIN_BYTES
                import_stream(stream, str(path), report, actor, read_ahead=read_ahead)
            settle()  # the read model, in one pass over what the import appended
        report.warnings += rule_warnings()
    except BadLine as exc:
        raise ImportFailed(str(exc)) from None
    except OSError as exc:
        raise ImportFailed(f"{exc.filename}: {exc.strerror}")
    return report


def rule_warnings() -> list[str]:
    """What the store holds that a write here would refuse (services.beads's entry rules):
    an import keeps such records as they came and says so, in words that name them."""
    found = []
    unheld = list(
        Bead.objects.filter(status__in=ACTIVE_WORK_STATUSES, assignee="")
        .order_by("id")
        .values_list("id", flat=True)[:6]
    )
    if unheld:
        found.append(
            f"{_listed(unheld)}: hooked or in progress with nobody assigned (nothing moves "
            "them until a worker is assigned or they are reopened)"
        )
    closed = Bead.objects.filter(status="closed").values_list("pk", flat=True)
    early = sorted(blocked_by(closed))[:6]
    if early:
        found.append(f"{_listed(early)}: closed while a blocker is not done")
    edges = Dependency.objects.filter(type__in=BLOCKING_DEP_TYPES).values_list(
        "issue_id", "depends_on_id", "type"
    )
    rows = list(edges)
    graph = build_dag([Node(i) for i in {a for r in rows for a in r[:2]}], rows)
    loop = find_cycle(graph)
    if loop:
        found.append(f"a blocking cycle {' → '.join([*loop, loop[0]])}: staging refuses it")
    return found


def _listed(ids: Sequence[str], shown: int = 5) -> str:
    return ", ".join(ids[:shown]) + (" and more" if len(ids) > shown else "")


def import_stream(
    stream: IO[bytes],
    name: str,
    report: ImportReport,
    actor: str = "import",
    read_ahead: bool = False,
) -> ImportReport:
    """Import from an open binary stream; with `read_ahead`, records are parsed and converted
    in a child process while this one writes (see convoys/infra/readahead.py)."""
    importer = Importer(report, actor)
    args = (stream, name, importer.routes, importer.now, settings.CONVOY_IMPORT_MAX_LINE)
    batches: Generator[Batch, None, None]
    if read_ahead and readahead.available():
        for model in (Bead, Dependency):
            bulk.table(model)  # built once, before the fork, not once in each process
        # in_child is a generator function (closing it stops the child); its annotation
        # says only Iterator
        batches = cast(Generator[Batch, None, None], readahead.in_child(_batches, *args))
    else:
        batches = _batches(*args)
    try:
        for batch, memories, tally in batches:
            importer.add(batch)
            if memories:
                importer.memories(memories)
            for name_, count in tally.items():
                setattr(report, name_, count)
    except ChildProcessError as exc:  # killed (out of memory, say): say so in one line
        raise ImportFailed(f"{name}: {exc}; nothing was imported")
    finally:
        batches.close()  # a write failed: stop the read-ahead now, not when collected
    discovered.join(importer.discovered_edges, actor=actor)
    return report


def _batches(
    stream: IO[bytes],
    name: str,
    routes: Mapping[str, str | None],
    now: datetime,
    max_line: int,
) -> Generator[Batch, None, None]:
    """Validated records in batches of (line number, convoy record or None, prepared bead rows
    or None), each with the memory lines read since the last batch and the tally of lines read
    and skipped so far (the last batch may be empty, to carry the final tally)."""
    seen = beadfile.SeenIds(name)
    batch: list[BatchItem] = []
    memories: list[MemoryLine] = []
    tally = dict(lines=0, skipped_memories=0, skipped_tombstones=0, skipped_wisps=0)
    try:
        for number, record in beadfile.read_records(stream, name, max_line):
            tally["lines"] = number
            if isinstance(record, MemoryLine):
                memories.append(record)
                continue
            skipped = beadfile.skipped(record)
            if skipped:
                tally[f"skipped_{skipped}"] += 1
                continue
            seen.add(record["id"], number)
            if beadfile.is_convoy_record(record):
                batch.append((number, record, None))
            else:
                batch.append((number, None, prepare(record, routes, now)))
            if len(batch) >= BATCH:
                seen.check()
                yield batch, memories, dict(tally)
                batch, memories = [], []
        seen.check()
    except BadLine:
        seen.check()  # a duplicate on an earlier line of this batch is the first error
        raise
    finally:
        seen.close()
    yield batch, memories, tally


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


# --- export -----------------------------------------------------------------------------------
#
# The export writes what bd writes, so that importing a bd export and exporting it again gives
# the file back. What may still differ (tests/test_import_export.py checks the real files):
# - lines `bd import` skips are not imported, so not exported: tombstones, wisps (ephemeral),
#   memory lines without a key or a value;
# - a line not written by Go's encoder (e.g. through Python's json.dumps) comes back as Go
#   writes it: no spaces between tokens, non-ASCII as it is, <, >, &, U+2028, U+2029 escaped;
# - keys with an empty value ("", [], null, false; 0 for the counts never) are left out, as
#   Go's omitempty does (bd's files hold none);
# - a dependency's metadata given as a JSON object comes back as a string (bd's type);
# - on PostgreSQL, keys of objects nested in unknown fields (e.g. `metadata`) come back in
#   jsonb's order; bd's own nested records (dependencies, comments) keep bd's order.
# Line order is bd's: by id for files without computed keys (bd up to v0.49), else by
# priority, newest first, then id (bd's Dolt-era SearchIssues); memory lines last, by key.

EXPORT_CHUNK = 1000
NOT_WRITTEN = beadfile.RESERVED_KEYS | {"comment_count"}  # comment_count: see _counts
CONVOY_KEPT = NOT_WRITTEN | {"convoy_fields", "other_dependencies", "priority", "issue_type"}


def _plain(extra: Mapping[str, Any], hidden: frozenset[str] = NOT_WRITTEN) -> dict[str, Any]:
    return {k: v for k, v in extra.items() if k not in hidden}


def _dep_record(issue_id: str, dep: Dependency) -> dict[str, Any]:
    extra = dep.extra
    row: dict[str, Any] = {
        "issue_id": issue_id,
        "depends_on_id": dep.raw_target or dep.depends_on_id,
        "type": dep.type,
    }
    if dep.created_at:
        row["created_at"] = export_timestamp(dep.created_at, extra.get("_created_at"))
    if dep.created_by:
        row["created_by"] = dep.created_by
    if not extra.get("_no_metadata"):
        row["metadata"] = dep.metadata
    if extra:
        row.update(_plain(extra))
        row = beadfile.in_bd_order(row, beadfile.DEPENDENCY_POSITION, len(row))
    return row


def _ordered_nested(fields: dict[str, Any]) -> None:
    """bd's nested records in bd's key order (jsonb, on PostgreSQL, keeps its own)."""
    comments = fields.get("comments")
    if isinstance(comments, list):
        fields["comments"] = [
            beadfile.in_bd_order(c, beadfile.COMMENT_POSITION, len(c)) if isinstance(c, dict) else c
            for c in comments
        ]


def _counts(
    fields: dict[str, Any],
    item_id: str,
    extra: Mapping[str, Any],
    deps: Sequence[Mapping[str, Any]],
    shape: str,
    dependents: Mapping[str, int],
) -> None:
    """The computed keys bd writes for `shape`, from the stored rows: blocking dependencies
    and dependents (bd counts `blocks` edges only), comments (as kept, else the count that
    came with the record), and for `bd list --json`-shaped files the first parent."""
    if shape == beadfile.SHAPE_EXPORT:
        fields["_type"] = "issue"
    fields["dependency_count"] = sum(1 for d in deps if d.get("type") == "blocks")
    fields["dependent_count"] = dependents.get(item_id, 0)
    comments = extra.get("comments")
    kept = len(comments) if isinstance(comments, list) else extra.get("comment_count", 0)
    fields["comment_count"] = kept
    if shape == beadfile.SHAPE_LIST:
        parent = next((d["depends_on_id"] for d in deps if d.get("type") == "parent-child"), None)
        if parent:
            fields["parent"] = parent


def bead_record(
    bead: Bead,
    dependencies: Iterable[Dependency] | None = None,
    shape: str | None = None,
    dependents: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """A bead as bd writes it: keys in bd's order, timestamps as they came while unchanged,
    and for a `shape` with computed keys, those recomputed (`dependents`: {id: blocks edges
    pointing at it})."""
    if dependencies is None:
        dependencies = bead.dependencies.order_by("id")
    extra = bead.extra
    values: dict[str, Any] = {
        "id": bead.id,
        "title": bead.title,
        "description": bead.description,
        "status": bead.status,
        "priority": bead.priority,
        "issue_type": bead.issue_type,
        "assignee": bead.assignee,
        "owner": bead.owner,
        "created_at": export_timestamp(bead.created_at, extra.get("_created_at")),
        "created_by": bead.created_by,
        "updated_at": export_timestamp(bead.updated_at, extra.get("_updated_at")),
        "closed_at": export_timestamp(bead.closed_at, extra.get("_closed_at")),
        "close_reason": bead.close_reason,
        "labels": bead.labels,
    }
    fields = {k: v for k, v in values.items() if v not in ("", None, []) or k == "priority"}
    fields.update(_plain(extra))
    _ordered_nested(fields)
    deps = [_dep_record(bead.id, dep) for dep in dependencies]
    if deps:
        fields["dependencies"] = deps
    if shape:
        _counts(fields, bead.id, extra, deps, shape, dependents or {})
    return beadfile.in_bd_order(fields)


def convoy_record(
    convoy: Convoy, shape: str | None = None, dependents: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """A convoy as the bd record it is (a `convoy` bead tracking its beads), like bead_record."""
    extra = convoy.extra
    fields = dict(extra.get("convoy_fields", {}))
    fields.update(
        owner=convoy.owner,
        notify=convoy.notify,
        merge=convoy.merge_strategy,
        molecule=convoy.molecule,
        base_branch=convoy.base_branch,
        completion_notified_at=format_timestamp(convoy.completion_notified_at),
    )
    labels = list(convoy.labels)
    if convoy.owned and "gt:owned" not in labels:
        labels.append("gt:owned")
    values: dict[str, Any] = {
        "id": convoy.id,
        "title": convoy.title,
        "description": convoy_fields.join_description(convoy.description, fields),
        "status": convoy.status,
        "priority": extra.get("priority", 2),
        "issue_type": extra.get("issue_type", "convoy"),
        "created_at": export_timestamp(convoy.created_at, extra.get("_created_at")),
        "created_by": convoy.created_by,
        "updated_at": export_timestamp(convoy.updated_at, extra.get("_updated_at")),
        "closed_at": export_timestamp(convoy.closed_at, extra.get("_closed_at")),
        "close_reason": convoy.close_reason,
        "labels": labels,
    }
    record = {k: v for k, v in values.items() if v not in ("", None, []) or k == "priority"}
    record.update(_plain(extra, CONVOY_KEPT))
    _ordered_nested(record)
    deps = [
        {
            "issue_id": convoy.id,
            "depends_on_id": t.raw_target or t.bead_id,
            "type": "tracks",
            **t.extra,
        }
        for t in convoy.tracked.all()
    ]
    deps += extra.get("other_dependencies", [])
    deps = [beadfile.in_bd_order(d, beadfile.DEPENDENCY_POSITION, len(d)) for d in deps]
    if deps:
        record["dependencies"] = deps
    if shape:
        _counts(record, convoy.id, extra, deps, shape, dependents or {})
    return beadfile.in_bd_order(record)


def _store_shape() -> str | None:
    """The newest shape of bd record the stored beads came in (None: no computed keys)."""
    for shape in (beadfile.SHAPE_EXPORT, beadfile.SHAPE_LIST):
        if Bead.objects.filter(extra___shape=shape).exists():
            return shape
        if Convoy.objects.filter(extra___shape=shape).exists():
            return shape
    return None


def _line_order(shape: str | None) -> list[tuple[bool, str]]:
    """[(is a convoy, id)] in the order bd writes its lines."""
    rows: list[tuple[bool, str, int, datetime]] = [
        (False, *row) for row in Bead.objects.values_list("id", "priority", "created_at")
    ]
    for convoy_id, extra, created in Convoy.objects.values_list("id", "extra", "created_at"):
        rows.append((True, convoy_id, extra.get("priority", 2), created))
    if shape:
        rows.sort(key=lambda row: (row[2], -row[3].timestamp(), row[1]))
    else:
        rows.sort(key=lambda row: row[1])
    return [(row[0], row[1]) for row in rows]


def _dependents() -> dict[str, int]:
    """{id: blocks edges pointing at it, written as that id}, as bd counts dependents."""
    edges = Dependency.objects.filter(type="blocks", raw_target="")
    counted = edges.values("depends_on_id").annotate(n=Count("id"))
    return {row["depends_on_id"]: row["n"] for row in counted}


def export_lines() -> Iterator[str]:
    """Every stored bead and convoy, then every memory, as the lines of a bd export."""
    shape = _store_shape()
    dependents = _dependents() if shape else None
    order = _line_order(shape)
    for start in range(0, len(order), EXPORT_CHUNK):
        chunk = order[start : start + EXPORT_CHUNK]
        bead_ids = [item_id for is_convoy, item_id in chunk if not is_convoy]
        convoy_ids = [item_id for is_convoy, item_id in chunk if is_convoy]
        beads = Bead.objects.in_bulk(bead_ids)
        deps: dict[str, list[Dependency]] = {}
        for dep in Dependency.objects.filter(issue_id__in=bead_ids).order_by("id"):
            deps.setdefault(dep.issue_id, []).append(dep)
        convoys = Convoy.objects.prefetch_related("tracked").in_bulk(convoy_ids)
        for is_convoy, item_id in chunk:
            if is_convoy:
                record = convoy_record(convoys[item_id], shape, dependents)
            else:
                record = bead_record(beads[item_id], deps.get(item_id, ()), shape, dependents)
            yield beadfile.to_line(record)
    yield from (line for _, line in sorted(Memory.objects.values_list("key", "line")))


def export_to(stream: TextIO) -> int:
    """Write the export to a text stream; returns the number of lines."""
    count = 0
    for line in export_lines():
        stream.write(line + "\n")
        count += 1
    return count
