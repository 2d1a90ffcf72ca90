"""A sync pass over one source, the passes of the configured sources, and forgetting one.

A pass first reads and checks the whole source writing nothing (so no write lock: on SQLite a
transaction takes it at its start, and feeding a close must not wait behind a pass), which ends
most passes; its writes then go in one transaction, with the lines it did not know (or, when
there are many, the source read again). A bad source (unreadable file, failing command, any bad
line) changes nothing and keeps the last good state. Its error is kept on the source's
SyncSource row and logged once per failure streak. A file source whose identity (device, inode,
size, modification time) is the one this process's last pass read, modified at least RACY_NS
before it, is not read at all.
"""

import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from convoys.core import beadfile
from convoys.core.beadfile import BadLine
from convoys.log.events import settle
from convoys.models import (
    Cursor,
    Memory,
    SourcedRecord,
    SyncMemo,
    SyncSource,
)
from convoys.services import discovered, jsonl, leases, merges
from convoys.services.bdsync.lease import LEASE_TTL, default_holder, lease_name, take_from_the_dead
from convoys.services.bdsync.memo import (
    MEMOS,
    RACY_NS,
    Memo,
    bump_token,
    current_token,
    encode_memo,
    load_memo,
    new_token,
    token_name,
)
from convoys.services.bdsync.presence import mark_missing, source_events
from convoys.services.bdsync.reader import Lines, checked_records, gone_ids
from convoys.services.bdsync.reconcile import reconcile_all, reconcile_batch
from convoys.services.bdsync.sources import NAME_MAX, Source, SyncFailed, configured, source_for
from convoys.services.errors import ServiceError

log = logging.getLogger("convoys.sync")


# Lines not known that a pass keeps from its first, write-free reading of the source; with
# more, it reads the source again inside its transaction.
SCAN_KEPT = 2 * jsonl.BATCH


CONFLICT_IDS = 10  # ids of local records with a source's id named in a pass's report


