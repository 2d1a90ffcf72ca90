"""Continuous, incremental sync from bd (`manage.py beads sync`, the task cluster's ticker).

A source yields bd JSONL: a file, or the standard output of a command (`cmd:bd export`). A
pass reads the whole source, checks every line as the import does (convoys/core/beadfile.py), and
writes only the records whose content changed since the last pass (a digest per record,
computed counts left out: `updated_at` from another clock is not trusted). Changed records go
through the import service, which compares field by field and writes each change with its
event, so a close in bd is a `bead.closed` event that feeds the next bead as a local close
does. A record the source no longer has is never deleted: it is marked missing. A dispatch
claim of ours (status hooked, a worker as assignee) stands while the source shows those two
fields as it did before the claim (a digest of them per record, `claimed_digest`): its other
fields are applied around the claim; a change of either in bd wins. A record another source
owned is taken (the newest source wins), with an event naming both sources and a line in the
report. A record whose id is a bead or convoy made here (no SourcedRecord row and no import
behind it: `_made_here`) is not taken: nothing is written for it, and the pass reports it as
a conflict (no memo is kept then: its line is read again by every pass, and reported again).
Records that came from bd (`beads import`, a forgotten source's) are a source's to take.
`forget` makes a source no longer configured let go of its records (editable here until a
source has them again).

Most lines of a pass are the lines of the last one: each record's row keeps a hash of the line
it was last read from, and a line whose hash is stored (looked up a batch of lines at a time)
is handed to the checks blank (its line number kept), so an unchanged pass costs a hash per
line and a query per batch rather than a parse and a check, in any process. Cheaper still, a
memo of the last good pass over a source (kept by its process, and stored in a SyncMemo row
for the others: the task cluster's workers take turns): the source cut in chunks of whole
lines (about CHUNK bytes), each with a digest, its line count, the count and hash sum of its
ids and its memory lines. A pass finds those chunks byte for byte in the source and skips them
(a digest over 64 KB rather than a lookup per line), reading line by line only what lies
between; the memo holds while the source's token (a Cursor row, set anew in its transaction
by every pass that writes the source's records, or takes one of them for another source) is
the one it saw. A file source whose identity (device, inode, size, modification time) is the
one this process's last pass read, modified at least RACY_NS before it, is not read at all.

A pass streams: it holds a window of the source (a megabyte), not the source (a command's
output is spooled to a temporary file). Records the source no longer has are found by comparing the count and a hash
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
import io
import json
import logging
import os
import re
import secrets
import shlex
import socket
import subprocess
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import IO, Any, cast

import orjson
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from convoys.core import beadfile
from convoys.core.beadfile import BadLine
from convoys.infra import bulk
from convoys.log.events import EventItem, record_many, settle
from convoys.models import (
    Bead,
    Convoy,
    Cursor,
    Dispatch,
    Event,
    Lease,
    Memory,
    SourcedRecord,
    SyncMemo,
    SyncSource,
)
from convoys.services import discovered, jsonl, leases
from convoys.services.errors import ServiceError

log = logging.getLogger("convoys.sync")

NAME_MAX: int = SyncSource._meta.get_field("name").max_length or 500
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
CONFLICT_IDS = 10  # ids of local records with a source's id named in a pass's report
LEADING_ID = re.compile(rb'\{\s*"id"\s*:\s*"([^"\\]+)"')  # a line that starts with its id
# The memo of the last good pass over a source (`_Memo`) holds its chunks: whole lines of at
# least CHUNK bytes, each known by a digest and its first HEAD bytes. A pass reads the
# source WINDOW bytes at a time, skips a chunk found byte for byte, and where the next one
# is not, looks for any at the line starts of the next WINDOW bytes.
CHUNK = 64 * 1024
HEAD = 64
WINDOW = 1024 * 1024
# A memo is good while the database holds its token (a Cursor row per source, TOKEN_PREFIX
# and a hash of its name): every pass that writes sets its source's anew, and that of any
# source it took a record from.
TOKEN_PREFIX = "sync:"
# A file whose identity (device, inode, size, modification time) is what the last good pass
# read is not read again, when that pass saw it last modified this long before (a change
# within the file system's timestamp granularity may keep the time).
RACY_NS = 2 * 10**9


class SyncFailed(ServiceError):
    """A pass that changed nothing: the message names the source and what was wrong.
    `first` tells whether it starts a failure streak (the only one logged)."""

    first = True


class Source(ABC):
    """Where bd JSONL comes from. A new kind of source is one subclass: a `name` (shown on the
    dashboard, at most NAME_MAX characters) and `open()`, a seekable binary stream of JSONL
    lines (a pass may read it twice) that raises SyncFailed when the source cannot be read;
    and, if it can tell that a stream holds what an earlier one did without reading it,
    `identity()`."""

    name = ""

    @abstractmethod
    def open(self) -> IO[bytes]:
        """A binary stream of the source's JSONL lines."""

    def identity(self, stream: IO[bytes]) -> tuple[int, ...] | None:
        """What tells, without reading it, that the open stream holds what an earlier one
        did (its last item a modification time in ns), or None (read it)."""
        return None


