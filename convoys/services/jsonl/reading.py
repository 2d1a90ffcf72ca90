"""Importing a bd JSONL file in one transaction: any bad line rolls everything back, and the
error names the file, the line and the problem (convoys/core/beadfile.py reads and checks the
lines). Memory holds one batch of records. Tombstones, wisps (ephemeral) and memory lines
without a key or a value are skipped, as `bd import` does. Large files are read and turned into
table rows in a forked child while this process writes them.
"""

import os
from collections.abc import Generator, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, cast

from django.conf import settings
from django.db import transaction

from convoys.core import beadfile
from convoys.core.beadfile import (
    BadLine,
    MemoryLine,
)
from convoys.core.dag import Node, build_dag, find_cycle
from convoys.infra import bulk, readahead
from convoys.log.events import settle
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    BLOCKING_DEP_TYPES,
    Bead,
    Dependency,
)
from convoys.rules.readiness import blocked_by
from convoys.services import discovered, merges
from convoys.services.jsonl.importer import (
    BATCH,
    Batch,
    BatchItem,
    Importer,
    ImportFailed,
    ImportReport,
    prepare,
)
from convoys.services.rigs import upsert_route

READ_AHEAD_MIN_BYTES = 1_000_000  # below this, a second process is not worth starting


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
    merges.from_store(actor=actor)  # the merge requests and merged closes it brought
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