@dataclass
class SyncReport:
    source: str
    records: int = 0
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    missing: int = 0
    returned: int = 0
    taken: int = 0  # records another source owned until this pass (the newest source wins)
    taken_from: dict[str, int] = field(default_factory=dict)  # {that source: records}
    # Records whose id is a local bead or convoy (created here, or its source forgotten):
    # not taken, nothing written for them; their count and the first CONFLICT_IDS ids.
    conflicts: int = 0
    conflict_ids: list[str] = field(default_factory=list)
    events: int = 0
    seconds: float = 0.0

    @property
    def changed(self) -> int:
        """Records written: created, updated, marked missing or back."""
        return self.created + self.updated + self.missing + self.returned

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON fields (`beads sync --json`), `changed` included."""
        return {**asdict(self), "changed": self.changed}


def sync(
    source: Source,
    routes_path: str | os.PathLike[str] | None = None,
    holder: str | None = None,
    actor: str = "sync",
    quiet: bool = False,
) -> SyncReport | None:
    """One pass over `source` under its lease. Returns a SyncReport, or None when another
    holder is syncing that source now; raises SyncFailed (nothing written) for a bad source.
    `quiet`: the caller shows failures and conflicts itself (the command line), so they are
    not logged."""
    holder = holder or default_holder()
    lease = lease_name(source.name)
    if not leases.acquire(lease, holder, ttl=LEASE_TTL) and not take_from_the_dead(lease, holder):
        return None
    try:
        started = time.monotonic()
        try:
            report = _pass(source, routes_path, actor)
        except (SyncFailed, BadLine, ServiceError) as exc:
            failure = SyncFailed(str(exc))
            failure.first = _failed(source.name, failure, quiet)
            raise failure from None
        report.seconds = round(time.monotonic() - started, 3)
        _succeeded(source.name, report)
        if report.conflicts and not quiet:
            log.warning(
                "sync of %s: %d local beads with the same id, not taken: %s",
                source.name,
                report.conflicts,
                ", ".join(report.conflict_ids),
            )
        if not quiet:  # a pass that changed nothing is at DEBUG (one every interval)
            changed = report.changed or report.taken
            log.log(logging.INFO if changed else logging.DEBUG, "sync pass: %s", report)
        return report
    finally:
        leases.release(lease, holder)


def _pass(source: Source, routes_path: str | os.PathLike[str] | None, actor: str) -> SyncReport:
    """Read the source and write what changed (see the module's docstring); nothing written
    when it raises."""
    report = SyncReport(source=source.name)
    opened = time.time_ns()
    token = current_token(source.name)  # before reading: a write after it makes the memo kept stale
    if token is None:  # none set yet (a source new, or a database older than the token)
        token = new_token(source.name)
    memo = MEMOS.get(source.name)
    if memo is None or memo.token != token:
        memo = load_memo(source.name, token)  # the last good pass ran in another process
    stream = source.open()
    with stream:
        identity = source.identity(stream)
        if (
            memo
            and not routes_path
            and identity is not None
            and identity == memo.identity
            and _memories_stored(memo.memories())
        ):
            report.records = report.unchanged = memo.records  # the file as the last pass read it
            return report
        # First without a transaction (no write lock: SQLite takes it at BEGIN): most passes
        # find nothing to write and end here.
        lines = Lines(source.name, stream, actor, memo)
        found = _scan(lines)
        if found is not None and not routes_path and _nothing_to_write(lines, *found):
            report.records = report.unchanged = lines.count
            # Stored for other processes when what is stored is not this (a write, but rare:
            # the source changed and nothing to write, or the memo's first pass).
            store = memo is None or memo.chunks != lines.chunks
            _remember(source.name, lines, token, identity, opened, store)
            return report
        with transaction.atomic():
            now = current_token(source.name)
            if now != token:  # another source took a record of this one since: read afresh
                found, memo = None, None
                token = now if now is not None else new_token(source.name)
            lines = _write(report, source, stream, lines, found, memo, routes_path, actor)
            for other in sorted(lines.taken):
                new_token(other)
            written = bump_token(source.name, token)
            # No memo while local records share ids with the source: the next pass reads
            # their lines again (they are never stored as known) and reports them again.
            if written is not None and not report.conflicts:
                _remember(source.name, lines, written, identity, opened, store=True)
            else:  # taken from during the pass: what it read of the source may be stale
                MEMOS.pop(source.name, None)
            settle()  # the read model, in one pass over what the pass appended
    return report


def _remember(
    name: str,
    lines: "Lines",
    token: int,
    identity: tuple[int, ...] | None,
    opened: int,
    store: bool,
) -> None:
    """Keep this good pass's chunks of the source for the next pass of this process, and
    (`store`) of any process. Its file identity, for this process only, and only when the
    file was last modified RACY_NS before the pass opened it (so a change made as the pass
    read it cannot have kept the same modification time)."""
    if identity is not None and identity[-1] > opened - RACY_NS:
        identity = None
    memo = Memo(token, lines.chunks, identity, lines.count, (lines.count, lines.sum))
    MEMOS[name] = memo
    if store:
        SyncMemo.objects.update_or_create(
            source=name, defaults={"token": token, "chunks": encode_memo(memo)}
        )


def _memories_stored(memories: list[beadfile.MemoryLine]) -> bool:
    """Whether these memory lines are stored as they are."""
    if not memories:
        return True
    stored = dict(
        Memory.objects.filter(key__in=[m.key for m in memories]).values_list("key", "line")
    )
    return all(stored.get(m.key) == m.line for m in memories)


def _scan(
    lines: "Lines",
) -> tuple[list[tuple[int, beadfile.Record]], list[beadfile.MemoryLine]] | None:
    """Read and check the whole source, writing nothing: the records of the lines not known
    and the memory lines, or None when more than SCAN_KEPT lines are not known (a first
    pass, say: the pass then reads the source again as it writes)."""
    pending: list[tuple[int, beadfile.Record]] = []
    memories: list[beadfile.MemoryLine] = []
    for number, record in checked_records(lines, memories):
        pending.append((number, record))
        if len(pending) + len(memories) > SCAN_KEPT:
            return None
    return pending, memories


def _nothing_to_write(
    lines: "Lines",
    pending: list[tuple[int, beadfile.Record]],
    memories: list[beadfile.MemoryLine],
) -> bool:
    """True when the scan found every record line known, the memory lines stored as they
    are, and the records stored as present those read."""
    if pending or not _memories_stored(memories):
        return False
    return lines.present() == (lines.count, lines.sum)


def _write(
    report: SyncReport,
    source: Source,
    stream: IO[bytes],
    lines: "Lines",
    found: tuple[list[tuple[int, beadfile.Record]], list[beadfile.MemoryLine]] | None,
    memo: "Memo | None",
    routes_path: str | os.PathLike[str] | None,
    actor: str,
) -> "Lines":
    """The pass's writes, in its transaction: the records `_scan` found, or (`found` None)
    every line read again (chunks of `memo` skipped). Returns the lines that read the source
    (the scan's, or the second reading's)."""
    if routes_path:
        try:
            with open(routes_path, "rb") as routes:
                jsonl.import_routes(routes, str(routes_path))
        except OSError as exc:
            raise SyncFailed(f"{routes_path}: {exc.strerror}")
    imported = jsonl.ImportReport(file=source.name)
    importer = jsonl.Importer(imported, actor)
    if found is None:
        stream.seek(0)
        lines = Lines(source.name, stream, actor, memo)
        reconcile_all(lines, importer)
    else:
        pending, memories = found
        for start in range(0, len(pending), jsonl.BATCH):
            reconcile_batch(lines, importer, pending[start : start + jsonl.BATCH])
        if memories:
            importer.memories(memories)
    report.records = lines.count
    report.conflicts = len(lines.conflicts)
    report.conflict_ids = sorted(lines.conflicts)[:CONFLICT_IDS]
    discovered.join(importer.discovered_edges, actor=actor)
    if imported.beads_created or imported.beads_updated:
        merges.from_store(actor=actor)
    report.created = imported.beads_created + imported.convoys_created
    report.updated = imported.beads_updated + imported.convoys_updated
    report.unchanged = report.records - report.created - report.updated
    gone = gone_ids(lines, stream)
    if gone and not report.records:  # an empty export (bd run in the wrong place, a file
        # being rewritten) is a bad source, not a town whose every record went away
        raise SyncFailed(f"{source.name}: no records, where {len(gone)} were: nothing changed")
    report.missing, report.returned = len(gone), lines.returned
    report.taken_from = dict(sorted(lines.taken_from.items()))
    report.taken = sum(report.taken_from.values())
    for owner, count in report.taken_from.items():
        log.warning("sync of %s took %d records from %s", source.name, count, owner)
    gone_events = mark_missing(source.name, gone, timezone.now(), actor)
    report.events = imported.events + lines.events + gone_events
    return lines


def _failed(name: str, failure: SyncFailed, quiet: bool = False) -> bool:
    """Keep the error on the source's row; True when it starts a failure streak (then it is
    logged, unless `quiet`; later failures of the same streak are not). A source neither
    configured nor ever synced well (a one-off `beads sync SOURCE` that failed) gets no row."""
    if name not in configured():
        SyncSource.objects.filter(name=name, last_pass_at__isnull=True).delete()
        row = SyncSource.objects.filter(name=name).first()
        if row is None:
            if not quiet:
                log.error("sync failed, nothing changed: %s", failure)
            return True
    else:
        row, _ = SyncSource.objects.get_or_create(name=name)
    first = not row.error
    if first:
        if not quiet:
            log.error("sync failed, nothing changed: %s", failure)
        row.failing_since = timezone.now()
    row.error = str(failure)
    row.save(update_fields=["error", "failing_since"])
    return first


def _succeeded(name: str, report: SyncReport) -> None:
    """Keep a good pass on the source's row (and log the end of a failure streak)."""
    row, _ = SyncSource.objects.get_or_create(name=name)
    if row.error:
        log.info("sync of %s works again (failing since %s)", name, row.failing_since)
    row.last_pass_at = timezone.now()
    row.records, row.changed, row.taken = report.records, report.changed, report.taken
    row.conflicts, row.seconds = report.conflicts, report.seconds
    row.error, row.failing_since = "", None
    row.save()


