"""bd JSONL import and export.

Import streams the file in one transaction: any bad line rolls everything back, and the error
names the file, the line and the problem. Memory holds one batch of records (plus the set of
ids seen, to refuse duplicates). Unknown keys are kept in `extra` and exported unchanged.
Tombstones, wisps (ephemeral) and memory lines are skipped, as `bd import` does.
"""

import json
import os
import sqlite3
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

import orjson
from django.conf import settings
from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone

from .. import bulk, convoy_fields, readahead
from ..events import record_many
from ..models import Bead, Convoy, Dependency, TrackedBead, unwrap_external
from .errors import ServiceError
from .rigs import rig_for, route_map, upsert_route

BATCH = 1000
READ_AHEAD_MIN_BYTES = 1_000_000  # below this, a second process is not worth starting
BEAD_COLUMNS = (
    "title",
    "description",
    "status",
    "issue_type",
    "priority",
    "assignee",
    "owner",
    "labels",
    "close_reason",
    "created_by",
    "created_at",
    "updated_at",
    "closed_at",
)
BEAD_KEYS = frozenset(("id", "dependencies", *BEAD_COLUMNS))
COMPUTED = {"_type", "dependency_count", "dependent_count", "comment_count", "parent"}
STRING_FIELDS = (
    "id",
    "title",
    "description",
    "design",
    "acceptance_criteria",
    "notes",
    "status",
    "issue_type",
    "owner",
    "created_by",
    "close_reason",
    "external_ref",
)
TIMESTAMP_FIELDS = (
    "created_at",
    "updated_at",
    "closed_at",
    "started_at",
    "due_at",
    "defer_until",
    "deleted_at",
    "compacted_at",
)
EXPORT_ORDER = (
    "id",
    "title",
    "description",
    "status",
    "priority",
    "issue_type",
    "assignee",
    "owner",
    "created_at",
    "created_by",
    "updated_at",
    "closed_at",
    "close_reason",
    "labels",
)


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


def parse_timestamp(value):
    parsed = datetime.fromisoformat(value)  # RFC 3339, "Z", up to 9 fractional digits
    if parsed.tzinfo is None:
        raise ValueError("timestamp has no time zone")
    if not 1 < parsed.year < 9999:
        try:
            parsed.astimezone(UTC)  # it is stored in UTC, which must exist
        except OverflowError:
            raise ValueError("timestamp out of range in UTC")
    return parsed


