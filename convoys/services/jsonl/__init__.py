"""bd JSONL import and export.

`importer` writes checked records, each change with its event (the file import and the
continuous sync share it); `reading` imports a file in one transaction; `export` writes what
bd writes. This module names what the rest of convoyweb uses.
"""

from convoys.services.jsonl.export import bead_record, convoy_record, export_lines, export_to
from convoys.services.jsonl.importer import BATCH, Importer, ImportFailed, ImportReport, prepare
from convoys.services.jsonl.reading import (
    READ_AHEAD_MIN_BYTES,
    import_file,
    import_routes,
    import_stream,
    rule_warnings,
)

__all__ = [
    "BATCH",
    "READ_AHEAD_MIN_BYTES",
    "ImportFailed",
    "ImportReport",
    "Importer",
    "bead_record",
    "convoy_record",
    "export_lines",
    "export_to",
    "import_file",
    "import_routes",
    "import_stream",
    "prepare",
    "rule_warnings",
]
