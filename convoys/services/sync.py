"""Continuous, incremental sync from bd (`manage.py beads sync`, the task cluster's ticker).

A source yields bd JSONL: a file, or the standard output of a command (`cmd:bd export`). A
pass reads the whole source, checks every line as the import does (convoys/beadfile.py), and
writes only the records whose content changed since the last pass (a digest per record,
computed counts left out: `updated_at` from another clock is not trusted). Changed records go
through the import service, which compares field by field and writes each change with its
event, so a close in bd is a `bead.closed` event that feeds the next bead as a local close
does. A record the source no longer has is never deleted: it is marked missing.

Most lines of a pass are the lines of the last one: a process remembers, per source, a hash of
each line its last good pass read with that record's id and digest, and such a line, while the
stored digest still agrees, is handed to the checks blank (its line number kept), so an
unchanged pass costs a hash per line rather than a parse and a check.

A pass is one transaction: a bad source (unreadable file, failing command, any bad line)
changes nothing and keeps the last good state. Its error is kept on the source's SyncSource
row and logged once per failure streak. A lease per source keeps two passes (two clusters, a
cluster and a command line) from running at once.
"""

import hashlib
import io
import json
import logging
import os
import shlex
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from datetime import timedelta

import orjson
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .. import beadfile
from ..beadfile import BadLine
from ..events import record_many
from ..models import Bead, Convoy, Lease, SourcedRecord, SyncSource
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
_known_lines = {}  # source name -> {line hash: (id, digest)} of this process's last good pass


class SyncFailed(ServiceError):
    """A pass that changed nothing: the message names the source and what was wrong.
    `first` tells whether it starts a failure streak (the only one logged)."""

    first = True


