"""bd JSONL records (one issue per line, as `bd export` writes them): reading and checking lines, and the column
values a record carries. No Django here: the import service (services/jsonl/) writes them.

A bad line raises BadLine with a one-line message naming the file, the line and the field.
Timestamps are checked here and stay text (RFC 3339, any offset, up to 9 fractional digits);
the store converts them once and keeps the text of those it could not write back the same
(`keep_texts`), so an export writes what came in (`export_timestamp`). `KEY_ORDER` and
`to_line` write a record as bd's Go encoder does.

One module, though long: reading a line and writing it back are one format, and each field's
check sits beside its column and its export so that a round trip stays exact.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from typing import IO, Any, NamedTuple, Never

import orjson

from convoys.core import convoy_fields, ids
from convoys.core.ids import unwrap_external

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
COUNTED = frozenset(("dependency_count", "dependent_count", "comment_count", "parent"))
COMPUTED = COUNTED | {"_type"}
BEAD_TIMESTAMPS = ("created_at", "updated_at", "closed_at")
# Kept in a row's `extra` for the export, never written as keys: what a timestamp's text has
# that its stored value lacks ("_created_at", ...: see kept_text), the shape of bd record it came in ("_shape"), a dependency without
# metadata ("_no_metadata"). A record may not bring them.
RESERVED_KEYS = frozenset(("_shape", "_no_metadata", *(f"_{name}" for name in BEAD_TIMESTAMPS)))
# Which computed keys bd wrote with the record: `bd list --json` (the Feb-2026 exports) adds
# the counts and `parent`; `bd export` since Apr 2026 adds `_type` and the counts, no parent.
SHAPE_LIST, SHAPE_EXPORT = "list", "export"

# The order in which bd writes an issue's keys: Go's encoding/json writes struct fields in
# declaration order. bd's Issue struct (internal/types/types.go) kept one relative order across
# versions; fields removed since (tombstone, HOP, slot, agent fields) stand where they stood.
# `bd export` writes `_type` first; IssueWithCounts adds the counts and `parent` last.
KEY_ORDER = (
    "_type",
    *("id", "title", "description", "design", "acceptance_criteria", "notes", "spec_id"),
    *("status", "priority", "issue_type", "assignee", "owner", "estimated_minutes"),
    *("created_at", "created_by", "updated_at", "started_at", "closed_at", "close_reason"),
    *("closed_by_session", "due_at", "defer_until", "external_ref", "source_system", "metadata"),
    *("compaction_level", "compacted_at", "compacted_at_commit", "original_size"),
    *("labels", "dependencies", "comments"),
    *("deleted_at", "deleted_by", "delete_reason", "original_type"),
    *("sender", "ephemeral", "no_history", "wisp_type", "pinned", "is_template", "bonded_from"),
    *("creator", "validations", "quality_score", "crystallizes"),
    *("await_type", "await_id", "timeout", "waiters", "holder"),
    *("source_formula", "source_location"),
    *("hook_bead", "role_bead", "agent_state", "last_activity", "role_type", "rig"),
    *("mol_type", "work_type", "event_kind", "actor", "target", "payload"),
    *("dependency_count", "dependent_count", "comment_count", "parent"),
)
DEPENDENCY_ORDER = (
    *("issue_id", "depends_on_id", "type", "created_at", "created_by", "metadata", "thread_id"),
)
COMMENT_ORDER = ("id", "issue_id", "author", "text", "created_at")
KEY_POSITION = {name: index for index, name in enumerate(KEY_ORDER)}
# Keys bd does not write (another tool's) follow bd's own, before the computed ones.
UNKNOWN_POSITION = KEY_POSITION["dependency_count"] - 0.5
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


def json_problem(exc: ValueError) -> str:
    """The JSON parser's complaint placed in the line ("line 2 column 1" of one line read
    as a second line of the file)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at character {exc.pos + 1}"
    return str(exc)


Record = dict[str, Any]  # one line of a bd JSONL file, as parsed


class BadLine(ValueError):
    """A line that is not a valid record; the message names the file, the line and why."""


def parse_timestamp(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)  # RFC 3339, "Z", up to 9 fractional digits
    if parsed.tzinfo is None:
        raise ValueError("timestamp has no time zone")
    if not 1 < parsed.year < 9999:
        try:
            parsed.astimezone(UTC)  # it is stored in UTC, which must exist
        except OverflowError:
            raise ValueError("timestamp out of range in UTC")
    return parsed