def forget(name: str, actor: str = "sync", force: bool = False) -> tuple[int, int]:
    """Forget a source that is no longer configured: its records stay as they are and become
    local (editable here again, no longer owned by it), each with an event; its dashboard row,
    memo and token go. Returns (records made local, events). Refused (SyncFailed) for a
    source CONVOY_SYNC_SOURCES names, one not known, or one a pass is reading now; and,
    unless `force`, one a pass synced recently (within `recent()` seconds: a process with
    another configuration, a server, may still be syncing it)."""
    name = name.strip()
    if name in configured():
        raise SyncFailed(f"{name} is in CONVOY_SYNC_SOURCES: take it out before forgetting it")
    owned = SourcedRecord.objects.filter(source=name)
    row = SyncSource.objects.filter(name=name).first()
    if row is None and not owned.exists():
        raise SyncFailed(f"no sync source {name!r} to forget")
    if row is not None and row.last_pass_at is not None and not force:
        ago = (timezone.now() - row.last_pass_at).total_seconds()
        if ago < recent():
            raise SyncFailed(
                f"{name} was synced {max(int(ago), 0)} s ago by a running process: stop it "
                f"first, or wait {int(recent() - ago) + 1} s (or --force)"
            )
    holder, lease = default_holder(), lease_name(name)
    if not leases.acquire(lease, holder, ttl=LEASE_TTL) and not take_from_the_dead(lease, holder):
        raise SyncFailed(f"{name}: another process is syncing it now; try again")
    try:
        with transaction.atomic():
            ids = list(owned.values_list("id", flat=True))
            data = {"source": name, "source_forgotten": True, "changes": ["source"]}
            count = source_events(ids, actor, lambda _: data)
            owned.delete()
            SyncSource.objects.filter(name=name).delete()
            SyncMemo.objects.filter(source=name).delete()
            Cursor.objects.filter(name=token_name(name)).delete()
            settle()
        MEMOS.pop(name, None)
    finally:
        leases.release(lease, holder)
    log.info("forgot sync source %s: %d records are local now", name, len(ids))
    return len(ids), count


