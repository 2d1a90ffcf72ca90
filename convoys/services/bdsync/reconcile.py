"""What a pass writes of the records it read: the changed ones to the importer, claims kept.

Each record is compared by a digest of its content (computed counts left out: `updated_at`
from another clock is not trusted). A dispatch claim of ours (status hooked, a worker as
assignee) stands while the source shows those two fields as it did before the claim (a digest
of them per record, `claimed_digest`): its other fields are applied around the claim; a change
of either in bd wins. A record another source owned is taken (the newest source wins). A record
whose id is a bead or convoy made here (no SourcedRecord row and no import behind it) is not
taken: nothing is written for it, and the pass reports it as a conflict.
"""

import hashlib
import json
from typing import Any

import orjson

from convoys.core import beadfile
from convoys.core.beadfile import BadLine
from convoys.infra import bulk
from convoys.models import (
    Bead,
    Convoy,
    Dispatch,
    Event,
    SourcedRecord,
)
from convoys.services import jsonl
from convoys.services.bdsync.reader import Lines, checked_records

IGNORED_KEYS = beadfile.COUNTED  # recomputed by bd from other records: not this one's content


def digest(record: dict[str, Any]) -> str:
    """The content of a record, as 32 hex digits (key order and computed counts ignored)."""
    content = {k: v for k, v in record.items() if k not in IGNORED_KEYS}
    try:
        text = orjson.dumps(content, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers beyond 64 bits
        text = json.dumps(content, sort_keys=True).encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()


def claimed_digest(record: dict[str, Any]) -> str:
    """The fields a dispatch claim of ours writes as a record shows them (status, assignee;
    updated_at, the claim's third, moves with any change in bd), as 32 hex digits."""
    text = orjson.dumps([record.get("status") or "", record.get("assignee") or ""])
    return hashlib.blake2b(text, digest_size=16).hexdigest()


def reconcile_all(lines: Lines, importer: jsonl.Importer) -> None:
    """Check every line not known from an earlier pass; hand the records whose digest
    changed to the importer, and keep each read record's digest and line, a batch at a time."""
    pending: list[tuple[int, beadfile.Record]] = []
    memories: list[beadfile.MemoryLine] = []
    for number, record in checked_records(lines, memories):
        pending.append((number, record))
        if len(pending) >= jsonl.BATCH:
            reconcile_batch(lines, importer, pending)
            pending = []
    reconcile_batch(lines, importer, pending)
    if memories:
        importer.memories(memories)


def reconcile_batch(
    lines: Lines, importer: jsonl.Importer, pending: list[tuple[int, beadfile.Record]]
) -> None:
    """A batch of records read: the changed ones to the importer; every one's digest and
    line kept (an unchanged record read from a new line, key order say, keeps its new line).
    An id twice in the batch is refused here (one across batches, by `gone_ids`). A changed bead
    whose claimed fields the source still shows as it did keeps a dispatch claim of ours
    (`_keep_claims`); a record another source owned is taken, with an event (`_take`)."""
    if not pending:
        return
    ids = [record["id"] for _, record in pending]
    if len(set(ids)) < len(ids):
        first: dict[str, int] = {}
        for number, record in pending:
            seen = first.setdefault(record["id"], number)
            if seen != number:
                raise BadLine(
                    f"{lines.name}:{number}: duplicate id '{record['id']}' (first on line {seen})"
                )
    stored = {
        i: (source, digest, missing, claimed)
        for i, source, digest, missing, claimed in SourcedRecord.objects.filter(
            pk__in=ids
        ).values_list("id", "source", "digest", "missing_since", "claimed")
    }
    unowned = [i for i in ids if i not in stored]
    local = _made_here(unowned)
    batch: list[tuple[int, Any, Any]] = []
    rows: list[SourcedRecord] = []
    back: list[str] = []
    taken: list[tuple[str, str]] = []  # (id, the source that owned it)
    held: list[int] = []  # indexes in `batch` of beads whose claimed fields the source kept
    for number, record in pending:
        item_id = record["id"]
        line = lines.hashes.pop(number)
        if item_id in local:  # created here (or its source forgotten): stays local
            lines.conflicts.append(item_id)
            continue
        content = digest(record)
        convoy = beadfile.is_convoy_record(record)
        claimed = "" if convoy else claimed_digest(record)
        rows.append(
            SourcedRecord(id=item_id, source=lines.name, digest=content, line=line, claimed=claimed)
        )
        source, stored_digest, missing, stored_claimed = stored.get(item_id, (None,) * 4)
        if missing:
            back.append(item_id)
        if source is not None and source != lines.name:
            lines.taken.add(source)  # its memos no longer hold
            taken.append((item_id, source))
        if source != lines.name or missing:
            lines.gained.append(item_id)  # present for this source from now on
        if source == lines.name and stored_digest == content and not missing:
            continue
        if convoy:
            batch.append((number, record, None))
            continue
        if source == lines.name and not missing and stored_claimed == claimed:
            held.append(len(batch))
        batch.append((number, None, jsonl.prepare(record, importer.routes, importer.now)))
    lines.note([i for i in ids if i not in local])
    _keep_claims(batch, held)
    importer.add(batch)
    SourcedRecord.objects.bulk_create(
        rows,
        batch_size=jsonl.BATCH,
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["source", "digest", "line", "claimed"],
    )
    lines.back(back)
    lines.take(taken)


def _keep_claims(batch: list[tuple[int, Any, Any]], held: list[int]) -> None:
    """Changed beads of `batch` (at the indexes `held`) whose source still shows the fields a
    dispatch claim writes as it did before: where a claim of ours stands (the bead hooked by
    us, the source showing it otherwise), the claim's status and assignee are kept, and its
    updated_at when later than the source's; the source's other fields are applied. A source
    that changed one of those fields (bd hooked, closed or reassigned the bead) wins."""
    if not held:
        return
    table = bulk.table(Bead)
    at = table.index
    rows = {batch[i][2][0][at["id"]]: i for i in held}
    beads = {
        bead_id: (assignee, updated_at)
        for bead_id, assignee, updated_at in Bead.objects.filter(pk__in=list(rows), status="hooked")
        .exclude(assignee="")
        .values_list("id", "assignee", "updated_at")
    }
    ours = set(
        Dispatch.objects.filter(bead_id__in=list(beads)).order_by().values_list("bead_id", "worker")
    )
    for bead_id, index in rows.items():
        if bead_id not in beads or (bead_id, beads[bead_id][0]) not in ours:
            continue
        number, _, (row, deps) = batch[index]
        values = table.values(row)
        assignee, updated_at = beads[bead_id]
        if (values["status"], values["assignee"]) == ("hooked", assignee):
            continue  # the source shows our claim: nothing to keep
        values["status"], values["assignee"] = "hooked", assignee
        if values["updated_at"] is None or updated_at > values["updated_at"]:
            values["updated_at"] = updated_at
        batch[index] = (number, None, (table.row(values), deps))


def _made_here(ids: list[str]) -> set[str]:
    """Those of `ids` that are beads or convoys made in convoyweb (a page, the CLI, the API),
    owned by no source: they stay local. Records that came from bd (`beads import`, or a
    source since forgotten) are a source's to take: their creation event says "import"."""
    beads = set(Bead.objects.filter(pk__in=ids).values_list("id", flat=True))
    if beads:
        beads -= set(
            Event.objects.filter(
                kind="bead.created", bead_id__in=sorted(beads), data__source="import"
            ).values_list("bead_id", flat=True)
        )
    convoys = set(Convoy.objects.filter(pk__in=ids).values_list("id", flat=True))
    if convoys:
        convoys -= set(
            Event.objects.filter(kind="convoy.imported", convoy_id__in=sorted(convoys)).values_list(
                "convoy_id", flat=True
            )
        )
    return beads | convoys