def format_timestamp(value: datetime | None, zone: tzinfo = UTC) -> str | None:
    """RFC 3339 as Go writes a time (time.RFC3339Nano): no trailing zeros in the fraction,
    "Z" for a zero offset. In UTC, or in `zone` (the offset of the text it replaces)."""
    if value is None:
        return None
    try:
        local = value.astimezone(zone)
    except OverflowError:  # the time has no equivalent in that offset
        local = value.astimezone(UTC)
    text = local.replace(tzinfo=None).isoformat()
    if local.microsecond:
        text = text.rstrip("0")
    offset = local.utcoffset()
    if not offset:
        return text + "Z"
    minutes = offset // timedelta(minutes=1)
    sign = "-" if minutes < 0 else "+"
    return f"{text}{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def export_timestamp(value: datetime | None, kept: str | None = None) -> str | None:
    """A stored timestamp as an export writes it, from what the import kept of its text
    (`kept_text`): that text while it still says the stored time (to the microsecond; its
    nanoseconds and offset as they came); else Go's RFC 3339 in that text's offset, or in UTC
    (nothing kept: the time came in Go's UTC form, or was made here)."""
    if value is None:
        return None
    text, zone = _text_of(value, kept) if kept else (None, UTC)
    if text is not None and _parsed(text) == value:
        return text
    return format_timestamp(value, zone)


def _text_of(value: datetime, kept: str) -> tuple[str | None, tzinfo]:
    """(the imported text, were it of `value`; its zone) from a whole text or a tail.
    (A parsed time always has a zone: `parse_timestamp` refuses a naive one.)"""
    if kept[0].isdigit():
        parsed = _parsed(kept)
        return kept, (parsed.tzinfo or UTC) if parsed else UTC
    parsed = _parsed("2000-01-01T00:00:00" + kept)
    if parsed is None:
        return None, UTC
    try:
        local = value.astimezone(parsed.tzinfo)
    except OverflowError:
        return None, UTC
    return local.replace(tzinfo=None).isoformat()[:19] + kept, parsed.tzinfo or UTC


def _parsed(text: str) -> datetime | None:
    try:
        return parse_timestamp(text)
    except ValueError:
        return None


def kept_text(text: str) -> str | None:
    """What the import keeps of a (checked) timestamp's text beside its stored value, for the
    export to write it back: nothing when the value gives it back (Go's UTC form: "Z", 0 to 6
    fractional digits, no trailing zero); the tail after the seconds (fraction and offset as
    written) when the rest is the plain date and time, which the value gives back in that
    offset; else the whole text. String tests only: this runs for every time of a file."""
    if len(text) < 20 or text[10] != "T" or text[7] != "-" or text[13] != ":" or text[16] != ":":
        return text
    tail = text[19:]
    if tail == "Z" or (tail[0] == "." and tail[-1] == "Z" and len(tail) <= 8 and tail[-2] != "0"):
        return None
    return tail


def keep_texts(values: Mapping[str, Any], extra: dict[str, Any]) -> None:
    """Note in `extra` (as `_created_at`, ...) what the export needs of each timestamp text
    in `values` to write it back as it came (`kept_text`)."""
    text = values["created_at"]
    if type(text) is str and (kept := kept_text(text)) is not None:
        extra["_created_at"] = kept
    text = values["updated_at"]
    if type(text) is str and (kept := kept_text(text)) is not None:
        extra["_updated_at"] = kept
    text = values["closed_at"]
    if type(text) is str and (kept := kept_text(text)) is not None:
        extra["_closed_at"] = kept


def _reject_constant(name: str) -> Never:
    raise ValueError(f"{name} is not valid JSON")


