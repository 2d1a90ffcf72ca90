"""bd JSONL records without a database: the reading and checking that the import builds on."""

import io
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convoys.core import beadfile

from .support.factories import RFC3339, moments, rfc3339
from .support.paths import ROOT


def read(text, max_line=1000):
    return list(beadfile.read_records(io.BytesIO(text), "f.jsonl", max_line))


def test_the_module_needs_no_django():
    code = (
        "import sys, convoys.core.beadfile; print(any(m.startswith('django') for m in sys.modules))"
    )
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


def test_lines_are_written_as_go_writes_them():
    record = {"b": "<a & b>\u2028é\t", "a": [1, 2**70]}
    assert beadfile.to_line(record) == (
        '{"b":"\\u003ca \\u0026 b\\u003e\\u2028é\\t","a":[1,1180591620717411303424]}'
    )


@pytest.mark.parametrize(
    "value,zone,text",
    [
        (datetime(2026, 1, 1, 1, 2, 3, 500000, tzinfo=UTC), UTC, "2026-01-01T01:02:03.5Z"),
        (
            datetime(2026, 1, 1, tzinfo=UTC),
            timezone(timedelta(hours=-7)),
            "2025-12-31T17:00:00-07:00",
        ),
        (
            datetime(2026, 1, 1, 0, 0, 0, 120, tzinfo=UTC),
            timezone(timedelta(hours=5, minutes=45)),
            "2026-01-01T05:45:00.00012+05:45",
        ),
        (
            datetime(9999, 12, 31, 23, tzinfo=UTC),
            timezone(timedelta(hours=5)),
            "9999-12-31T23:00:00Z",
        ),
    ],
)
def test_times_are_written_as_go_writes_rfc3339_nano(value, zone, text):
    assert beadfile.format_timestamp(value, zone) == text


@pytest.mark.parametrize(
    "text,kept,changed",
    [
        ("2026-02-14T11:59:05.502615373-07:00", ".502615373-07:00", "-07:00"),
        ("2026-02-28T03:42:10.50Z", ".50Z", "Z"),
        ("2026-01-05T09:00:00+0800", "+0800", "+08:00"),
        ("2026-02-28T03:42:10.5Z", None, "Z"),  # Go's UTC form: the stored value gives it back
        ("2026-01-05 09:00:00+08:00", "2026-01-05 09:00:00+08:00", "+08:00"),
    ],
)
def test_an_unchanged_time_keeps_its_text_and_a_changed_one_its_offset(text, kept, changed):
    assert beadfile.kept_text(text) == kept
    value = beadfile.parse_timestamp(text).astimezone(UTC)
    assert beadfile.export_timestamp(value, kept) == text
    later = beadfile.export_timestamp(value + timedelta(seconds=1, microseconds=1), kept)
    assert beadfile.parse_timestamp(later) == value + timedelta(seconds=1, microseconds=1)
    assert later.endswith(changed) and RFC3339.fullmatch(later)


def test_keys_are_put_in_bds_order_with_unknown_ones_before_the_counts():
    fields = {"parent": "p", "zeta": 1, "labels": ["a"], "id": "x", "_type": "issue", "alpha": 2}
    fields["dependency_count"] = 0
    assert list(beadfile.in_bd_order(fields)) == [
        *("_type", "id", "labels", "zeta", "alpha", "dependency_count", "parent")
    ]


def test_memory_lines_keep_their_text_and_one_without_a_value_is_skipped():
    line = b'{"_type": "memory", "key": "k", "value": "v"}'
    records = read(line + b'\r\n{"_type":"memory","key":"e","value":""}\n')
    assert records[0] == (1, beadfile.MemoryLine("k", "v", line.decode()))
    assert beadfile.skipped(records[1][1]) == "memories"


@settings(max_examples=500, deadline=None)
@given(moment=moments, digits=st.integers(0, 9), zulu=st.booleans())
def test_any_imported_time_is_written_back_as_it_came_while_unchanged(moment, digits, zulu):
    text = rfc3339(moment, digits, zulu)
    stored = beadfile.parse_timestamp(text).astimezone(UTC)  # what the database holds
    kept = beadfile.kept_text(text)
    assert (kept is None) == (beadfile.format_timestamp(stored) == text)
    assert beadfile.export_timestamp(stored, kept) == text