def recent() -> float:
    """Seconds since its last good pass within which a source may still be synced by a
    running process (`forget` refuses it): three intervals, at least a minute."""
    return max(3 * float(settings.CONVOY_SYNC_INTERVAL), 60.0)


def passes(
    sources: list[Source],
    routes_path: str | os.PathLike[str] | None = None,
    every: float | None = None,
    stop: threading.Event | None = None,
    quiet: bool = False,
) -> Iterator[tuple[Source, SyncReport | SyncFailed | None]]:
    """Sync each source once, or every `every` seconds until `stop` (a threading.Event) is
    set; yields (source, SyncReport, or None when another holder had it, or SyncFailed).
    `quiet`: failures and conflicts are not logged (see `sync`)."""
    stop = stop or threading.Event()
    holder = default_holder()
    while True:
        due = time.monotonic() + (every or 0)
        for source in sources:
            try:
                yield source, sync(source, routes_path, holder, quiet=quiet)
            except SyncFailed as failure:
                yield source, failure
        if every is None or stop.wait(max(due - time.monotonic(), 0)):
            return


def sync_configured() -> None:
    """One pass over each of CONVOY_SYNC_SOURCES (the task the cluster's ticker enqueues);
    a failing source is logged by `sync` and does not stop the others."""
    sources = []
    for spelling in settings.CONVOY_SYNC_SOURCES:
        try:
            sources.append(source_for(spelling))
        except SyncFailed as failure:
            _failed(spelling[:NAME_MAX], failure)
    for _source, _result in passes(sources):
        pass
