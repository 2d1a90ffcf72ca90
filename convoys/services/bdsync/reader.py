"""Reading a source as a pass does: streamed, chunks of the memo skipped, known lines blank.

A pass holds a window of the source (a megabyte), not the source. Each record's row keeps a
hash of the line it was last read from, and a line whose hash is stored (looked up a batch of
lines at a time) is handed to the checks blank (its line number kept), so an unchanged line costs
a hash and a share of a query rather than a parse and a check. Records the source no longer has
are found by comparing the count and a hash sum of the ids read with those of the records
stored as present; only when they differ (a record dropped, an id twice) is the source read
again for its ids.
"""

import hashlib
import io
import re
from collections.abc import Iterable, Iterator
from typing import IO, Any, cast

from django.conf import settings
from django.db import connection

from convoys.core import beadfile
from convoys.core.beadfile import BadLine
from convoys.models import (
    SourcedRecord,
)
from convoys.services import jsonl
from convoys.services.bdsync.memo import CHUNK, HEAD, WINDOW, Chunk, Memo, chunk_digest
from convoys.services.bdsync.presence import mark_missing, mark_moved

ID_SUM_MASK = 2**64 - 1


LEADING_ID = re.compile(rb'\{\s*"id"\s*:\s*"([^"\\]+)"')  # a line that starts with its id


def checked_records(
    lines: "Lines", memories: list[beadfile.MemoryLine]
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


def id_sum(chunks: Iterable[list[str]]) -> tuple[int, int]:
    """Count and sum (mod 2**64) of the hashes of the ids in `chunks` (lists of ids): equal
    for two id lists exactly when they hold the same ids, duplicates included (but for a
    2**-64 chance)."""
    count = total = 0
    for ids in chunks:
        count += len(ids)
        total = (total + sum(map(_id_hash, ids))) & ID_SUM_MASK
    return count, total


class _Segments:
    """A source's stream in big blocks, as (True, chunk) for each chunk of the last good
    pass found here byte for byte, and (False, bytes) for the lines between (whole lines, up
    to about WINDOW bytes at a time; a line longer than max_line is handed on as it is, for
    the checks to refuse). Chunks are expected in their order; where the next one is not
    found, any chunk is looked for at each line start of the next WINDOW bytes (by its first
    HEAD bytes), so a line changed, added or dropped costs the chunk it is in."""

    def __init__(self, stream: IO[bytes], chunks: list[Chunk], max_line: int) -> None:
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

    def _is(self, chunk: Chunk, offset: int) -> bool:
        """Whether the chunk's bytes are at `offset` from `pos`."""
        self._fill(offset + chunk.size)
        start = self.pos + offset
        if len(self.buf) - start < chunk.size:
            return False
        return chunk_digest(memoryview(self.buf)[start : start + chunk.size]) == chunk.digest

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


class Lines:
    """The new lines of a source (the `_Segments` between chunks known) as
    `beadfile.read_records` reads them, BATCH lines looked up at a time: a line whose hash is
    stored as the line a record of this source was last read from is handed on blank (the
    checks skip it, its line number stays); its record is present and unchanged. Keeps the
    count and the hash sum (`id_sum`) of the ids present, the chunks of what it read (for
    the next pass's memo), and no more."""

    def __init__(self, name: str, stream: IO[bytes], actor: str, memo: Memo | None) -> None:
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
        self.chunks: list[Chunk] = []
        self.count = self.sum = 0
        self.returned = self.events = 0

    def skip(self, chunk: Chunk) -> None:
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
                count, total = id_sum([ids])
                self.chunks.append(
                    Chunk(
                        chunk_digest(view[start:at]),
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
        count, total = id_sum([ids])
        self.count += count
        self.sum = (self.sum + total) & ID_SUM_MASK

    def present(self) -> tuple[int, int]:
        """Count and hash sum of the ids stored as present now: from the memo and what this
        pass made present when the memo holds, else read from the database."""
        if self.base is None:
            return id_sum(_present_ids(self.name))
        count, total = id_sum([self.gained])
        return self.base[0] + count, (self.base[1] + total) & ID_SUM_MASK

    def back(self, ids: list[str]) -> None:
        """Records marked missing that the source has again."""
        if ids:
            self.returned += len(ids)
            self.events += mark_missing(self.name, ids, None, self.actor)

    def take(self, taken: list[tuple[str, str]]) -> None:
        """Records this pass took from another source, as (id, that source): counted, and
        an event each naming both sources."""
        for _, owner in taken:
            self.taken_from[owner] = self.taken_from.get(owner, 0) + 1
        if taken:
            self.events += mark_moved(self.name, taken, self.actor)


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


def gone_ids(lines: Lines, stream: IO[bytes]) -> list[str]:
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
