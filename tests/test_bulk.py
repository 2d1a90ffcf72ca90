"""Stored rows: the fast text path for timestamps must store exactly what Django would."""

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convoys.core.beadfile import parse_timestamp
from convoys.infra import bulk
from convoys.models import Bead, Event

from .support.factories import moments, rfc3339


@settings(max_examples=500, deadline=None)
@given(moment=moments, digits=st.integers(0, 9), zulu=st.booleans())
def test_text_timestamps_store_as_their_datetimes_do(moment, digits, zulu):
    text = rfc3339(moment, digits, zulu)
    assert bulk._sqlite_datetime(text) == bulk._sqlite_datetime(datetime.fromisoformat(text))


@pytest.mark.parametrize(
    "text",
    ["2026-01-05T09:00:00+0800", "2026-01-05T09:00:00.5+05:45", "2026-01-05T23:59:59.999999-12:00"],
)
def test_other_offset_shapes_take_the_general_path(text):
    expected = datetime.fromisoformat(text).astimezone(UTC).replace(tzinfo=None)
    assert bulk._sqlite_datetime(text) == str(expected)


def test_a_timestamp_with_no_utc_equivalent_is_a_bad_value():
    with pytest.raises(ValueError, match="out of range"):
        parse_timestamp("0001-01-01T00:00:00+08:00")


def test_rows_round_trip_through_stored_values(db):
    table = bulk.table(Bead)
    values = {
        "id": "gt-r1",
        "title": "t",
        "labels": ["a", "b"],
        "extra": {"n": 1},
        "created_at": "2026-01-05T09:00:00.123456789-08:00",
        "updated_at": datetime(2026, 1, 6, tzinfo=UTC),
    }
    back = table.values(table.row(values))
    assert back["created_at"] == datetime(2026, 1, 5, 17, 0, 0, 123456, tzinfo=UTC)
    assert back["updated_at"] == values["updated_at"]
    assert back["labels"] == ["a", "b"] and back["extra"] == {"n": 1}
    table.insert([table.row(values)])
    stored = Bead.objects.get(pk="gt-r1")
    assert stored.created_at == back["created_at"] and stored.labels == ["a", "b"]
    assert bulk.existing_keys(Bead, ["gt-r1", "gt-none"]) == ["gt-r1"]
    assert bulk.table(Event) is bulk.table(Event)


def test_a_bulk_insert_keeps_every_character(db):
    """Enough rows for COPY on PostgreSQL (plain INSERTs on SQLite): tabs, newlines,
    backslashes, quotes and non-ASCII text survive, in columns and in JSON."""
    table = bulk.table(Bead)
    tricky = 'tab\there\nnew line \\N back\\slash "quoted" ünïcødé 🚚 \\u0000-as-text'
    rows = [
        table.row(
            {
                "id": f"gt-c{i}",
                "title": f"{tricky} {i}",
                "labels": [tricky],
                "extra": {"k": tricky, "n": i},
                "created_at": "2026-01-05T09:00:00.5-08:00",
                "updated_at": "2026-01-05T09:00:00Z",
                "closed_at": None,
            }
        )
        for i in range(bulk.COPY_MIN_ROWS + 10)
    ]
    table.insert(rows)
    stored = Bead.objects.get(pk="gt-c7")
    assert stored.title == f"{tricky} 7" and stored.labels == [tricky]
    assert stored.extra == {"k": tricky, "n": 7} and stored.closed_at is None
    assert stored.created_at == datetime(2026, 1, 5, 17, 0, 0, 500000, tzinfo=UTC)
    assert Bead.objects.filter(pk__startswith="gt-c").count() == len(rows)
