"""Run a generator in a forked child process, so the parent's work on one item overlaps the
child's work on the next.

The import uses it to parse, validate and convert a file's records in one process while the
database writes happen in the other: on a 100,000-bead file both halves take seconds, and
Python's GIL keeps a thread from overlapping them. The child inherits the parent's memory
(fork) and only computes: it never touches the parent's database connection and leaves with
os._exit, so nothing the parent holds is closed or flushed twice. Items and the generator's
exception travel back through a pipe as pickles; the pipe's buffer keeps the child at most
about one item ahead, so memory stays flat however long the file.
"""

import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from convoys.infra import processes

T = TypeVar("T")
_END = "end"
_ITEM = "item"
_ERROR = "error"


def available() -> bool:
    """Fork is the only start method that shares the parent's already-set-up state cheaply."""
    return sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()


def in_child(produce: Callable[..., Iterable[T]], *args: Any) -> Iterator[T]:
    """Yield what `produce(*args)` yields, computed in a forked child process.

    An exception raised by the generator is raised again in the parent; if the parent stops
    early (its own error, or it closes this generator), the child is stopped."""
    receiver, sender = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(
        target=_run, args=(sender, os.getpid(), produce, args), daemon=True
    )
    child.start()
    sender.close()
    try:
        while True:
            try:
                kind, payload = receiver.recv()
            except EOFError:
                child.join(5)
                raise ChildProcessError(
                    f"the read-ahead process ended unexpectedly (exit code {child.exitcode})"
                )
            if kind == _ITEM:
                yield payload
            elif kind == _ERROR:
                raise payload
            else:
                return
    finally:
        receiver.close()
        if child.is_alive():
            child.terminate()
        child.join()


def _run(
    sender: Connection, parent: int, produce: Callable[..., Iterable[Any]], args: tuple[Any, ...]
) -> None:
    # A parent killed with SIGKILL runs no `finally`: without this the child would wait on a
    # full pipe for ever, holding its copy of the parent's memory.
    processes.die_with_parent(parent)
    try:
        for item in produce(*args):
            sender.send((_ITEM, item))
        sender.send((_END, None))
    except BaseException as exc:  # noqa: BLE001 - every failure is the parent's to report
        try:
            sender.send((_ERROR, exc))
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            sender.send((_ERROR, RuntimeError(f"{type(exc).__name__}: {exc}")))
    finally:
        sender.close()
        os._exit(0)
