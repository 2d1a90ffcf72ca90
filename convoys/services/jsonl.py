"""bd JSONL import and export.

Import streams the file in one transaction: any bad line rolls everything back, and the error
names the file, the line and the problem (convoys/beadfile.py reads and checks the lines).
Memory holds one batch of records. Unknown keys are kept in `extra` and exported unchanged.
Tombstones, wisps (ephemeral) and memory lines are skipped, as `bd import` does. Large files
are read and turned into table rows in a forked child while this process writes them.
"""

import json
import os
from dataclasses import asdict, dataclass, field

from django.conf import settings
from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone

from .. import beadfile, bulk, convoy_fields, readahead
from ..beadfile import BadLine, format_timestamp, parse_timestamp, unwrap_external
from ..events import record_many
from ..models import Bead, Convoy, Dependency, TrackedBead
from . import discovered
from .errors import ServiceError
from .rigs import rig_for, route_map, upsert_route

BATCH = 1000
READ_AHEAD_MIN_BYTES = 1_000_000  # below this, a second process is not worth starting


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
    routes: int = 0
    events: int = 0
    warnings: list = field(default_factory=list)

    @property
    def beads(self):
        return self.beads_created + self.beads_updated + self.beads_unchanged

    @property
    def convoys(self):
        return self.convoys_created + self.convoys_updated + self.convoys_unchanged

    def as_dict(self):
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


def _dependency_keys(beads):
    """{bead id: its dependencies as comparable tuples, in the order they were written}."""
    keys = {}
    if beads:
        rows = Dependency.objects.filter(issue_id__in=list(beads)).order_by("id")
        for issue_id, *values in rows.values_list("issue_id", *DEPENDENCY_FIELDS):
            keys.setdefault(issue_id, []).append(tuple(values))
    return keys


def _dependency_keys_of(dep_rows):
    values = bulk.table(Dependency).values
    return [tuple(map(values(row).get, DEPENDENCY_FIELDS)) for row in dep_rows]


class _Importer:
    def __init__(self, report, actor):
        self.report = report
        self.actor = actor
        self.routes = route_map()
        self.now = timezone.now()
        self.discovered_edges = []  # new discovered-from edges: they join convoys at the end

    def add(self, batch):
        beads = [prepared for _, _, prepared in batch if prepared is not None]
        convoys = [(n, r) for n, r, _ in batch if r is not None]
        if beads:
            self._beads(beads)
        if convoys:
            self._convoys(convoys)

    def _beads(self, batch):
        """Insert new beads' stored rows as they are. Existing beads are compared field by
        field and dependency by dependency; only what changed is written, with its event."""
        table = bulk.table(Bead)
        at = table.index
        ids = [row[at["id"]] for row, _ in batch]
        existing = Bead.objects.in_bulk(bulk.existing_keys(Bead, ids))
        old_deps = _dependency_keys(existing)
        creates, updates, events, changed_fields = [], [], [], set()
        deps, replaced = [], []
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
                    kind = "bead.closed"
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
        self.report.events += record_many(events, instances=False)

    def _note_discovered(self, deps, old_deps):
        at = bulk.table(Dependency).index
        issue, target, kind = at["issue_id"], at["depends_on_id"], at["type"]
        for row in deps:
            if row[kind] == discovered.DISCOVERED_FROM and not any(
                old[0] == row[target] and old[2] == row[kind]
                for old in old_deps.get(row[issue], ())
            ):
                self.discovered_edges.append((row[issue], row[target]))

    def _convoys(self, batch):
        existing = Convoy.objects.in_bulk([r["id"] for _, r in batch])
        events = []
        for _, record in batch:
            values = beadfile.bead_values(record, self.now)
            for name in ("created_at", "updated_at", "closed_at"):
                if isinstance(values[name], str):
                    values[name] = parse_timestamp(values[name])
            fields, text = convoy_fields.split_description(values["description"])
            notified = fields.get("completion_notified_at")
            extra = beadfile.unknown_keys(
                record,
                {
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
                },
            )
            extra["convoy_fields"] = {
                k: v for k, v in fields.items() if k in ("watchers", "nudge_watchers")
            }
            tracks, others = [], []
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
            rows, seen = [], set()
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

    @staticmethod
    def _convoy_state(convoy, rows=None):
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


def import_routes(stream, name):
    """routes.jsonl lines -> routes and rigs. Returns the number of routes."""
    count = 0
    for _number, record in beadfile.read_routes(stream, name):
        upsert_route(record["prefix"], record["path"])
        count += 1
    return count


def import_file(path, routes_path=None, actor="import"):
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
    except BadLine as exc:
        raise ImportFailed(str(exc)) from None
    except OSError as exc:
        raise ImportFailed(f"{exc.filename}: {exc.strerror}")
    return report


def import_stream(stream, name, report, actor="import", read_ahead=False):
    """Import from an open binary stream; with `read_ahead`, records are parsed and converted
    in a child process while this one writes (see convoys/readahead.py)."""
    importer = _Importer(report, actor)
    args = (stream, name, importer.routes, importer.now, settings.CONVOY_IMPORT_MAX_LINE)
    if read_ahead and readahead.available():
        for model in (Bead, Dependency):
            bulk.table(model)  # built once, before the fork, not once in each process
        batches = readahead.in_child(_batches, *args)
    else:
        batches = _batches(*args)
    try:
        for batch, tally in batches:
            importer.add(batch)
            for name_, count in tally.items():
                setattr(report, name_, count)
    except ChildProcessError as exc:  # killed (out of memory, say): say so in one line
        raise ImportFailed(f"{name}: {exc}; nothing was imported")
    finally:
        batches.close()  # a write failed: stop the read-ahead now, not when collected
    discovered.join(importer.discovered_edges, actor=actor)
    return report


