"""Continuous, incremental sync from bd (`manage.py beads sync`, the task cluster's ticker).

A source yields bd JSONL: a file, or the standard output of a command (`cmd:bd export`). A
pass reads the whole source, checks every line as the import does (convoys/beadfile.py), and
writes only the records whose content changed since the last pass (a digest per record,
computed counts left out: `updated_at` from another clock is not trusted). Changed records go
through the import service, which compares field by field and writes each change with its
event, so a close in bd is a `bead.closed` event that feeds the next bead as a local close
does. A record the source no longer has is never deleted: it is marked missing.

Most lines of a pass are the lines of the last one: each record's row keeps a hash of the line
it was last read from, and a line whose hash is stored (looked up a batch of lines at a time)
is handed to the checks blank (its line number kept), so an unchanged pass costs a hash per
line and a query per batch rather than a parse and a check, in any process.

A pass streams: it holds a batch of lines, not the source (a command's output is spooled to a
temporary file). Records the source no longer has are found by comparing the count and a hash
sum of the ids read with those of the records stored as present; only when they differ (a
record dropped, an id twice) is the source read again for its ids.

A pass first reads and checks the whole source writing nothing (so no write lock: on SQLite a
transaction takes it at its start, and feeding a close must not wait behind a pass), which
ends most passes; its writes then go in one transaction, with the lines it did not know (or,
when there are many, the source read again). A bad source (unreadable file, failing command,
any bad line) changes nothing and keeps the last good state. Its error is kept on the source's SyncSource
row and logged once per failure streak. A lease per source keeps two passes (two clusters, a
cluster and a command line) from running at once.
"""

import hashlib
import json
import logging
import os
import re
import shlex
import socket
import subprocess
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from datetime import timedelta

import orjson
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from .. import beadfile
from ..beadfile import BadLine
from ..events import record_many
from ..models import Bead, Convoy, Lease, Memory, SourcedRecord, SyncSource
from . import discovered, jsonl, leases
from .errors import ServiceError

log = logging.getLogger("convoys.sync")

NAME_MAX = SyncSource._meta.get_field("name").max_length
# A pass longer than this loses its lease to the next one (a pass is one transaction, so the
# lease cannot be renewed during it); a cluster killed mid-pass holds the source this long,
# unless the next pass runs on the same host (it sees the holder's process is gone).
LEASE_TTL = 180.0
STDERR_SHOWN = 500  # characters of a failing command's standard error kept in the error
IGNORED_KEYS = beadfile.COUNTED  # recomputed by bd from other records: not this one's content
# A record marked missing from its source, or back in it: its event (model, kind, id field).
PRESENCE_EVENTS = ((Bead, "bead.updated", "bead_id"), (Convoy, "convoy.updated", "convoy_id"))
ID_SUM_MASK = 2**64 - 1
# Lines not known that a pass keeps from its first, write-free reading of the source; with
# more, it reads the source again inside its transaction.
SCAN_KEPT = 2 * jsonl.BATCH
LEADING_ID = re.compile(rb'\{\s*"id"\s*:\s*"([^"\\]+)"')  # a line that starts with its id


class SyncFailed(ServiceError):
    """A pass that changed nothing: the message names the source and what was wrong.
    `first` tells whether it starts a failure streak (the only one logged)."""

    first = True


class Source(ABC):
    """Where bd JSONL comes from. A new kind of source is one subclass: a `name` (shown on the
    dashboard, at most NAME_MAX characters) and `open()`, a seekable binary stream of JSONL
    lines (a pass may read it twice) that raises SyncFailed when the source cannot be read."""

    name = ""

    @abstractmethod
    def open(self):
        """A binary stream of the source's JSONL lines."""


class FileSource(Source):
    def __init__(self, path):
        self.path = self.name = str(path)

    def open(self):
        try:
            return open(self.path, "rb")
        except OSError as exc:
            raise SyncFailed(f"{self.name}: {exc.strerror}")