class FileSource(Source):
    """A bd JSONL file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = self.name = str(path)

    def open(self) -> IO[bytes]:
        try:
            return open(self.path, "rb")
        except OSError as exc:
            raise SyncFailed(f"{self.name}: {exc.strerror}")

    def identity(self, stream: IO[bytes]) -> tuple[int, ...] | None:
        """The open file's device, inode, size and modification time (ns)."""
        stat = os.fstat(stream.fileno())
        return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


class CommandSource(Source):
    """`cmd:<command line>`: the command's standard output, run without a shell."""

    def __init__(self, command: str, timeout: float | None = None) -> None:
        self.name = f"cmd:{command}"
        try:
            self.argv = shlex.split(command)
        except ValueError as exc:
            raise SyncFailed(f"{self.name}: {exc}")
        if not self.argv:
            raise SyncFailed("cmd: source names no command")
        self.timeout = timeout

    def open(self) -> IO[bytes]:
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


def source_for(text: str | None) -> Source:
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


def default_holder() -> str:
    """This thread's name as a lease holder: host, process id, thread id."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def _take_from_the_dead(lease: str, holder: str) -> bool:
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


def lease_name(source_name: str) -> str:
    """The name of a source's lease (a hash: a source's name may be long)."""
    return "sync:" + hashlib.blake2b(source_name.encode(), digest_size=16).hexdigest()


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
    if not leases.acquire(lease, holder, ttl=LEASE_TTL) and not _take_from_the_dead(lease, holder):
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
    token = _token(source.name)  # before reading: a write after it makes the memo kept stale
    if token is None:  # none set yet (a source new, or a database older than the token)
        token = _new_token(source.name)
    memo = _memos.get(source.name)
    if memo is None or memo.token != token:
        memo = _load(source.name, token)  # the last good pass ran in another process
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
        lines = _Lines(source.name, stream, actor, memo)
        found = _scan(lines)
        if found is not None and not routes_path and _nothing_to_write(lines, *found):
            report.records = report.unchanged = lines.count
            # Stored for other processes when what is stored is not this (a write, but rare:
            # the source changed and nothing to write, or the memo's first pass).
            store = memo is None or memo.chunks != lines.chunks
            _remember(source.name, lines, token, identity, opened, store)
            return report
        with transaction.atomic():
            now = _token(source.name)
            if now != token:  # another source took a record of this one since: read afresh
                found, memo = None, None
                token = now if now is not None else _new_token(source.name)
            lines = _write(report, source, stream, lines, found, memo, routes_path, actor)
            for other in sorted(lines.taken):
                _new_token(other)
            written = _bump(source.name, token)
            # No memo while local records share ids with the source: the next pass reads
            # their lines again (they are never stored as known) and reports them again.
            if written is not None and not report.conflicts:
                _remember(source.name, lines, written, identity, opened, store=True)
            else:  # taken from during the pass: what it read of the source may be stale
                _memos.pop(source.name, None)
            settle()  # the read model, in one pass over what the pass appended
    return report


def _token_name(name: str) -> str:
    """The name of a source's token row (at most 40 characters)."""
    return TOKEN_PREFIX + hashlib.blake2b(name.encode(), digest_size=16).hexdigest()