def _batches(stream, name, routes, now, max_line):
    """Validated records in batches of (line number, convoy record or None, prepared bead rows
    or None), each with the tally of lines read and skipped so far (the last batch may be
    empty, to carry the final tally)."""
    seen = beadfile.SeenIds(name)
    batch = []
    tally = dict(lines=0, skipped_memories=0, skipped_tombstones=0, skipped_wisps=0)
    try:
        for number, record in beadfile.read_records(stream, name, max_line):
            tally["lines"] = number
            skipped = beadfile.skipped(record)
            if skipped:
                tally[f"skipped_{skipped}"] += 1
                continue
            seen.add(record["id"], number)
            if beadfile.is_convoy_record(record):
                batch.append((number, record, None))
            else:
                batch.append((number, None, _prepare(record, routes, now)))
            if len(batch) >= BATCH:
                seen.check()
                yield batch, dict(tally)
                batch = []
        seen.check()
    except BadLine:
        seen.check()  # a duplicate on an earlier line of this batch is the first error
        raise
    finally:
        seen.close()
    yield batch, tally


def _prepare(record, routes, now):
    """A bead record's stored row and its dependencies' stored rows."""
    values = beadfile.bead_values(record, now)
    values["id"] = record["id"]
    values["extra"] = beadfile.unknown_keys(record)
    values["rig_id"] = rig_for(record["id"], routes)
    dependencies = bulk.table(Dependency).row
    return bulk.table(Bead).row(values), [
        dependencies(dep) for dep in beadfile.dependency_values(record)
    ]


# --- export -----------------------------------------------------------------------------------


def _dep_record(issue_id, dep):
    row = {
        "issue_id": issue_id,
        "depends_on_id": dep.raw_target or dep.depends_on_id,
        "type": dep.type,
    }
    if dep.created_at:
        row["created_at"] = format_timestamp(dep.created_at)
    if dep.created_by:
        row["created_by"] = dep.created_by
    extra = dict(dep.extra)
    if not extra.pop("_no_metadata", False):
        row["metadata"] = dep.metadata
    row.update(extra)
    return row


def bead_record(bead):
    values = {
        "id": bead.id,
        "title": bead.title,
        "description": bead.description,
        "status": bead.status,
        "priority": bead.priority,
        "issue_type": bead.issue_type,
        "assignee": bead.assignee,
        "owner": bead.owner,
        "created_at": format_timestamp(bead.created_at),
        "created_by": bead.created_by,
        "updated_at": format_timestamp(bead.updated_at),
        "closed_at": format_timestamp(bead.closed_at),
        "close_reason": bead.close_reason,
        "labels": bead.labels,
    }
    record = {k: v for k, v in values.items() if v not in ("", None, []) or k == "priority"}
    record.update(bead.extra)
    deps = [_dep_record(bead.id, dep) for dep in bead.dependencies.all()]
    if deps:
        record["dependencies"] = deps
    return record


def convoy_record(convoy):
    fields = dict(convoy.extra.get("convoy_fields", {}))
    fields.update(
        owner=convoy.owner,
        notify=convoy.notify,
        merge=convoy.merge_strategy,
        molecule=convoy.molecule,
        base_branch=convoy.base_branch,
        completion_notified_at=format_timestamp(convoy.completion_notified_at),
    )
    extra = {
        k: v for k, v in convoy.extra.items() if k not in ("convoy_fields", "other_dependencies")
    }
    labels = list(convoy.labels)
    if convoy.owned and "gt:owned" not in labels:
        labels.append("gt:owned")
    values = {
        "id": convoy.id,
        "title": convoy.title,
        "description": convoy_fields.join_description(convoy.description, fields),
        "status": convoy.status,
        "priority": extra.pop("priority", 2),
        "issue_type": extra.pop("issue_type", "convoy"),
        "created_at": format_timestamp(convoy.created_at),
        "created_by": convoy.created_by,
        "updated_at": format_timestamp(convoy.updated_at),
        "closed_at": format_timestamp(convoy.closed_at),
        "close_reason": convoy.close_reason,
        "labels": labels,
    }
    record = {k: v for k, v in values.items() if v not in ("", None, []) or k == "priority"}
    record.update(extra)
    deps = [
        {
            "issue_id": convoy.id,
            "depends_on_id": t.raw_target or t.bead_id,
            "type": "tracks",
            **t.extra,
        }
        for t in convoy.tracked.all()
    ]
    deps += convoy.extra.get("other_dependencies", [])
    if deps:
        record["dependencies"] = deps
    return record


def export_records():
    in_file_order = Prefetch("dependencies", queryset=Dependency.objects.order_by("id"))
    beads = Bead.objects.order_by("id").prefetch_related(in_file_order)
    for bead in beads.iterator(chunk_size=2000):
        yield bead_record(bead)
    for convoy in (
        Convoy.objects.order_by("id").prefetch_related("tracked").iterator(chunk_size=500)
    ):
        yield convoy_record(convoy)


def export_to(stream):
    count = 0
    for record in export_records():
        stream.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        count += 1
    return count
