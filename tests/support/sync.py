"""A small town on disk for `beads sync`, and ways to change it between passes."""

import io
import json

import pytest
from django.core.management import call_command

from .paths import FIXTURES

FIXTURE = FIXTURES / "sync_town.jsonl"


@pytest.fixture
def town(tmp_path):
    """A copy of the fixture town, and a way to rewrite one record in it."""
    path = tmp_path / "town.jsonl"
    path.write_bytes(FIXTURE.read_bytes())
    return path


@pytest.fixture
def synced(routes, town):
    """The fixture town after one sync pass."""
    run_sync(town)
    return town


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rewrite(path, bead_id, **fields):
    lines = []
    for record in records(path):
        if record["id"] == bead_id:
            record.update(fields)
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")


def drop(path, bead_id):
    kept = [json.dumps(r) for r in records(path) if r["id"] != bead_id]
    path.write_text("\n".join(kept) + "\n")


def run_sync(*args, capture=None):
    out = io.StringIO()
    if capture is None:
        call_command("beads", "sync", *map(str, args), "--json", stdout=out)
    else:
        with capture(execute=True):
            call_command("beads", "sync", *map(str, args), "--json", stdout=out)
    return [json.loads(line) for line in out.getvalue().splitlines()]