def _token(name: str) -> int | None:
    """A source's token: set anew by every pass that writes its records (in its transaction);
    a memo of the source is good while the token is the one its pass saw or set."""
    row = Cursor.objects.filter(name=_token_name(name))
    return row.values_list("position", flat=True).first()


def _new_token(name: str) -> int:
    """Set a new token for a source (its memos no longer hold) and return it."""
    value = secrets.randbits(62) + 1
    Cursor.objects.update_or_create(name=_token_name(name), defaults={"position": value})
    return value


def _bump(name: str, expected: int) -> int | None:
    """Set a new token for a source if it is still `expected` and return it, else None
    (another pass took a record of this source meanwhile)."""
    value = secrets.randbits(62) + 1
    row = Cursor.objects.filter(name=_token_name(name), position=expected)
    return value if row.update(position=value) else None


def _remember(
    name: str,
    lines: "_Lines",
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
    memo = _Memo(token, lines.chunks, identity, lines.count, (lines.count, lines.sum))
    _memos[name] = memo
    if store:
        SyncMemo.objects.update_or_create(
            source=name, defaults={"token": token, "chunks": _encode(memo)}
        )


def _load(name: str, token: int) -> "_Memo | None":
    """The memo another process stored of its last good pass over this source, if it still
    holds (its token is `token`)."""
    blob = (
        SyncMemo.objects.filter(source=name, token=token).values_list("chunks", flat=True).first()
    )
    if blob is None:
        return None
    try:
        memo = _decode(token, bytes(blob))
    except (ValueError, TypeError, KeyError):  # not a memo this code wrote: read the source
        log.warning("sync memo of %s unreadable: ignored", name)
        return None
    _memos[name] = memo
    return memo


def _encode(memo: "_Memo") -> bytes:
    """A memo as stored (JSON; its file identity left out: another process reads it)."""
    return orjson.dumps(
        {
            "records": memo.records,
            "present": [memo.present[0], format(memo.present[1], "x")],
            "chunks": [
                [
                    c.digest.hex(),
                    c.size,
                    c.head.decode("latin-1"),
                    c.lines,
                    c.count,
                    format(c.total, "x"),
                    [list(m) for m in c.memories],
                ]
                for c in memo.chunks
            ],
        }
    )


def _decode(token: int, blob: bytes) -> "_Memo":
    """A stored memo (`_encode`)."""
    data = orjson.loads(blob)
    chunks = [
        _Chunk(
            bytes.fromhex(digest),
            size,
            head.encode("latin-1"),
            lines,
            count,
            int(total, 16),
            tuple(beadfile.MemoryLine(*m) for m in memories),
        )
        for digest, size, head, lines, count, total, memories in data["chunks"]
    ]
    count, total = data["present"]
    return _Memo(token, chunks, None, data["records"], (count, int(total, 16)))


def _memories_stored(memories: list[beadfile.MemoryLine]) -> bool:
    """Whether these memory lines are stored as they are."""
    if not memories:
        return True
    stored = dict(
        Memory.objects.filter(key__in=[m.key for m in memories]).values_list("key", "line")
    )
    return all(stored.get(m.key) == m.line for m in memories)


def _records(
    lines: "_Lines", memories: list[beadfile.MemoryLine]
) -> Iterator[tuple[int, beadfile.Record]]:
    """The source's bead and convoy records as (line number, record), checked as the import
    checks them; memory lines are appended to `memories`, records the import skips dropped.
    A chunk the last good pass read the same is skipped whole (its memory lines kept)."""
    max_line = settings.CONVOY_IMPORT_MAX_LINE
    for same, item in lines.segments:
        if same:
            lines.skip(item)
            memories.extend(item.memories)
            continue
        lines.start(item)
        stream = cast(IO[bytes], lines)  # what read_records uses of a stream: readline
        for number, record in beadfile.read_records(stream, lines.name, max_line, lines.number + 1):
            if isinstance(record, beadfile.MemoryLine):
                lines.hashes.pop(number, None)
                memories.append(record)
                lines.memories[number] = record
                continue
            if beadfile.skipped(record):
                lines.hashes.pop(number, None)
                continue
            lines.ids[number] = record["id"]
            yield number, record
        lines.finish()


def _scan(
    lines: "_Lines",
) -> tuple[list[tuple[int, beadfile.Record]], list[beadfile.MemoryLine]] | None:
    """Read and check the whole source, writing nothing: the records of the lines not known
    and the memory lines, or None when more than SCAN_KEPT lines are not known (a first
    pass, say: the pass then reads the source again as it writes)."""
    pending: list[tuple[int, beadfile.Record]] = []
    memories: list[beadfile.MemoryLine] = []
    for number, record in _records(lines, memories):
        pending.append((number, record))
        if len(pending) + len(memories) > SCAN_KEPT:
            return None
    return pending, memories


def _nothing_to_write(
    lines: "_Lines",
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
    lines: "_Lines",
    found: tuple[list[tuple[int, beadfile.Record]], list[beadfile.MemoryLine]] | None,
    memo: "_Memo | None",
    routes_path: str | os.PathLike[str] | None,
    actor: str,
) -> "_Lines":
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
    importer = jsonl._Importer(imported, actor)
    if found is None:
        stream.seek(0)
        lines = _Lines(source.name, stream, actor, memo)
        _read(lines, importer)
    else:
        pending, memories = found
        for start in range(0, len(pending), jsonl.BATCH):
            _compare(lines, importer, pending[start : start + jsonl.BATCH])
        if memories:
            importer.memories(memories)
    report.records = lines.count
    report.conflicts = len(lines.conflicts)
    report.conflict_ids = sorted(lines.conflicts)[:CONFLICT_IDS]
    discovered.join(importer.discovered_edges, actor=actor)
    report.created = imported.beads_created + imported.convoys_created
    report.updated = imported.beads_updated + imported.convoys_updated
    report.unchanged = report.records - report.created - report.updated
    gone = _gone(lines, stream)
    if gone and not report.records:  # an empty export (bd run in the wrong place, a file
        # being rewritten) is a bad source, not a town whose every record went away
        raise SyncFailed(f"{source.name}: no records, where {len(gone)} were: nothing changed")
    report.missing, report.returned = len(gone), lines.returned
    report.taken_from = dict(sorted(lines.taken_from.items()))
    report.taken = sum(report.taken_from.values())
    for owner, count in report.taken_from.items():
        log.warning("sync of %s took %d records from %s", source.name, count, owner)
    gone_events = _mark(source.name, gone, timezone.now(), actor)
    report.events = imported.events + lines.events + gone_events
    return lines


def _present_ids(name: str) -> Iterator[list[str]]:
    """The ids of the source's records stored as present, a chunk (list) at a time."""
    table = connection.ops.quote_name(SourcedRecord._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {table} WHERE source = %s AND missing_since IS NULL", [name]
        )
        while chunk := cursor.fetchmany(jsonl.BATCH * 5):
            yield [row[0] for row in chunk]


def _id_hash(item_id: str) -> int:
    """A 64-bit hash of an id, the same in every process (a memo is shared)."""
    data = item_id.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _id_sum(chunks: Iterable[list[str]]) -> tuple[int, int]:
    """Count and sum (mod 2**64) of the hashes of the ids in `chunks` (lists of ids): equal
    for two id lists exactly when they hold the same ids, duplicates included (but for a
    2**-64 chance)."""
    count = total = 0
    for ids in chunks:
        count += len(ids)
        total = (total + sum(map(_id_hash, ids))) & ID_SUM_MASK
    return count, total


@dataclass(frozen=True)
class _Chunk:
    """Whole lines of a source as a good pass read them (about CHUNK bytes): every record
    line among them was stored as read, so a later pass that finds the same bytes (while the
    token holds) skips them as it would skip each known line, keeping their memory lines."""

    digest: bytes
    size: int
    head: bytes  # its first HEAD bytes: where to look for it in a changed source
    lines: int
    count: int  # of the ids in it, and the sum of their hashes (`_id_sum`)
    total: int
    memories: tuple[beadfile.MemoryLine, ...]


@dataclass(frozen=True)
class _Memo:
    """What a process keeps of its last good pass over a source: the token the database had
    then, the source's chunks, the file's identity (when it can be trusted), the number of
    records and the count and hash sum of the ids stored as present."""

    token: int
    chunks: list[_Chunk]
    identity: tuple[int, ...] | None
    records: int
    present: tuple[int, int]

    def memories(self) -> list[beadfile.MemoryLine]:
        """The memory lines of its chunks."""
        return [m for chunk in self.chunks for m in chunk.memories]


_memos: dict[str, _Memo] = {}


def _digest(data: bytes | memoryview) -> bytes:
    """A chunk's digest (16 bytes)."""
    return hashlib.sha256(data).digest()[:16]


class _Segments:
    """A source's stream in big blocks, as (True, chunk) for each chunk of the last good
    pass found here byte for byte, and (False, bytes) for the lines between (whole lines, up
    to about WINDOW bytes at a time; a line longer than max_line is handed on as it is, for
    the checks to refuse). Chunks are expected in their order; where the next one is not
    found, any chunk is looked for at each line start of the next WINDOW bytes (by its first
    HEAD bytes), so a line changed, added or dropped costs the chunk it is in."""

    def __init__(self, stream: IO[bytes], chunks: list[_Chunk], max_line: int) -> None:
        self.stream, self.chunks, self.max_line = stream, chunks, max_line
        self.heads: dict[bytes, list[int]] | None = None  # first HEAD bytes -> chunk indexes
        self.buf = b""
        self.pos = 0
        self.eof = False

    def _fill(self, need: int) -> None:
        """At least `need` bytes from `pos` in the buffer, unless the stream ends first (the
        buffer may start afresh at `pos`: offsets from `pos` hold, positions do not)."""
        if len(self.buf) - self.pos >= need or self.eof:
            return
        parts = [self.buf[self.pos :]]
        have = len(parts[0])
        while have < need:
            block = self.stream.read(max(need - have, WINDOW))
            if not block:
                self.eof = True
                break
            parts.append(block)
            have += len(block)
        self.buf, self.pos = b"".join(parts), 0

    def _is(self, chunk: _Chunk, offset: int) -> bool:
        """Whether the chunk's bytes are at `offset` from `pos`."""
        self._fill(offset + chunk.size)
        start = self.pos + offset
        if len(self.buf) - start < chunk.size:
            return False
        return _digest(memoryview(self.buf)[start : start + chunk.size]) == chunk.digest

    def _found(self) -> tuple[int, int] | None:
        """(chunk index, offset from `pos`) of the first chunk found at a line start in the
        next WINDOW bytes, or None."""
        if self.heads is None:
            self.heads = {}
            for index, chunk in enumerate(self.chunks):
                if len(chunk.head) == HEAD:  # (a shorter one is only found where expected)
                    self.heads.setdefault(chunk.head, []).append(index)
        self._fill(WINDOW + HEAD)
        offset, limit = 0, min(WINDOW, len(self.buf) - self.pos)
        while offset < limit:
            at = self.pos + offset
            for index in self.heads.get(self.buf[at : at + HEAD], ()):
                if self._is(self.chunks[index], offset):
                    return index, offset
            end = self.buf.find(b"\n", self.pos + offset, self.pos + limit)
            if end == -1:
                break
            offset = end + 1 - self.pos
        return None

    def _lines(self) -> bytes:
        """The next whole lines, about WINDOW bytes of them."""
        self._fill(WINDOW)
        end = self.buf.rfind(b"\n", self.pos, self.pos + WINDOW) + 1
        while end <= 0 and not self.eof and len(self.buf) - self.pos <= self.max_line:
            self._fill(len(self.buf) - self.pos + WINDOW)  # a line longer than WINDOW
            end = self.buf.find(b"\n", self.pos) + 1
        if end <= 0:
            end = len(self.buf)  # the last line, with no newline (or one beyond max_line)
        piece = self.buf[self.pos : end]
        self.pos = end
        return piece

    def __iter__(self) -> Iterator[tuple[bool, Any]]:
        index = 0  # the chunk expected next
        while True:
            self._fill(1)
            if self.pos >= len(self.buf):
                return
            if index < len(self.chunks) and self._is(self.chunks[index], 0):
                self.pos += self.chunks[index].size
                index += 1
                yield True, self.chunks[index - 1]
                continue
            found = self._found() if self.chunks else None
            if found is None:
                yield False, self._lines()
                continue
            index, offset = found
            if offset:
                piece = self.buf[self.pos : self.pos + offset]
                self.pos += offset
                yield False, piece


class _Lines:
    """The new lines of a source (the `_Segments` between chunks known) as
    `beadfile.read_records` reads them, BATCH lines looked up at a time: a line whose hash is
    stored as the line a record of this source was last read from is handed on blank (the
    checks skip it, its line number stays); its record is present and unchanged. Keeps the
    count and the hash sum (`_id_sum`) of the ids present, the chunks of what it read (for
    the next pass's memo), and no more."""

    def __init__(self, name: str, stream: IO[bytes], actor: str, memo: _Memo | None) -> None:
        self.name, self.actor = name, actor
        max_line = settings.CONVOY_IMPORT_MAX_LINE
        self.segments = _Segments(stream, memo.chunks if memo else [], max_line)
        self.base = memo.present if memo else None  # stored as present when the pass began
        self.gained: list[str] = []  # ids made present for this source by this pass
        self.taken: set[str] = set()  # sources whose records this pass took
        self.taken_from: dict[str, int] = {}  # {source: records this pass took from it}
        self.conflicts: list[str] = []  # ids of local records the source has too: not taken
        self.number = 0
        self.piece = io.BytesIO()
        self.first = 1  # the number of the piece's first line
        self.ahead: list[tuple[bytes, str | None, str | None]] = []  # (line, hash, known id)
        self.hashes: dict[int, str] = {}  # line number -> hash, of the lines handed on to be read
        self.ids: dict[int, str] = {}  # line number -> id, of the piece's lines
        self.memories: dict[int, beadfile.MemoryLine] = {}  # line number -> memory, the piece's
        self.chunks: list[_Chunk] = []
        self.count = self.sum = 0
        self.returned = self.events = 0

    def skip(self, chunk: _Chunk) -> None:
        """A chunk known: its lines counted, its ids noted, none read."""
        self.number += chunk.lines
        self.count += chunk.count
        self.sum = (self.sum + chunk.total) & ID_SUM_MASK
        self.chunks.append(chunk)

    def start(self, piece: bytes) -> None:
        """New lines to read (whole lines, from line number `number` + 1)."""
        self.piece = io.BytesIO(piece)
        self.first = self.number + 1
        self.ids, self.memories = {}, {}

    def finish(self) -> None:
        """The piece read: cut into chunks of about CHUNK bytes for the next pass's memo
        (a last line without its newline is left out: more may follow it next time)."""
        piece = self.piece.getvalue()
        view = memoryview(piece)
        number, start, at, first = self.first, 0, 0, self.first
        ids: list[str] = []
        memories: list[beadfile.MemoryLine] = []
        while True:
            end = piece.find(b"\n", at) + 1
            if end <= 0:
                break
            if number in self.ids:
                ids.append(self.ids[number])
            elif number in self.memories:
                memories.append(self.memories[number])
            number, at = number + 1, end
            if at - start >= CHUNK or at == len(piece):
                count, total = _id_sum([ids])
                self.chunks.append(
                    _Chunk(
                        _digest(view[start:at]),
                        at - start,
                        piece[start : start + HEAD],
                        number - first,
                        count,
                        total,
                        tuple(memories),
                    )
                )
                start, first, ids, memories = at, number, [], []

    def readline(self, size: int = -1) -> bytes:
        if not self.ahead:
            self._look_ahead(size)
            if not self.ahead:
                return b""
        raw, key, known = self.ahead.pop()
        self.number += 1
        if key is None:
            self.ids[self.number] = known  # type: ignore[assignment]
            return b"\n"
        if not raw.isspace():
            self.hashes[self.number] = key
        return raw

    def _look_ahead(self, size: int) -> None:
        raws: list[bytes] = []
        while len(raws) < jsonl.BATCH:
            raw = self.piece.readline(size)
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
            (raw, None, known[key]) if key in known else (raw, key, None)
            for raw, key in zip(raws, keys, strict=True)
        ]
        self.ahead.reverse()

    def note(self, ids: list[str]) -> None:
        """Ids read (present in the source)."""
        count, total = _id_sum([ids])
        self.count += count
        self.sum = (self.sum + total) & ID_SUM_MASK

    def present(self) -> tuple[int, int]:
        """Count and hash sum of the ids stored as present now: from the memo and what this
        pass made present when the memo holds, else read from the database."""
        if self.base is None:
            return _id_sum(_present_ids(self.name))
        count, total = _id_sum([self.gained])
        return self.base[0] + count, (self.base[1] + total) & ID_SUM_MASK

    def back(self, ids: list[str]) -> None:
        """Records marked missing that the source has again."""
        if ids:
            self.returned += len(ids)
            self.events += _mark(self.name, ids, None, self.actor)

    def take(self, taken: list[tuple[str, str]]) -> None:
        """Records this pass took from another source, as (id, that source): counted, and
        an event each naming both sources."""
        for _, owner in taken:
            self.taken_from[owner] = self.taken_from.get(owner, 0) + 1
        if taken:
            self.events += _moved(self.name, taken, self.actor)