class Source(ABC):
    """Where bd JSONL comes from. A new kind of source is one subclass: a `name` (shown on the
    dashboard, at most NAME_MAX characters) and `open()`, a binary stream of JSONL lines that
    raises SyncFailed when the source cannot be read."""

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
        try:
            done = subprocess.run(
                self.argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise SyncFailed(f"{self.name}: no answer within {timeout:g} s")
        except OSError as exc:
            raise SyncFailed(f"{self.name}: cannot run {self.argv[0]!r}: {exc.strerror}")
        if done.returncode:
            stderr = done.stderr.decode("utf-8", "replace").strip()
            if len(stderr) > STDERR_SHOWN:
                stderr = "…" + stderr[-STDERR_SHOWN:]
            raise SyncFailed(
                f"{self.name}: exited with status {done.returncode}"
                + (f": {' / '.join(stderr.splitlines())}" if stderr else "")
            )
        return io.BytesIO(done.stdout)


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
            report, known = _pass(source, routes_path, actor)
            _known_lines[source.name] = known
        except (SyncFailed, BadLine, ServiceError) as exc:
            failure = SyncFailed(str(exc))
            failure.first = _failed(source.name, failure)
            raise failure from None
        report.seconds = round(time.monotonic() - started, 3)
        _succeeded(source.name, report)
        return report
    finally:
        leases.release(lease, holder)


def _pass(source, routes_path, actor):
    report = SyncReport(source=source.name)
    stream = source.open()
    with stream, transaction.atomic():
        if routes_path:
            try:
                with open(routes_path, "rb") as routes:
                    jsonl.import_routes(routes, str(routes_path))
            except OSError as exc:
                raise SyncFailed(f"{routes_path}: {exc.strerror}")
        records = SourcedRecord.objects.filter(source=source.name)
        stored = dict(records.values_list("id", "digest"))
        missing = set(records.filter(missing_since__isnull=False).values_list("id", flat=True))
        imported = jsonl.ImportReport(file=source.name)
        importer = jsonl._Importer(imported, actor)
        lines = _KnownLines(source.name, stream, _known_lines.get(source.name, {}), stored)
        digests = _read(lines, importer)
        present = lines.present
        report.records = len(present)
        discovered.join(importer.discovered_edges, actor=actor)
        report.created = imported.beads_created + imported.convoys_created
        report.updated = imported.beads_updated + imported.convoys_updated
        report.unchanged = report.records - report.created - report.updated
        report.events = imported.events
        _keep_digests(source.name, digests)
        _mark_presence(source.name, stored, missing, present, report, actor)
    return report, lines.kept


class _KnownLines:
    """The source's stream as `beadfile.read_records` reads it, with each line the last good
    pass read (same bytes, its digest still the stored one) blanked out: the checks skip it,
    its line number stays. Notes every record's id and line in `present`, refusing a
    duplicate, and in `kept` the lines to remember for the next pass."""

    def __init__(self, name, stream, known, stored):
        self.name, self.stream, self.known, self.stored = name, stream, known, stored
        self.number = 0
        self.present = {}  # id -> its line
        self.hashes = {}  # line number -> hash, of the lines handed on to be read
        self.kept = {}  # line hash -> (id, digest)

    def readline(self, size=-1):
        raw = self.stream.readline(size)
        if not raw:
            return raw
        self.number += 1
        key = hashlib.blake2b(raw, digest_size=16).digest()
        hit = self.known.get(key)
        if hit is not None and self.stored.get(hit[0]) == hit[1]:
            self.note(hit[0], self.number)
            self.kept[key] = hit
            return b"\n"
        self.hashes[self.number] = key
        return raw

    def note(self, item_id, number):
        first = self.present.setdefault(item_id, number)
        if first != number:
            raise BadLine(f"{self.name}:{number}: duplicate id '{item_id}' (first on line {first})")

    def read(self, item_id, number, content):
        """A record read and checked on line `number`, whose content digest is `content`."""
        self.note(item_id, number)
        self.kept[self.hashes.pop(number)] = (item_id, content)


def _read(lines, importer):
    """Check every line not known from the last pass; hand the records whose digest changed
    to the importer, a batch at a time. Returns {id: new digest} of the changed ones."""
    digests, batch, memories = {}, [], []
    max_line = settings.CONVOY_IMPORT_MAX_LINE
    for number, record in beadfile.read_records(lines, lines.name, max_line):
        if type(record) is beadfile.MemoryLine:
            memories.append(record)
            continue
        if beadfile.skipped(record):
            continue
        item_id = record["id"]
        content = digest(record)
        lines.read(item_id, number, content)
        if lines.stored.get(item_id) == content:
            continue
        digests[item_id] = content
        if beadfile.is_convoy_record(record):
            batch.append((number, record, None))
        else:
            batch.append((number, None, jsonl._prepare(record, importer.routes, importer.now)))
        if len(batch) >= jsonl.BATCH:
            importer.add(batch)
            batch = []
    importer.add(batch)
    if memories:
        importer.memories(memories)
    return digests


def _keep_digests(name, digests):
    SourcedRecord.objects.bulk_create(
        [SourcedRecord(id=i, source=name, digest=d) for i, d in digests.items()],
        batch_size=jsonl.BATCH,
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["source", "digest", "missing_since"],
    )


def _mark_presence(name, stored, missing, present, report, actor):
    """Mark the records the source no longer has as missing (never deleted), and clear the
    mark of those it has again; each bead and convoy among them gets an event saying so."""
    gone = [i for i in stored if i not in present and i not in missing]
    back = sorted(i for i in missing if i in present)
    now = timezone.now()
    events = []
    for ids, since, is_missing in ((gone, now, True), (back, None, False)):
        for start in range(0, len(ids), jsonl.BATCH):
            part = ids[start : start + jsonl.BATCH]
            SourcedRecord.objects.filter(pk__in=part).update(missing_since=since)
            for model, kind, key in PRESENCE_EVENTS:
                for row in model.objects.filter(pk__in=part).only("id", "status", "title"):
                    data = {
                        "status": row.status,
                        "title": row.title,
                        "source": name,
                        "missing_from_source": is_missing,
                        "changes": ["missing_from_source"],
                    }
                    events.append(dict(kind=kind, actor=actor, data=data, **{key: row.id}))
    report.missing, report.returned = len(gone), len(back)
    report.events += record_many(events, instances=False)


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
