"""The memo of the last good pass over a source, and the token that says whether it holds.

The memo is the source cut in chunks of whole lines (about CHUNK bytes), each with a digest,
its line count, the count and hash sum of its ids and its memory lines. A pass finds those
chunks byte for byte in the source and skips them, reading line by line only what lies between.
A process keeps its own (`MEMOS`) and stores it in a SyncMemo row for the others (the task
cluster's workers take turns). A memo holds while the source's token (a Cursor row, set anew in
its transaction by every pass that writes the source's records, or takes one of them for another
source) is the one it saw.
"""

import hashlib
import logging
import secrets
from dataclasses import dataclass

import orjson

from convoys.core import beadfile
from convoys.models import (
    Cursor,
    SyncMemo,
)

log = logging.getLogger("convoys.sync")


# The memo of the last good pass over a source (`Memo`) holds its chunks: whole lines of at
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


def token_name(name: str) -> str:
    """The name of a source's token row (at most 40 characters)."""
    return TOKEN_PREFIX + hashlib.blake2b(name.encode(), digest_size=16).hexdigest()


def current_token(name: str) -> int | None:
    """A source's token: set anew by every pass that writes its records (in its transaction);
    a memo of the source is good while the token is the one its pass saw or set."""
    row = Cursor.objects.filter(name=token_name(name))
    return row.values_list("position", flat=True).first()


def new_token(name: str) -> int:
    """Set a new token for a source (its memos no longer hold) and return it."""
    value = secrets.randbits(62) + 1
    Cursor.objects.update_or_create(name=token_name(name), defaults={"position": value})
    return value


def bump_token(name: str, expected: int) -> int | None:
    """Set a new token for a source if it is still `expected` and return it, else None
    (another pass took a record of this source meanwhile)."""
    value = secrets.randbits(62) + 1
    row = Cursor.objects.filter(name=token_name(name), position=expected)
    return value if row.update(position=value) else None


def load_memo(name: str, token: int) -> "Memo | None":
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
    MEMOS[name] = memo
    return memo


def encode_memo(memo: "Memo") -> bytes:
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


def _decode(token: int, blob: bytes) -> "Memo":
    """A stored memo (`encode_memo`)."""
    data = orjson.loads(blob)
    chunks = [
        Chunk(
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
    return Memo(token, chunks, None, data["records"], (count, int(total, 16)))


@dataclass(frozen=True)
class Chunk:
    """Whole lines of a source as a good pass read them (about CHUNK bytes): every record
    line among them was stored as read, so a later pass that finds the same bytes (while the
    token holds) skips them as it would skip each known line, keeping their memory lines."""

    digest: bytes
    size: int
    head: bytes  # its first HEAD bytes: where to look for it in a changed source
    lines: int
    count: int  # of the ids in it, and the sum of their hashes (`id_sum`)
    total: int
    memories: tuple[beadfile.MemoryLine, ...]


@dataclass(frozen=True)
class Memo:
    """What a process keeps of its last good pass over a source: the token the database had
    then, the source's chunks, the file's identity (when it can be trusted), the number of
    records and the count and hash sum of the ids stored as present."""

    token: int
    chunks: list[Chunk]
    identity: tuple[int, ...] | None
    records: int
    present: tuple[int, int]

    def memories(self) -> list[beadfile.MemoryLine]:
        """The memory lines of its chunks."""
        return [m for chunk in self.chunks for m in chunk.memories]


MEMOS: dict[str, Memo] = {}


def chunk_digest(data: bytes | memoryview) -> bytes:
    """A chunk's digest (16 bytes)."""
    return hashlib.sha256(data).digest()[:16]
