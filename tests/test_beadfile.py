"""bd JSONL records without a database: the reading and checking that the import builds on."""

import io
import subprocess
import sys

import pytest

from convoys import beadfile

from .conftest import ROOT


def read(text, max_line=1000):
    return list(beadfile.read_records(io.BytesIO(text), "f.jsonl", max_line))


def test_the_module_needs_no_django():
    code = "import sys, convoys.beadfile; print(any(m.startswith('django') for m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False"


def test_records_keep_their_line_numbers_and_skip_blank_lines():
    records = read(b'{"id": "gt-1", "title": "a"}\n\n   \n{"id": "gt-2", "title": "b"}\n')
    assert [(n, r["id"]) for n, r in records] == [(1, "gt-1"), (4, "gt-2")]


@pytest.mark.parametrize(
    "line,message",
    [
        (b'{"id": "gt-1", "labels": "x"}\n', "f.jsonl:1: field 'labels': expected an array"),
        (b'{"id": ""}\n', "f.jsonl:1: field 'id': expected a non-empty string, got string"),
        (b'{"id": "gt-1", "created_at": "2026-01-01T00:00:00"}\n', "invalid timestamp"),
        (b'{"id": "gt-1", "title": "' + b"x" * 2000 + b'"}\n', "longer than 1000 bytes"),
    ],
)
def test_a_bad_line_names_file_line_and_field(line, message):
    with pytest.raises(beadfile.BadLine, match=message):
        read(line)


@pytest.mark.parametrize(
    "record,reason",
    [
        ({"id": "m", "_type": "memory"}, "memories"),
        ({"id": "t", "status": "tombstone"}, "tombstones"),
        ({"id": "w", "ephemeral": True}, "wisps"),
        ({"id": "w", "wisp": True}, "wisps"),
        ({"id": "b", "status": "open"}, None),
    ],
)
def test_what_bd_import_skips(record, reason):
    assert beadfile.skipped(record) == reason


def test_dependencies_unwrap_external_targets_and_keep_the_first_of_a_repeat():
    record = {
        "id": "gt-1",
        "dependencies": [
            {"depends_on_id": "external:bd:bd-9", "type": "blocks", "metadata": "{}"},
            {"depends_on_id": "bd-9", "type": "related"},
            {"depends_on_id": "gt-2", "extra_key": 1},
        ],
    }
    values = beadfile.dependency_values(record)
    assert [(v["depends_on_id"], v["raw_target"], v["type"]) for v in values] == [
        ("bd-9", "external:bd:bd-9", "blocks"),
        ("gt-2", "", "blocks"),
    ]
    assert values[1]["extra"] == {"extra_key": 1, "_no_metadata": True}


def test_seen_ids_refuse_a_repeat_with_its_first_line():
    seen = beadfile.SeenIds("f.jsonl")
    seen.add("gt-1", 1)
    seen.check()
    seen.add("gt-2", 2)
    seen.add("gt-1", 3)
    with pytest.raises(beadfile.BadLine, match="f.jsonl:3: duplicate id 'gt-1' .first on line 1."):
        seen.check()
    seen.close()
