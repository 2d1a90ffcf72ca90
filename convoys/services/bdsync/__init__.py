"""Continuous, incremental sync from bd (`manage.py beads sync`, the task cluster's ticker).

A source yields bd JSONL (`sources`). A pass (`run`) reads the whole source under its lease
(`lease`), checks every line as the import does (convoys/core/beadfile.py) and writes only the
records whose content changed since the last pass (`reconcile`), through the import service,
which writes each change with its event: a close in bd is a `bead.closed` event that feeds the
next bead as a local close does. A record the source no longer has is never deleted: it is
marked missing (`presence`). Most of a pass's lines are the last pass's: the memo of the last
good pass (`memo`) and the line hashes stored per record let a pass skip them (`reader`), in any
process. Records that came from bd (`beads import`, a forgotten source's) are a source's to take;
`forget` makes a source no longer configured let go of its records.

This module is the package's public face; the command line, the ticker and the dashboard use
only what it names.
"""

from convoys.services.bdsync.lease import lease_name
from convoys.services.bdsync.run import (
    SyncReport,
    forget,
    passes,
    recent,
    sync,
    sync_configured,
)
from convoys.services.bdsync.sources import (
    CommandSource,
    FileSource,
    Source,
    SyncFailed,
    configured,
    source_for,
)

__all__ = [
    "CommandSource",
    "FileSource",
    "Source",
    "SyncFailed",
    "SyncReport",
    "configured",
    "forget",
    "lease_name",
    "passes",
    "recent",
    "source_for",
    "sync",
    "sync_configured",
]
