"""The ids a log line names (convoy, bead, worker, request): bound for a piece of work with
`bound(bead=…)`, which every line logged inside it carries (convoyweb/logs.py writes them as
JSON fields with LOG_FORMAT=json). A log call's own `extra={"bead": …}` wins. No Django."""

import contextlib
import contextvars
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from types import MappingProxyType

IDS = ("convoy", "bead", "worker", "request")
_bound: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "log_ids", default=MappingProxyType({})
)


@contextlib.contextmanager
def bound(**ids: object) -> Iterator[None]:
    """Every line logged inside carries these ids (None or "" leaves one out)."""
    kept = {k: str(v) for k, v in ids.items() if v not in (None, "")}
    token = _bound.set({**_bound.get(), **kept})
    try:
        yield
    finally:
        _bound.reset(token)


def process_name() -> str:
    """`web`, `tasks` or `swarm` under `serve` (it sets CONVOY_PROCESS), else the command."""
    named = os.environ.get("CONVOY_PROCESS")
    if named:
        return named
    argv = sys.argv
    if len(argv) > 1 and argv[0].endswith("manage.py"):
        return argv[1]
    return os.path.basename(argv[0]) or "python"


class WithIds(logging.Filter):
    """Puts the bound ids and the process's name on each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _bound.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        if not hasattr(record, "process_name"):  # serve names its children's lines
            record.process_name = process_name()
        return True