def _kind(value: object) -> str:
    return {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        list: "array",
        dict: "object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


CONVOY_STATUSES = ("open", "closed", "staged_ready", "staged_warnings")
KNOWN_DEP_KEYS = frozenset(
    ("issue_id", "depends_on_id", "type", "created_at", "created_by", "metadata")
)


def _check(record: Record) -> None:
    """Validate one record's shape; raise ValueError naming the field.

    Timestamps stay text (checked here, converted once where they are stored). The loop runs
    over the record's own keys: this is the importer's hottest function."""
    bead_id = record.get("id")
    if bead_id is None:
        raise ValueError("missing required field 'id'")
    if not isinstance(bead_id, str) or not bead_id.strip():
        raise ValueError(f"field 'id': expected a non-empty string, got {_kind(bead_id)}")
    convoy = is_convoy_record(record)
    problem = ids.convoy_id_problem(bead_id) if convoy else ids.id_problem(bead_id)
    if problem:
        raise ValueError(f"field 'id': {'convoy ' if convoy else ''}id {problem}")
    for name, value in record.items():
        check = FIELD_CHECKS.get(name)
        if check is not None:
            check(record, name, value)
    if convoy and skipped(record) is None:  # bd import skips tombstones and wisps unread
        _check_convoy(record)


def _check_convoy(record: Record) -> None:
    """What only a convoy needs: a status the lifecycle can move, and readable field lines."""
    status = record.get("status") or "open"
    if status not in CONVOY_STATUSES:
        raise ValueError(
            f"field 'status': convoy status {status[:40]!r} is not one of "
            f"{', '.join(CONVOY_STATUSES)}"
        )
    fields, _ = convoy_fields.split_description(record.get("description") or "")
    notified = fields.get("completion_notified_at")
    if notified is not None:
        try:
            parse_timestamp(notified)
        except ValueError:
            raise ValueError(
                f"field 'description': completion_notified_at: invalid timestamp {notified[:40]!r}"
            )


def _string(record: Record, name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ValueError(f"field '{name}': expected string, got {_kind(value)}")


def _integer(record: Record, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"field '{name}': expected integer, got {_kind(value)}")


def _priority(record: Record, name: str, value: Any) -> None:
    _integer(record, name, value)
    if not 0 <= value <= 4:
        raise ValueError(f"field 'priority': expected 0..4, got {value}")


def _assignee(record: Record, name: str, value: Any) -> None:
    if value is not None:
        _string(record, name, value)
        problem = ids.name_problem(value)
        if problem:
            raise ValueError(f"field 'assignee': {problem}")


def _timestamp(record: Record, name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise ValueError(f"field '{name}': expected RFC 3339 timestamp, got {_kind(value)}")
    try:
        parse_timestamp(value)
    except ValueError:
        raise ValueError(f"field '{name}': invalid timestamp {value[:40]!r}")


def _count(record: Record, name: str, value: Any) -> None:
    _integer(record, name, value)
    if value < 0:
        raise ValueError(f"field '{name}': expected 0 or more, got {value}")


def _array(record: Record, name: str, value: Any) -> None:
    if value is not None and not isinstance(value, list):
        raise ValueError(f"field '{name}': expected array, got {_kind(value)}")


def _reserved(record: Record, name: str, value: Any) -> Never:
    raise ValueError(f"field '{name}': reserved for convoyweb's own bookkeeping")


def _labels(record: Record, name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError("field 'labels': expected an array of strings")


def _dependencies(record: Record, name: str, deps: Any) -> None:
    if deps is None:
        return
    if not isinstance(deps, list):
        raise ValueError(f"field 'dependencies': expected array, got {_kind(deps)}")
    for index, dep in enumerate(deps):
        if not isinstance(dep, dict):
            raise ValueError(f"field 'dependencies[{index}]': expected object, got {_kind(dep)}")
        if "_no_metadata" in dep or "_created_at" in dep:  # a dependency's kept keys
            name = "_no_metadata" if "_no_metadata" in dep else "_created_at"
            raise ValueError(
                f"field 'dependencies[{index}].{name}': reserved for convoyweb's own bookkeeping"
            )
        target = dep.get("depends_on_id")
        if not isinstance(target, str) or not target.strip():
            raise ValueError(
                f"field 'dependencies[{index}].depends_on_id': expected a non-empty string"
            )
        problem = ids.target_problem(target)
        if problem:
            raise ValueError(f"field 'dependencies[{index}].depends_on_id': {problem}")
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
    "assignee": _assignee,
    "priority": _priority,
    **dict.fromkeys(RESERVED_KEYS, _reserved),
    "labels": _labels,
    "dependencies": _dependencies,
    "comments": _array,
    "comment_count": _count,
}


def read_records(
    stream: IO[bytes], name: str, max_line: int, first: int = 1
) -> Iterator[tuple[int, Record | MemoryLine]]:
    """Yield (line number, record) for every non-blank line of a binary stream; raise BadLine
    on the first bad one. `first` numbers the stream's first line (a part of a file)."""
    number = first - 1
    while True:
        raw = stream.readline(max_line + 1)
        if not raw:
            return
        number += 1
        if len(raw) > max_line and not raw.endswith(b"\n"):
            raise BadLine(f"{name}:{number}: line is longer than {max_line} bytes")
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if raw.isspace():
            continue
        slow = False
        try:
            record = orjson.loads(raw)  # fast path; rejects what the slow path explains below
        except orjson.JSONDecodeError:
            record, slow = _parse_slowly(raw, name, number), True
        if not isinstance(record, dict):
            raise BadLine(f"{name}:{number}: expected a JSON object, got {_kind(record)}")
        if record.get("_type") == "memory":
            try:
                memory = _memory(record, raw)
                if slow or b"\\u0000" in raw:
                    _refuse_unstorable(record)
            except ValueError as exc:
                raise BadLine(f"{name}:{number}: {exc}")
            yield number, memory
            continue
        try:
            _check(record)
            # Cheap tests first: only such lines can hold a NUL or a lone surrogate (orjson
            # refuses those, the slow path does not).
            if slow or b"\\u0000" in raw:
                _refuse_unstorable(record)
        except ValueError as exc:
            raise BadLine(f"{name}:{number}: {exc}")
        except RecursionError:
            raise BadLine(f"{name}:{number}: nesting too deep")
        yield number, record


class MemoryLine(NamedTuple):
    """A `_type: "memory"` line (`bd remember`): its key, its value, and the line as it came,
    which the export writes again."""

    key: str
    value: str
    line: str


MEMORY_KEY_MAX = 255


def _memory(record: Record, raw: bytes) -> Record | MemoryLine:
    """A memory line as bd import reads it (key and value strings; one without either is
    skipped, so the record itself is returned for `skipped` to name)."""
    for field in ("key", "value"):
        value = record.get(field)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"field '{field}': expected string, got {_kind(value)}")
    key, value = record.get("key") or "", record.get("value") or ""
    if not key or not value:
        return record
    if len(key) > MEMORY_KEY_MAX:
        raise ValueError(f"field 'key': is {len(key)} characters long (at most {MEMORY_KEY_MAX})")
    return MemoryLine(key, value, raw.rstrip(b"\r\n").decode("utf-8"))


DEPENDENCY_POSITION = {name: index for index, name in enumerate(DEPENDENCY_ORDER)}
COMMENT_POSITION = {name: index for index, name in enumerate(COMMENT_ORDER)}


def in_bd_order(
    fields: Mapping[str, Any],
    position: Mapping[str, float] = KEY_POSITION,
    unknown: float = UNKNOWN_POSITION,
) -> dict[str, Any]:
    """`fields` with its keys in the order bd writes them (others keep theirs, after them)."""
    return {name: fields[name] for name in sorted(fields, key=lambda k: position.get(k, unknown))}


_GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def to_line(record: Mapping[str, Any]) -> str:
    """A record as one line of JSON the way Go's json.Marshal writes it (bd's encoder):
    compact, keys in the record's order, non-ASCII as it is, and <, >, &, U+2028 and U+2029
    escaped (its HTML-safe default)."""
    try:
        text = orjson.dumps(record).decode()
    except TypeError:  # integers beyond 64 bits, which the standard library writes
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    for char, escape in _GO_ESCAPES:
        if char in text:
            text = text.replace(char, escape)
    return text


def _refuse_unstorable(value: object, path: str = "") -> None:
    """PostgreSQL stores no NUL character in text or JSON, so no database takes one (a file
    that imports on one must import on the other); a lone surrogate is not UTF-8 at all."""
    if isinstance(value, str):
        problem = ids.text_problem(value)
        if problem:
            raise ValueError(f"field '{path}': {problem}")
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_unstorable(key, path or "(a key)")
            _refuse_unstorable(item, f"{path}.{ascii(key)[1:-1]}" if path else ascii(key)[1:-1])
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_unstorable(item, f"{path}[{index}]")


def _parse_slowly(raw: bytes, name: str, number: int) -> Any:
    """The standard library's parser: accepts what orjson refuses (integers beyond 64 bits,
    deep nesting) and names the problem precisely when the line really is bad."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadLine(
            f"{name}:{number}: invalid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
        )
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise BadLine(f"{name}:{number}: JSON nested too deeply")
    except ValueError as exc:
        if not raw.endswith(b"\n"):
            raise BadLine(f"{name}:{number}: truncated last line ({json_problem(exc)})")
        raise BadLine(f"{name}:{number}: invalid JSON ({json_problem(exc)})")


def is_convoy_record(record: Record) -> bool:
    return record.get("issue_type") == "convoy" or "gt:convoy" in (record.get("labels") or [])


def bead_values(record: Record, now: datetime) -> dict[str, Any]:
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


def unknown_keys(record: Record, known: frozenset[str] = BEAD_KEYS) -> dict[str, Any]:
    """The keys the product has no column for, kept to be written back on export; with the
    shape of record bd wrote when it added computed keys, and the comment_count when the
    comments themselves are not in the record (nothing here could count them then)."""
    unknown = record.keys() - known - COMPUTED
    extra = {k: v for k, v in record.items() if k in unknown} if unknown else {}
    if "_type" in record:
        extra["_shape"] = SHAPE_EXPORT
    elif "dependency_count" in record or "parent" in record or "comment_count" in record:
        extra["_shape"] = SHAPE_LIST
    if "comment_count" in record and "comments" not in record:
        extra["comment_count"] = record["comment_count"]
    return extra


def dependency_values(record: Record) -> list[dict[str, Any]]:
    """A bead's dependencies as column values (a repeated target keeps its first line)."""
    values, seen = [], set()
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
        created = get("created_at") or None
        if created is not None:
            kept = kept_text(created)
            if kept is not None:
                extra["_created_at"] = kept
        values.append(
            {
                "issue_id": issue_id,
                "depends_on_id": target,
                "raw_target": raw if raw != target else "",
                "type": get("type") or "blocks",
                "created_at": created,
                "created_by": get("created_by") or "",
                "metadata": metadata,
                "extra": extra,
            }
        )
    return values


def read_routes(stream: Iterable[bytes | str], name: str) -> Iterator[tuple[int, Record]]:
    for number, raw in enumerate(stream, start=1):
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError:
            raise BadLine(f"{name}:{number}: invalid UTF-8")
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        try:
            record = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            raise BadLine(f"{name}:{number}: invalid JSON ({json_problem(exc)})")
        if not isinstance(record, dict):
            raise BadLine(f"{name}:{number}: expected a JSON object")
        for key in ("prefix", "path"):
            if not isinstance(record.get(key), str) or not record[key].strip():
                raise BadLine(f"{name}:{number}: field '{key}': expected a non-empty string")
        for key, check in (("prefix", ids.route_prefix_problem), ("path", ids.route_path_problem)):
            problem = check(record[key])
            if problem:
                raise BadLine(f"{name}:{number}: field '{key}': {problem}")
        yield number, record


def skipped(record: Record) -> str | None:
    """Why `bd import` skips a record ("memories" without a key or a value, "tombstones" or
    "wisps"), or None."""
    if record.get("_type") == "memory":
        return "memories"
    if record.get("status") == "tombstone":
        return "tombstones"
    if record.get("ephemeral") is True or record.get("wisp") is True:
        return "wisps"
    return None


class SeenIds:
    """The ids read so far, each with its line, to refuse a duplicate with its first line.

    They are kept in a private temporary SQLite database (sqlite3 with an empty name: a file
    deleted on close, with a small page cache) and checked a batch at a time, so memory stays
    flat however long the file; a dict would hold ~130 bytes per id."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pending: dict[str, int] = {}
        self.db = sqlite3.connect("")
        self.db.execute("CREATE TABLE seen (id TEXT PRIMARY KEY, line INTEGER) WITHOUT ROWID")

    def add(self, bead_id: str, number: int) -> None:
        first = self.pending.setdefault(bead_id, number)
        if first != number:
            raise self._duplicate(bead_id, number, first)

    def check(self) -> None:
        """Refuse the first pending id seen in an earlier batch; keep the rest as seen."""
        pending, self.pending = self.pending, {}
        if not pending:
            return
        ids = list(pending)
        earlier: dict[str, int] = {}
        for start in range(0, len(ids), 900):
            part = ids[start : start + 900]
            marks = ", ".join("?" * len(part))
            query = f"SELECT id, line FROM seen WHERE id IN ({marks})"
            earlier.update(self.db.execute(query, part))
        if earlier:
            bead_id = min(earlier, key=pending.__getitem__)
            raise self._duplicate(bead_id, pending[bead_id], earlier[bead_id])
        self.db.executemany("INSERT INTO seen VALUES (?, ?)", pending.items())

    def _duplicate(self, bead_id: str, number: int, first: int) -> BadLine:
        return BadLine(f"{self.name}:{number}: duplicate id '{bead_id}' (first on line {first})")

    def close(self) -> None:
        self.db.close()