def _stored(ids: Iterable[str], lines: Iterable[str]) -> list[tuple[str, str, str, bool]]:
    """(line, id, source, missing) of the stored records with one of these ids or last read
    from one of these lines: in SQL (the ORM's lookups cost more than the queries), each by
    one index alone (given the source too, SQLite may scan the source's index instead)."""
    table = connection.ops.quote_name(SourcedRecord._meta.db_table)
    rows: list[tuple[str, str, str, bool]] = []
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


def _read(lines: _Lines, importer: jsonl._Importer) -> None:
    """Check every line not known from an earlier pass; hand the records whose digest
    changed to the importer, and keep each read record's digest and line, a batch at a time."""
    pending: list[tuple[int, beadfile.Record]] = []
    memories: list[beadfile.MemoryLine] = []
    for number, record in _records(lines, memories):
        pending.append((number, record))
        if len(pending) >= jsonl.BATCH:
            _compare(lines, importer, pending)
            pending = []
    _compare(lines, importer, pending)
    if memories:
        importer.memories(memories)


def _compare(
    lines: _Lines, importer: jsonl._Importer, pending: list[tuple[int, beadfile.Record]]
) -> None:
    """A batch of records read: the changed ones to the importer; every one's digest and
    line kept (an unchanged record read from a new line, key order say, keeps its new line).
    An id twice in the batch is refused here (one across batches, by `_gone`). A changed bead
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
        batch.append((number, None, jsonl._prepare(record, importer.routes, importer.now)))
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


def _gone(lines: _Lines, stream: IO[bytes]) -> list[str]:
    """The ids of this source's records the pass did not read. When the count and hash sum
    of the ids read equal those of the records stored as present (the usual pass), none:
    nothing is held. Otherwise the source is read again for its ids (a rare pass: a record
    dropped, or an id twice), which also names a duplicate id with its lines."""
    if lines.present() == (lines.count, lines.sum):
        return []
    present = SourcedRecord.objects.filter(source=lines.name, missing_since__isnull=True)
    stream.seek(0)
    first: dict[str, int] = {}
    max_line = settings.CONVOY_IMPORT_MAX_LINE
    for number, record in beadfile.read_records(stream, lines.name, max_line):
        if isinstance(record, beadfile.MemoryLine) or beadfile.skipped(record):
            continue
        seen = first.setdefault(record["id"], number)
        if seen != number:
            raise BadLine(
                f"{lines.name}:{number}: duplicate id '{record['id']}' (first on line {seen})"
            )
    return [i for i in present.values_list("id", flat=True) if i not in first]


def _source_events(
    ids: list[str],
    actor: str,
    data: Callable[[str], dict[str, Any]],
    before: Callable[[list[str]], Any] | None = None,
) -> int:
    """An event for each bead and convoy among `ids` (bead.updated, convoy.updated): its
    status and title, and `data(id)`; `before` runs on each batch of ids first. None of them
    is a close. Returns the number of events."""
    events: list[EventItem] = []
    for start in range(0, len(ids), jsonl.BATCH):
        part = ids[start : start + jsonl.BATCH]
        if before is not None:
            before(part)
        for model, kind, key in PRESENCE_EVENTS:
            for row in model.objects.filter(pk__in=part).only("id", "status", "title"):
                fields = {"status": row.status, "title": row.title, **data(row.id)}
                item: EventItem = {"kind": kind, "actor": actor, "data": fields}
                item[key] = row.id  # type: ignore[literal-required]  # bead_id or convoy_id
                events.append(item)
    return len(record_many(events, instances=False))


def _mark(name: str, ids: list[str], since: datetime | None, actor: str) -> int:
    """Mark records as missing from their source since `since` (never deleted), or clear the
    mark (`since` None); each bead and convoy among them gets an event saying so. Returns
    the number of events."""
    data = {
        "source": name,
        "missing_from_source": since is not None,
        "changes": ["missing_from_source"],
    }

    def mark(part: list[str]) -> None:
        SourcedRecord.objects.filter(pk__in=part).update(missing_since=since)

    return _source_events(ids, actor, lambda _: data, mark)


def _moved(name: str, taken: list[tuple[str, str]], actor: str) -> int:
    """An event for each bead and convoy a pass of source `name` took from the source that
    owned it, as (id, that source); the move is not refused (the newest source wins), only
    made visible. Returns the number of events."""
    owners = dict(taken)

    def data(item_id: str) -> dict[str, Any]:
        return {"source": name, "previous_source": owners[item_id], "changes": ["source"]}

    return _source_events(list(owners), actor, data)


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


def configured() -> set[str]:
    """The names of the sources CONVOY_SYNC_SOURCES configures."""
    names = set()
    for spelling in settings.CONVOY_SYNC_SOURCES:
        try:
            names.add(source_for(spelling).name)
        except SyncFailed:
            names.add(spelling.strip()[:NAME_MAX])
    return names


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
    if not leases.acquire(lease, holder, ttl=LEASE_TTL) and not _take_from_the_dead(lease, holder):
        raise SyncFailed(f"{name}: another process is syncing it now; try again")
    try:
        with transaction.atomic():
            ids = list(owned.values_list("id", flat=True))
            data = {"source": name, "source_forgotten": True, "changes": ["source"]}
            count = _source_events(ids, actor, lambda _: data)
            owned.delete()
            SyncSource.objects.filter(name=name).delete()
            SyncMemo.objects.filter(source=name).delete()
            Cursor.objects.filter(name=_token_name(name)).delete()
            settle()
        _memos.pop(name, None)
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