class CommandSource(Source):
    """`cmd:<command line>`: the command's standard output, run without a shell."""

    def __init__(self, command, timeout=None):
        self.name = f"cmd:{command}"
        try:
            self.argv = shlex.split(command)
        except ValueError as exc:
            raise SyncFailed(f"{self.name}: {exc}")
        if not self.argv:
            raise SyncFailed("cmd: source names no command")
        self.timeout = timeout

    def open(self):
        timeout = self.timeout or settings.CONVOY_SYNC_TIMEOUT
        out = tempfile.TemporaryFile()  # noqa: SIM115 (returned open)
        try:
            done = subprocess.run(
                self.argv,
                stdout=out,  # a file, not memory: a pass reads it as it reads a file source
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            out.close()
            raise SyncFailed(f"{self.name}: no answer within {timeout:g} s")
        except OSError as exc:
            out.close()
            raise SyncFailed(f"{self.name}: cannot run {self.argv[0]!r}: {exc.strerror}")
        if done.returncode:
            out.close()
            stderr = done.stderr.decode("utf-8", "replace").strip()
            if len(stderr) > STDERR_SHOWN:
                stderr = "…" + stderr[-STDERR_SHOWN:]
            raise SyncFailed(
                f"{self.name}: exited with status {done.returncode}"
                + (f": {' / '.join(stderr.splitlines())}" if stderr else "")
            )
        out.seek(0)
        return out


def source_for(text):
    """A source from its spelling: `cmd:<command line>` or a file path."""
    text = (text or "").strip()
    if not text:
        raise SyncFailed("sync source must not be empty")
    if len(text) > NAME_MAX:
        raise SyncFailed(f"sync source is {len(text)} characters long (at most {NAME_MAX})")
    if text.startswith("cmd:"):
        return CommandSource(text[len("cmd:") :])
    return FileSource(text)


@dataclass
class SyncReport:
    source: str
    records: int = 0
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    missing: int = 0
    returned: int = 0
    events: int = 0
    seconds: float = 0.0

    @property
    def changed(self):
        return self.created + self.updated + self.missing + self.returned

    def as_dict(self):
        return {**asdict(self), "changed": self.changed}


def digest(record):
    """The content of a record, as 32 hex digits (key order and computed counts ignored)."""
    content = {k: v for k, v in record.items() if k not in IGNORED_KEYS}
    try:
        text = orjson.dumps(content, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers beyond 64 bits
        text = json.dumps(content, sort_keys=True).encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()


def default_holder():
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def _take_from_the_dead(lease, holder):
    """Take a source's lease from a holder on this host whose process is gone (a cluster
    killed mid-pass), rather than wait out LEASE_TTL; one conditional update, so of several
    takers one wins."""
    held = Lease.objects.filter(name=lease).values_list("holder", flat=True).first() or ""
    host, _, rest = held.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
        return False  # alive (or another's: PermissionError is an OSError too)
    except ProcessLookupError:
        pass
    except OSError:
        return False
    expires = timezone.now() + timedelta(seconds=LEASE_TTL)
    taken = Lease.objects.filter(name=lease, holder=held).update(holder=holder, expires_at=expires)
    if taken:
        log.warning("took the sync lease of %s from %s, which is gone", lease, held)
    return bool(taken)


def lease_name(source_name):
    return "sync:" + hashlib.blake2b(source_name.encode(), digest_size=16).hexdigest()


def sync(source, routes_path=None, holder=None, actor="sync"):
    """One pass over `source` under its lease. Returns a SyncReport, or None when another
    holder is syncing that source now; raises SyncFailed (nothing written) for a bad source."""
    holder = holder or default_holder()
    lease = lease_name(source.name)
    if not leases.acquire(lease, holder, ttl=LEASE_TTL) and not _take_from_the_dead(lease, holder):
        return None
    try:
        started = time.monotonic()
        try:
            report = _pass(source, routes_path, actor)
        except (SyncFailed, BadLine, ServiceError) as exc:
            failure = SyncFailed(str(exc))
            failure.first = _failed(source.name, failure)
            raise failure from None
        report.seconds = round(time.monotonic() - started, 3)
        _succeeded(source.name, report)
        log.debug("sync pass: %s", report)
        return report
    finally:
        leases.release(lease, holder)


def _pass(source, routes_path, actor):
    report = SyncReport(source=source.name)
    stream = source.open()
    with stream:
        # First without a transaction (no write lock: SQLite takes it at BEGIN): most passes
        # find nothing to write and end here.
        lines = _Lines(source.name, stream, actor)
        found = _scan(lines)
        if found is not None and not routes_path and _nothing_to_write(lines, *found):
            report.records = report.unchanged = lines.count
            return report
        with transaction.atomic():
            _write(report, source, stream, lines, found, routes_path, actor)
    return report


def _records(lines, memories):
    """The source's bead and convoy records as (line number, record), checked as the import
    checks them; memory lines are appended to `memories`, records the import skips dropped."""
    max_line = settings.CONVOY_IMPORT_MAX_LINE
    for number, record in beadfile.read_records(lines, lines.name, max_line):
        if type(record) is beadfile.MemoryLine or beadfile.skipped(record):
            lines.hashes.pop(number, None)
            if type(record) is beadfile.MemoryLine:
                memories.append(record)
            continue
        yield number, record


def _scan(lines):
    """Read and check the whole source, writing nothing: the records of the lines not known
    and the memory lines, or None when more than SCAN_KEPT lines are not known (a first
    pass, say: the pass then reads the source again as it writes)."""
    pending, memories = [], []
    for number, record in _records(lines, memories):
        pending.append((number, record))
        if len(pending) + len(memories) > SCAN_KEPT:
            return None
    return pending, memories


def _nothing_to_write(lines, pending, memories):
    if pending:
        return False
    stored = dict(
        Memory.objects.filter(key__in=[m.key for m in memories]).values_list("key", "line")
    )
    if any(stored.get(m.key) != m.line for m in memories):
        return False
    return _id_sum(_present_ids(lines.name)) == (lines.count, lines.sum)


def _write(report, source, stream, lines, found, routes_path, actor):
    """The pass's writes, in its transaction: the records `_scan` found, or (`found` None)
    every line read again."""
    if routes_path:
        try:
            with open(routes_path, "rb") as routes:
                jsonl.import_routes(routes, str(routes_path))
        except OSError as exc:
            raise SyncFailed(f"{routes_path}: {exc.strerror}")
    imported = jsonl.ImportReport(file=source.name)
    importer = jsonl._Importer(imported, actor)
    if found is None:
        stream.seek(0)
        lines = _Lines(source.name, stream, actor)
        _read(lines, importer)
    else:
        pending, memories = found
        for start in range(0, len(pending), jsonl.BATCH):
            _compare(lines, importer, pending[start : start + jsonl.BATCH])
        if memories:
            importer.memories(memories)
    report.records = lines.count
    discovered.join(importer.discovered_edges, actor=actor)
    report.created = imported.beads_created + imported.convoys_created
    report.updated = imported.beads_updated + imported.convoys_updated
    report.unchanged = report.records - report.created - report.updated
    gone = _gone(lines, stream)
    if gone and not report.records:  # an empty export (bd run in the wrong place, a file
        # being rewritten) is a bad source, not a town whose every record went away
        raise SyncFailed(f"{source.name}: no records, where {len(gone)} were: nothing changed")
    report.missing, report.returned = len(gone), lines.returned
    gone_events = _mark(source.name, gone, timezone.now(), actor)
    report.events = imported.events + lines.events + gone_events


def _present_ids(name):
    """The ids of the source's records stored as present, a chunk (list) at a time."""
    table = connection.ops.quote_name(SourcedRecord._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {table} WHERE source = %s AND missing_since IS NULL", [name]
        )
        while chunk := cursor.fetchmany(jsonl.BATCH * 5):
            yield [row[0] for row in chunk]


def _id_sum(chunks):
    """Count and sum (mod 2**64) of the hashes of the ids in `chunks` (lists of ids): equal
    for two id lists exactly when they hold the same ids, duplicates included (but for a
    2**-64 chance; Python's string hash is the same throughout one process)."""
    count = total = 0
    for ids in chunks:
        count += len(ids)
        total = (total + sum(map(hash, ids))) & ID_SUM_MASK
    return count, total


class _Lines:
    """The source's stream as `beadfile.read_records` reads it, BATCH lines looked up at a
    time: a line whose hash is stored as the line a record of this source was last read from
    is handed on blank (the checks skip it, its line number stays); its record is present and
    unchanged. Keeps the count and the hash sum (`_id_sum`) of the ids present, and no more."""

    def __init__(self, name, stream, actor):
        self.name, self.stream, self.actor = name, stream, actor
        self.number = 0
        self.ahead = []  # (raw line, its hash or None when known)
        self.hashes = {}  # line number -> hash, of the lines handed on to be read
        self.count = self.sum = 0
        self.returned = self.events = 0

    def readline(self, size=-1):
        if not self.ahead:
            self._look_ahead(size)
            if not self.ahead:
                return b""
        raw, key = self.ahead.pop()
        self.number += 1
        if key is None:
            return b"\n"
        if not raw.isspace():
            self.hashes[self.number] = key
        return raw

    def _look_ahead(self, size):
        raws = []
        while len(raws) < jsonl.BATCH:
            raw = self.stream.readline(size)
            if not raw:
                break
            raws.append(raw)
        if not raws:
            return
        keys = [hashlib.blake2b(raw, digest_size=16).hexdigest() for raw in raws]
        # A line that starts with its id (bd writes it first) is looked up by that id: a
        # source's ids come roughly in order, so the lookups walk the primary key's index
        # rather than jump about a hash index (what made a 500,000-bead pass 12x a 100,000
        # one). Other lines are looked up by their hash.
        leading = [LEADING_ID.match(raw) for raw in raws]
        by_id = {
            m[1].decode(errors="replace"): key for m, key in zip(leading, keys, strict=True) if m
        }
        by_line = {key for m, key in zip(leading, keys, strict=True) if not m}
        known = {}
        for key, item_id, source, missing in _stored(by_id, by_line):
            if source != self.name or not (by_id.get(item_id) == key or key in by_line):
                continue
            if missing:  # read in full: it may have been edited here while it was missing
                continue
            known[key] = item_id
        self.note([known[key] for key in keys if key in known])
        self.ahead = [
            (raw, None if key in known else key) for raw, key in zip(raws, keys, strict=True)
        ]
        self.ahead.reverse()

    def note(self, ids):
        count, total = _id_sum([ids])
        self.count += count
        self.sum = (self.sum + total) & ID_SUM_MASK

    def back(self, ids):
        """Records marked missing that the source has again."""
        if ids:
            self.returned += len(ids)
            self.events += _mark(self.name, ids, None, self.actor)


def _stored(ids, lines):
    """(line, id, source, missing) of the stored records with one of these ids or last read
    from one of these lines: in SQL (the ORM's lookups cost more than the queries), each by
    one index alone (given the source too, SQLite may scan the source's index instead)."""
    table = connection.ops.quote_name(SourcedRecord._meta.db_table)
    rows = []
    with connection.cursor() as cursor:
        for column, values in (("id", sorted(ids)), ("line", list(lines))):
            if values:
                cursor.execute(
                    f"SELECT line, id, source, missing_since IS NOT NULL FROM {table} "
                    f"WHERE {column} IN ({', '.join(['%s'] * len(values))})",
                    values,
                )
                rows += cursor.fetchall()
    return rows


def _read(lines, importer):
    """Check every line not known from an earlier pass; hand the records whose digest
    changed to the importer, and keep each read record's digest and line, a batch at a time."""
    pending, memories = [], []
    for number, record in _records(lines, memories):
        pending.append((number, record))
        if len(pending) >= jsonl.BATCH:
            _compare(lines, importer, pending)
            pending = []
    _compare(lines, importer, pending)
    if memories:
        importer.memories(memories)


def _compare(lines, importer, pending):
    """A batch of records read: the changed ones to the importer; every one's digest and
    line kept (an unchanged record read from a new line, key order say, keeps its new line).
    An id twice in the batch is refused here (one across batches, by `_gone`)."""
    if not pending:
        return
    ids = [record["id"] for _, record in pending]
    if len(set(ids)) < len(ids):
        first = {}
        for number, record in pending:
            seen = first.setdefault(record["id"], number)
            if seen != number:
                raise BadLine(
                    f"{lines.name}:{number}: duplicate id '{record['id']}' (first on line {seen})"
                )
    stored = {
        i: (source, digest, missing)
        for i, source, digest, missing in SourcedRecord.objects.filter(pk__in=ids).values_list(
            "id", "source", "digest", "missing_since"
        )
    }
    batch, rows, back = [], [], []
    for number, record in pending:
        item_id = record["id"]
        content = digest(record)
        line = lines.hashes.pop(number)
        rows.append(SourcedRecord(id=item_id, source=lines.name, digest=content, line=line))
        source, stored_digest, missing = stored.get(item_id, (None, None, None))
        if missing:
            back.append(item_id)
        if source == lines.name and stored_digest == content and not missing:
            continue
        if beadfile.is_convoy_record(record):
            batch.append((number, record, None))
        else:
            batch.append((number, None, jsonl._prepare(record, importer.routes, importer.now)))
    lines.note(ids)
    importer.add(batch)
    SourcedRecord.objects.bulk_create(
        rows,
        batch_size=jsonl.BATCH,
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["source", "digest", "line"],
    )
    lines.back(back)


def _gone(lines, stream):
    """The ids of this source's records the pass did not read. When the count and hash sum
    of the ids read equal those of the records stored as present (the usual pass), none:
    nothing is held. Otherwise the source is read again for its ids (a rare pass: a record
    dropped, or an id twice), which also names a duplicate id with its lines."""
    if _id_sum(_present_ids(lines.name)) == (lines.count, lines.sum):
        return []
    present = SourcedRecord.objects.filter(source=lines.name, missing_since__isnull=True)
    stream.seek(0)
    first = {}
    max_line = settings.CONVOY_IMPORT_MAX_LINE
    for number, record in beadfile.read_records(stream, lines.name, max_line):
        if type(record) is beadfile.MemoryLine or beadfile.skipped(record):
            continue
        seen = first.setdefault(record["id"], number)
        if seen != number:
            raise BadLine(
                f"{lines.name}:{number}: duplicate id '{record['id']}' (first on line {seen})"
            )
    return [i for i in present.values_list("id", flat=True) if i not in first]


def _mark(name, ids, since, actor):
    """Mark records as missing from their source since `since` (never deleted), or clear the
    mark (`since` None); each bead and convoy among them gets an event saying so. Returns
    the number of events."""
    events = []
    for start in range(0, len(ids), jsonl.BATCH):
        part = ids[start : start + jsonl.BATCH]
        SourcedRecord.objects.filter(pk__in=part).update(missing_since=since)
        for model, kind, key in PRESENCE_EVENTS:
            for row in model.objects.filter(pk__in=part).only("id", "status", "title"):
                data = {
                    "status": row.status,
                    "title": row.title,
                    "source": name,
                    "missing_from_source": since is not None,
                    "changes": ["missing_from_source"],
                }
                events.append(dict(kind=kind, actor=actor, data=data, **{key: row.id}))
    return len(record_many(events, instances=False))  # marks only: no close among them


def _failed(name, failure):
    """Keep the error on the source's row; True when it starts a failure streak (then it is
    logged; later failures of the same streak are not)."""
    row, _ = SyncSource.objects.get_or_create(name=name)
    first = not row.error
    if first:
        log.error("sync failed, nothing changed: %s", failure)
        row.failing_since = timezone.now()
    row.error = str(failure)
    row.save(update_fields=["error", "failing_since"])
    return first


def _succeeded(name, report):
    row, _ = SyncSource.objects.get_or_create(name=name)
    if row.error:
        log.info("sync of %s works again (failing since %s)", name, row.failing_since)
    row.last_pass_at = timezone.now()
    row.records, row.changed = report.records, report.changed
    row.error, row.failing_since = "", None
    row.save()


def passes(sources, routes_path=None, every=None, stop=None):
    """Sync each source once, or every `every` seconds until `stop` (a threading.Event) is
    set; yields (source, SyncReport, or None when another holder had it, or SyncFailed)."""
    stop = stop or threading.Event()
    holder = default_holder()
    while True:
        due = time.monotonic() + (every or 0)
        for source in sources:
            try:
                yield source, sync(source, routes_path, holder)
            except SyncFailed as failure:
                yield source, failure
        if every is None or stop.wait(max(due - time.monotonic(), 0)):
            return


def sync_configured():
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
