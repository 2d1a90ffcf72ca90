"""Where bd JSONL comes from: a file, or the standard output of a command (`cmd:bd export`).

A new kind of source is one subclass of `Source`. `source_for` reads a source's spelling
(CONVOY_SYNC_SOURCES, `beads sync SOURCE`); a source that cannot be read raises `SyncFailed`,
and a pass that raises it changes nothing.
"""

import os
import shlex
import subprocess
import tempfile
from abc import ABC, abstractmethod
from typing import IO

from django.conf import settings

from convoys.models import (
    SyncSource,
)
from convoys.services.errors import ServiceError

NAME_MAX: int = SyncSource._meta.get_field("name").max_length or 500


STDERR_SHOWN = 500  # characters of a failing command's standard error kept in the error


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


def configured() -> set[str]:
    """The names of the sources CONVOY_SYNC_SOURCES configures."""
    names = set()
    for spelling in settings.CONVOY_SYNC_SOURCES:
        try:
            names.add(source_for(spelling).name)
        except SyncFailed:
            names.add(spelling.strip()[:NAME_MAX])
    return names