def format_timestamp(value):
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def _kind(value):
    return {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        list: "array",
        dict: "object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


KNOWN_DEP_KEYS = frozenset(
    ("issue_id", "depends_on_id", "type", "created_at", "created_by", "metadata")
)


def _check(record):
    """Validate one record's shape; raise ValueError naming the field.

    Timestamps stay text (checked here, converted once where they are stored). The loop runs
    over the record's own keys: this is the importer's hottest function."""
    bead_id = record.get("id")
    if bead_id is None:
        raise ValueError("missing required field 'id'")
    if not isinstance(bead_id, str) or not bead_id.strip():
        raise ValueError(f"field 'id': expected a non-empty string, got {_kind(bead_id)}")
    for name, value in record.items():
        check = FIELD_CHECKS.get(name)
        if check is not None:
            check(record, name, value)


def _string(record, name, value):
    if not isinstance(value, str):
        raise ValueError(f"field '{name}': expected string, got {_kind(value)}")


def _optional_string(record, name, value):
    if value is not None:
        _string(record, name, value)


def _integer(record, name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"field '{name}': expected integer, got {_kind(value)}")


def _timestamp(record, name, value):
    if value is None:
        return
    if not isinstance(value, str):
        raise ValueError(f"field '{name}': expected RFC 3339 timestamp, got {_kind(value)}")
    try:
        parse_timestamp(value)
    except ValueError:
        raise ValueError(f"field '{name}': invalid timestamp {value[:40]!r}")


def _labels(record, name, value):
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError("field 'labels': expected an array of strings")


def _dependencies(record, name, deps):
    if deps is None:
        return
    if not isinstance(deps, list):
        raise ValueError(f"field 'dependencies': expected array, got {_kind(deps)}")
    for index, dep in enumerate(deps):
        if not isinstance(dep, dict):
            raise ValueError(f"field 'dependencies[{index}]': expected object, got {_kind(dep)}")
        target = dep.get("depends_on_id")
        if not isinstance(target, str) or not target.strip():
            raise ValueError(
                f"field 'dependencies[{index}].depends_on_id': expected a non-empty string"
            )
        kind = dep.get("type")
        if kind is not None and (not isinstance(kind, str) or len(kind) > 50):
            raise ValueError(
                f"field 'dependencies[{index}].type': expected a string of at most 50 characters"
            )
        created = dep.get("created_at")
        if created is not None:
            if not isinstance(created, str):
                raise ValueError(
                    f"field 'dependencies[{index}].created_at': expected RFC 3339 timestamp"
                )
            try:
                parse_timestamp(created)
            except ValueError:
                raise ValueError(f"field 'dependencies[{index}].created_at': invalid timestamp")


FIELD_CHECKS = {
    **dict.fromkeys(STRING_FIELDS, _string),
    **dict.fromkeys(TIMESTAMP_FIELDS, _timestamp),
    "assignee": _optional_string,
    "priority": _integer,
    "labels": _labels,
    "dependencies": _dependencies,
}


def read_records(stream, name, max_line=None):
    """Yield (line number, record) for every non-blank line; raise ImportFailed on the first bad one."""
    max_line = max_line or settings.CONVOY_IMPORT_MAX_LINE
    number = 0
    while True:
        raw = stream.readline(max_line + 1)
        if not raw:
            return
        number += 1
        if len(raw) > max_line and not raw.endswith(b"\n"):
            raise ImportFailed(f"{name}:{number}: line is longer than {max_line} bytes")
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if raw.isspace():
            continue
        try:
            record = orjson.loads(raw)  # fast path; rejects what the slow path explains below
        except orjson.JSONDecodeError:
            record = _parse_slowly(raw, name, number)
        if not isinstance(record, dict):
            raise ImportFailed(f"{name}:{number}: expected a JSON object, got {_kind(record)}")
        if record.get("_type") == "memory":
            yield number, record
            continue
        try:
            _check(record)
        except ValueError as exc:
            raise ImportFailed(f"{name}:{number}: {exc}")
        except RecursionError:
            raise ImportFailed(f"{name}:{number}: nesting too deep")
        yield number, record


def _parse_slowly(raw, name, number):
    """The standard library's parser: accepts what orjson refuses (integers beyond 64 bits,
    deep nesting) and names the problem precisely when the line really is bad."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ImportFailed(
            f"{name}:{number}: invalid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
        )
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ImportFailed(f"{name}:{number}: JSON nested too deeply")
    except ValueError as exc:
        if not raw.endswith(b"\n"):
            raise ImportFailed(f"{name}:{number}: truncated last line ({exc})")
        raise ImportFailed(f"{name}:{number}: invalid JSON ({exc})")


def is_convoy_record(record):
    return record.get("issue_type") == "convoy" or "gt:convoy" in (record.get("labels") or [])


def _bead_values(record, now):
    """Column values. Timestamps may be (checked) RFC 3339 text, which bulk.Table converts."""
    created = record.get("created_at") or now
    updated = record.get("updated_at") or created
    status = record.get("status") or "open"
    closed = record.get("closed_at")
    if status == "closed" and closed is None:
        closed = updated
    return {
        "title": record.get("title") or "",
        "description": record.get("description") or "",
        "status": status,
        "issue_type": record.get("issue_type", "task") or "",
        "priority": record.get("priority", 2),
        "assignee": record.get("assignee") or "",
        "owner": record.get("owner") or "",
        "labels": list(record.get("labels") or []),
        "close_reason": record.get("close_reason") or "",
        "created_by": record.get("created_by") or "",
        "created_at": created,
        "updated_at": updated,
        "closed_at": closed,
    }


def _extra(record, known):
    unknown = record.keys() - known - COMPUTED
    return {k: v for k, v in record.items() if k in unknown} if unknown else {}


def _dep_rows(record, table):
    """Stored rows for a bead's dependencies (a repeated target keeps its first line)."""
    rows, seen = [], set()
    issue_id = record["id"]
    for dep in record.get("dependencies") or ():
        raw = dep["depends_on_id"].strip()
        target = unwrap_external(raw)
        if target in seen:
            continue
        seen.add(target)
        get = dep.get
        metadata = get("metadata", "")
        if not isinstance(metadata, str):
            metadata = json.dumps(metadata)
        unknown = dep.keys() - KNOWN_DEP_KEYS
        extra = {k: v for k, v in dep.items() if k in unknown} if unknown else {}
        if "metadata" not in dep:
            extra["_no_metadata"] = True
        created = get("created_at")
        rows.append(
            table.row(
                {
                    "issue_id": issue_id,
                    "depends_on_id": target,
                    "raw_target": raw if raw != target else "",
                    "type": get("type") or "blocks",
                    "created_at": created or None,
                    "created_by": get("created_by") or "",
                    "metadata": metadata,
                    "extra": extra,
                }
            )
        )
    return rows


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
        self.report.dependencies += sum(len(dep_rows) for _, dep_rows in batch)
        self.report.events += record_many(events, instances=False)

    def _convoys(self, batch):
        existing = Convoy.objects.in_bulk([r["id"] for _, r in batch])
        events = []
        for _, record in batch:
            values = _bead_values(record, self.now)
            for name in ("created_at", "updated_at", "closed_at"):
                if isinstance(values[name], str):
                    values[name] = parse_timestamp(values[name])
            fields, text = convoy_fields.split_description(values["description"])
            notified = fields.get("completion_notified_at")
            extra = _extra(
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
    for _number, record in read_routes(stream, name):
        upsert_route(record["prefix"], record["path"])
        count += 1
    return count


def read_routes(stream, name):
    for number, raw in enumerate(stream, start=1):
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError:
            raise ImportFailed(f"{name}:{number}: invalid UTF-8")
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        try:
            record = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            raise ImportFailed(f"{name}:{number}: invalid JSON ({exc})")
        if not isinstance(record, dict):
            raise ImportFailed(f"{name}:{number}: expected a JSON object")
        for key in ("prefix", "path"):
            if not isinstance(record.get(key), str) or not record[key].strip():
                raise ImportFailed(f"{name}:{number}: field '{key}': expected a non-empty string")
        if not record["prefix"].endswith("-"):
            raise ImportFailed(f"{name}:{number}: field 'prefix': must end with '-'")
        yield number, record


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
    except OSError as exc:
        raise ImportFailed(f"{exc.filename}: {exc.strerror}")
    return report


def import_stream(stream, name, report, actor="import", read_ahead=False):
    """Import from an open binary stream; with `read_ahead`, records are parsed and converted
    in a child process while this one writes (see convoys/readahead.py)."""
    importer = _Importer(report, actor)
    args = (stream, name, importer.routes, importer.now)
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
    return report


def _batches(stream, name, routes, now):
    """Validated records in batches of (line number, convoy record or None, prepared bead rows
    or None), each with the tally of lines read and skipped so far (the last batch may be
    empty, to carry the final tally)."""
    seen = _SeenIds(name)
    batch = []
    tally = dict(lines=0, skipped_memories=0, skipped_tombstones=0, skipped_wisps=0)
    try:
        for number, record in read_records(stream, name):
            tally["lines"] = number
            if record.get("_type") == "memory":
                tally["skipped_memories"] += 1
                continue
            if record.get("status") == "tombstone":
                tally["skipped_tombstones"] += 1
                continue
            if record.get("ephemeral") is True or record.get("wisp") is True:
                tally["skipped_wisps"] += 1
                continue
            seen.add(record["id"], number)
            if is_convoy_record(record):
                batch.append((number, record, None))
            else:
                batch.append((number, None, _prepare(record, routes, now)))
            if len(batch) >= BATCH:
                seen.check()
                yield batch, dict(tally)
                batch = []
        seen.check()
    except ImportFailed:
        seen.check()  # a duplicate on an earlier line of this batch is the first error
        raise
    finally:
        seen.close()
    yield batch, tally


class _SeenIds:
    """The ids read so far, each with its line, to refuse a duplicate with its first line.

    They are kept in a private temporary SQLite database (sqlite3 with an empty name: a file
    deleted on close, with a small page cache) and checked a batch at a time, so memory stays
    flat however long the file; a dict would hold ~130 bytes per id."""

    def __init__(self, name):
        self.name = name
        self.pending = {}
        self.db = sqlite3.connect("")
        self.db.execute("CREATE TABLE seen (id TEXT PRIMARY KEY, line INTEGER) WITHOUT ROWID")

    def add(self, bead_id, number):
        first = self.pending.setdefault(bead_id, number)
        if first != number:
            raise self._duplicate(bead_id, number, first)

    def check(self):
        """Refuse the first pending id seen in an earlier batch; keep the rest as seen."""
        pending, self.pending = self.pending, {}
        if not pending:
            return
        ids = list(pending)
        earlier = {}
        for start in range(0, len(ids), 900):
            part = ids[start : start + 900]
            marks = ", ".join("?" * len(part))
            query = f"SELECT id, line FROM seen WHERE id IN ({marks})"
            earlier.update(self.db.execute(query, part))
        if earlier:
            bead_id = min(earlier, key=pending.get)
            raise self._duplicate(bead_id, pending[bead_id], earlier[bead_id])
        self.db.executemany("INSERT INTO seen VALUES (?, ?)", pending.items())

    def _duplicate(self, bead_id, number, first):
        return ImportFailed(
            f"{self.name}:{number}: duplicate id '{bead_id}' (first on line {first})"
        )

    def close(self):
        self.db.close()


def _prepare(record, routes, now):
    """A bead record's stored row and its dependencies' stored rows."""
    values = _bead_values(record, now)
    values["id"] = record["id"]
    values["extra"] = _extra(record, BEAD_KEYS)
    values["rig_id"] = rig_for(record["id"], routes)
    return bulk.table(Bead).row(values), _dep_rows(record, bulk.table(Dependency))


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
