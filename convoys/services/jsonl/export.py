"""Exporting what bd writes: see the notes above `export_lines` for what may differ from the
imported file. Unknown keys kept in `extra` at import are exported unchanged.
"""

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TextIO

from django.db.models import Count

from convoys.core import beadfile, convoy_fields
from convoys.core.beadfile import (
    export_timestamp,
    format_timestamp,
)
from convoys.models import (
    Bead,
    Convoy,
    Dependency,
    Memory,
)

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
