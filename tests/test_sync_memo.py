"""A sync pass skips what the last good pass read the same: chunks
of the source found byte for byte, and a file whose identity has not changed, while no pass
has written since; what is not the same is read line by line as before."""

import json
import os
import subprocess
import sys
import time
from unittest.mock import patch

import pytest

from convoys.core import beadfile
from convoys.models import Bead, Event, Memory, SourcedRecord, SyncMemo
from convoys.services import bdsync
from convoys.services.bdsync import memo, reader, run

from .support.paths import ROOT
from .support.processes import child_env


def bead(i, **fields):
    return {
        "id": f"gt-m{i:03d}",
        "title": f"Bead {i}",
        "status": "open",
        "priority": 2,
        "issue_type": "task",
        "created_at": "2026-11-30T09:00:00Z",
        **fields,
    }


def write(path, lines):
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of about three lines, a window of about ten: a small file spans many."""
    monkeypatch.setattr(reader, "CHUNK", 300)
    monkeypatch.setattr(reader, "WINDOW", 1000)
    monkeypatch.setattr(reader, "HEAD", 16)


@pytest.fixture
def town(tmp_path):
    path = tmp_path / "town.jsonl"
    write(path, [bead(i) for i in range(40)])
    return path


def checked():
    """Counts the records the checks read (a known line is not read)."""
    calls = []
    original = beadfile._check

    def check(record):
        calls.append(record.get("id"))
        return original(record)

    return calls, patch("convoys.core.beadfile._check", side_effect=check)


def looked_up():
    """Counts the lines looked up in the database (a line of a chunk known is not)."""
    seen = []
    original = reader._stored

    def stored(ids, lines):
        seen.extend([*ids, *lines])
        return original(ids, lines)

    return seen, patch.object(reader, "_stored", side_effect=stored)


def test_only_the_changed_lines_are_read_and_written(routes, town, small_chunks):
    source = bdsync.FileSource(town)
    assert bdsync.sync(source).created == 40
    assert len(memo.MEMOS[str(town)].chunks) > 5
    lines = [bead(i) for i in range(40)]
    lines[17]["title"] = "Renamed in bd"
    lines.insert(30, bead(99))  # a new line between two chunks
    write(town, lines)
    calls, checks = checked()
    seen, lookups = looked_up()
    with checks, lookups:
        report = bdsync.sync(source)
    assert (report.created, report.updated, report.missing, report.records) == (1, 1, 0, 41)
    assert calls == ["gt-m017", "gt-m099"]  # the lines of the chunks around them are known
    assert 2 <= len(seen) <= 8  # the changed chunks' lines; the others skipped unread
    assert Bead.objects.get(pk="gt-m017").title == "Renamed in bd"
    calls, checks = checked()
    with checks:
        report = bdsync.sync(source)  # the new chunks are known in turn
    assert report.changed == 0 and report.records == 41 and calls == []
    del lines[5]  # a line dropped: the source is read again for its ids
    write(town, lines)
    report = bdsync.sync(source)
    assert (report.missing, report.records) == (1, 40)
    assert SourcedRecord.objects.get(pk="gt-m005").missing_since is not None
    calls, checks = checked()
    with checks:
        report = bdsync.sync(source)
    assert report.changed == 0 and report.records == 40 and calls == []


def test_a_bad_line_after_skipped_chunks_names_its_line_and_changes_nothing(
    routes, town, small_chunks
):
    source = bdsync.FileSource(town)
    bdsync.sync(source)
    text = town.read_text().splitlines(keepends=True)
    text[2] = text[2].replace("Bead 2", "Closed in bd").replace('"open"', '"closed"')
    text[33] = '{"id": "gt-m033", "title": \n'
    town.write_text("".join(text))
    events = Event.objects.count()
    with pytest.raises(bdsync.SyncFailed, match=rf"{town}:34: "):
        bdsync.sync(source)
    assert Event.objects.count() == events and Bead.objects.get(pk="gt-m002").status == "open"


def test_a_memory_line_in_a_skipped_chunk_is_still_compared(routes, town, small_chunks):
    lines = [json.dumps(bead(i)) for i in range(40)]
    memory = json.dumps({"_type": "memory", "key": "town", "value": "the mayor's"})
    lines.insert(20, memory)
    town.write_text("\n".join(lines) + "\n")
    source = bdsync.FileSource(town)
    bdsync.sync(source)
    assert Memory.objects.get(key="town").line == memory
    Memory.objects.filter(key="town").update(line="{}")  # changed by an import meanwhile
    calls, checks = checked()
    with checks:
        report = bdsync.sync(source)
    assert report.changed == 0 and calls == []
    assert Memory.objects.get(key="town").line == memory


def test_a_file_unchanged_since_the_last_pass_is_not_read(routes, town):
    old = time.time() - 60
    os.utime(town, (old, old))
    source = bdsync.FileSource(town)
    bdsync.sync(source)
    with patch.object(run, "Lines", side_effect=AssertionError("the file was read")):
        report = bdsync.sync(source)
    assert report.records == 40 and report.changed == 0
    write(town, [bead(i, title="Renamed") if i == 3 else bead(i) for i in range(40)])
    report = bdsync.sync(source)  # a new modification time: read
    assert report.updated == 1


def test_a_file_just_modified_is_read_even_with_the_same_identity(routes, town, monkeypatch):
    monkeypatch.setattr(run, "RACY_NS", 10**12)  # "just": however slow this machine is
    source = bdsync.FileSource(town)
    bdsync.sync(source)
    assert memo.MEMOS[str(town)].identity is None  # modified too recently to be trusted
    calls, checks = checked()
    with checks:
        report = bdsync.sync(source)
    assert report.changed == 0 and calls == []  # read (its chunks known), not parsed


def test_a_pass_of_another_source_makes_the_memo_stale(routes, town, tmp_path, small_chunks):
    source = bdsync.FileSource(town)
    bdsync.sync(source)
    other = tmp_path / "other.jsonl"
    write(other, [bead(7, title="From the other town")])
    assert bdsync.sync(bdsync.FileSource(other)).updated == 1  # takes gt-m007 over
    report = bdsync.sync(source)  # its chunks unchanged, but the memo's token is gone
    assert report.updated == 1 and Bead.objects.get(pk="gt-m007").title == "Bead 7"
    assert SourcedRecord.objects.get(pk="gt-m007").source == str(town)


def test_a_command_source_is_compared_by_chunks(routes, town, small_chunks):
    source = bdsync.source_for(f"cmd:cat {town}")
    assert bdsync.sync(source).created == 40
    calls, checks = checked()
    with checks:
        report = bdsync.sync(source)
    assert report.changed == 0 and calls == []
    write(town, [bead(i, status="closed") if i == 39 else bead(i) for i in range(40)])
    calls, checks = checked()
    with checks:
        report = bdsync.sync(source)
    assert report.updated == 1 and len(calls) <= 3


def test_a_long_line_across_windows_is_read_whole(routes, town, small_chunks):
    source = bdsync.FileSource(town)
    bdsync.sync(source)
    lines = [bead(i) for i in range(40)]
    lines[10]["description"] = "x" * 5000  # longer than the window
    write(town, lines)
    report = bdsync.sync(source)
    assert report.updated == 1 and Bead.objects.get(pk="gt-m010").description == "x" * 5000


def test_the_memo_is_shared_with_the_next_pass_in_another_process(routes, town, small_chunks):
    source = bdsync.FileSource(town)
    bdsync.sync(source)
    assert SyncMemo.objects.get(source=str(town)).token == memo.current_token(str(town))
    memo.MEMOS.clear()  # another process: only the stored memo
    write(town, [bead(i, status="closed") if i == 20 else bead(i) for i in range(40)])
    seen, lookups = looked_up()
    with lookups:
        report = bdsync.sync(source)
    assert report.updated == 1 and 1 <= len(seen) <= 4
    memo.MEMOS.clear()
    seen, lookups = looked_up()
    with lookups:
        report = bdsync.sync(source)  # the memo the writing pass stored
    assert report.changed == 0 and seen == []
    SyncMemo.objects.update(chunks=b"")  # would fail to decode: not read when not current
    memo.new_token(str(town))
    assert bdsync.sync(source).changed == 0
    SyncMemo.objects.update(chunks=b"[1, 2]")  # current, but not a memo: the source is read
    memo.MEMOS.clear()
    assert bdsync.sync(source).changed == 0


def test_ids_sum_the_same_in_every_process():
    code = (
        "import django; django.setup(); from convoys.services.bdsync import reader; "
        "print(reader.id_sum([['gt-a', 'gt-b']]))"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            env=child_env(DJANGO_SETTINGS_MODULE="convoyweb.settings", PYTHONHASHSEED=seed),
        ).stdout
        for seed in (1, 2)
    }
    assert runs == {f"{reader.id_sum([['gt-a', 'gt-b']])}\n"}


def test_chunks_moved_or_many_dropped_are_still_found(routes, town, small_chunks):
    source = bdsync.FileSource(town)
    bdsync.sync(source)
    lines = town.read_text().splitlines(keepends=True)
    town.write_text("".join(lines[21:] + lines[:21]))  # the first half moved to the end
    seen, lookups = looked_up()
    with lookups:
        report = bdsync.sync(source)
    assert report.changed == 0 and report.records == 40 and len(seen) <= 8
    lines = town.read_text().splitlines(keepends=True)
    town.write_text("".join(lines[:5] + lines[25:]))  # twenty lines in a row dropped
    seen, lookups = looked_up()
    with lookups:
        report = bdsync.sync(source)
    assert report.missing == 20 and report.records == 20 and len(seen) <= 8


def test_a_pass_of_another_source_leaves_the_memo_when_it_takes_nothing(routes, town, tmp_path):
    source = bdsync.FileSource(town)
    bdsync.sync(source)
    other = tmp_path / "other.jsonl"
    write(other, [bead(100 + i) for i in range(3)])
    assert bdsync.sync(bdsync.FileSource(other)).created == 3
    del memo.MEMOS[str(town)]  # the stored memo only, as in another process
    seen, lookups = looked_up()
    with lookups:
        report = bdsync.sync(source)
    assert report.changed == 0 and seen == []


def test_a_record_taken_while_a_pass_writes_leaves_no_memo(routes, town, monkeypatch):
    source = bdsync.FileSource(town)
    bdsync.sync(source)
    write(town, [bead(i, status="closed") if i == 1 else bead(i) for i in range(40)])
    write_pass = run._write

    def taken_meanwhile(*args, **kwargs):
        memo.new_token(str(town))  # another source's pass took one of the town's records
        return write_pass(*args, **kwargs)

    monkeypatch.setattr(run, "_write", taken_meanwhile)
    assert bdsync.sync(source).updated == 1
    assert str(town) not in memo.MEMOS
    assert SyncMemo.objects.get(source=str(town)).token != memo.current_token(str(town))
    monkeypatch.setattr(run, "_write", write_pass)
    seen, lookups = looked_up()
    with lookups:
        report = bdsync.sync(source)  # read afresh, line by line
    assert report.changed == 0 and len(seen) == 40
