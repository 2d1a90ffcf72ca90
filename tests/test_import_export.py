"""bd JSONL import and export through `manage.py beads import|export`.

An export after an import gives the file back. The only differences allowed (the same list
as in convoys/services/jsonl/, checked below on the real files and on our own fixtures):
- lines `bd import` skips are not imported, so not exported: tombstones, wisps (ephemeral),
  memory lines without a key or a value;
- a line bd did not write with Go's encoder (steveyegge+beads+issues.jsonl went through
  Python's json.dumps) comes back as Go writes the same record: the same keys in the same
  order with the same values, no spaces between tokens, <, >, &, U+2028, U+2029 escaped;
- a line out of bd's order (one appended to steveyegge+gastown+issues.jsonl) comes back in
  its place in bd's order;
- keys with an empty value ("", [], null, false) are left out, as Go's omitempty does (no
  real file has any); a dependency's metadata given as an object comes back as a string;
- on PostgreSQL, objects nested in unknown keys (e.g. `metadata`) keep jsonb's key order.
"""

import io
import json
from datetime import datetime

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from convoys.core import beadfile
from convoys.infra import readahead
from convoys.models import Bead, Convoy, Dependency, Event, Memory, Route, TrackedBead
from convoys.services import jsonl
from convoys.services.jsonl import reading

from .support.factories import RFC3339
from .support.paths import FIXTURES, shared_file

REAL_FILES = {
    # file: (beads, convoys, tombstones, wisps)
    "steveyegge+beads+issues.jsonl": (150, 2, 0, 552),
    "steveyegge+beads+issues@ce622f5.jsonl": (2356, 47, 3319, 0),
    "steveyegge+gastown+issues.jsonl": (2668, 0, 1, 0),
    "Cygnus-Wealth+gas-town-hq+issues.jsonl": (1162, 102, 0, 0),
}
# Lines written by Python's json.dumps (", " and ": " between tokens), not by bd's encoder.
NOT_GO_LINES = {"steveyegge+beads+issues.jsonl": 152}
# Lines out of bd's order in the file.
OUT_OF_ORDER = {"steveyegge+gastown+issues.jsonl": {"gt-3qw5s"}}
# Files of our own, one per shape of bd export: bd up to v0.49 (no computed keys, by id),
# `bd list --json` of Feb 2026 (counts and parent), `bd export` since Apr 2026 (`_type`,
# counts, memory lines); nanosecond and offset timestamps, HTML characters, a convoy.
OUR_FILES = ("bd-plain.jsonl", "bd-list.jsonl", "bd-export.jsonl")


@pytest.fixture(params=["in-process", "read-ahead"])
def both_paths(request, monkeypatch):
    """Run the test with records parsed in this process, and in a forked read-ahead child."""
    threshold = 0 if request.param == "read-ahead" else 10**12
    monkeypatch.setattr(reading, "READ_AHEAD_MIN_BYTES", threshold)
    children = []
    in_child = readahead.in_child

    def counted(*args):
        children.append(args)
        return in_child(*args)

    monkeypatch.setattr(readahead, "in_child", counted)
    yield request.param
    assert bool(children) == (request.param == "read-ahead")


def counts():
    return (
        Bead.objects.count(),
        Dependency.objects.count(),
        Convoy.objects.count(),
        TrackedBead.objects.count(),
        Event.objects.count(),
        Route.objects.count(),
        Memory.objects.count(),
    )


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_small_fixture_imports_with_routes(db, both_paths):
    out, _ = run(
        "beads",
        "import",
        str(FIXTURES / "small.jsonl"),
        "--routes",
        str(FIXTURES / "routes.jsonl"),
        "--json",
    )
    report = json.loads(out)
    assert report["beads_created"] == 5
    assert report["convoys_created"] == 1
    assert report["skipped_tombstones"] == 1 and report["skipped_wisps"] == 1
    assert report["routes"] == 3
    a2 = Bead.objects.get(pk="gt-a2")
    assert a2.rig_id == "gastown" and a2.issue_type == "feature"
    assert a2.extra == {"custom_field": {"kept": True}}
    # external:<x>:<id> unwrapped, the original kept; dangling targets kept
    dep = Dependency.objects.get(issue_id="gt-a3", depends_on_id="bd-zz9")
    assert dep.raw_target == "external:bd:bd-zz9"
    assert Dependency.objects.filter(issue_id="gt-a4", depends_on_id="gt-gone").exists()
    convoy = Convoy.objects.get(pk="hq-cv-abc12")
    assert convoy.owner == "mayor/" and convoy.merge_strategy == "direct"
    assert list(convoy.tracked.values_list("bead_id", flat=True)) == ["gt-a2", "ri-q7"]
    # nine fractional digits and an offset
    assert Bead.objects.get(pk="gt-a1").created_at.isoformat() == "2026-01-05T17:01:00.123456+00:00"
    assert Event.objects.filter(kind="bead.created").count() == 5


def test_reimport_updates_in_place(db, both_paths):
    path = str(FIXTURES / "small.jsonl")
    run("beads", "import", path)
    before = counts()
    out, _ = run("beads", "import", path, "--json")
    report = json.loads(out)
    assert report["beads_unchanged"] == 5 and report["beads_created"] == 0
    assert counts() == before  # no duplicates, no new events
    kept = set(Dependency.objects.values_list("id", flat=True))
    run("beads", "import", path)
    assert set(Dependency.objects.values_list("id", flat=True)) == kept  # not rewritten


def test_reimport_with_a_changed_dependency_updates_that_bead(db, tmp_path):
    path = FIXTURES / "small.jsonl"
    run("beads", "import", str(path))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    a2 = next(r for r in records if r["id"] == "gt-a2")
    a2["dependencies"].append({"issue_id": "gt-a2", "depends_on_id": "gt-z9", "type": "blocks"})
    target = tmp_path / "changed.jsonl"
    target.write_text("".join(json.dumps(r) + "\n" for r in records))
    before = Event.objects.count()
    out, _ = run("beads", "import", str(target), "--json")
    report = json.loads(out)
    assert (report["beads_updated"], report["beads_unchanged"]) == (1, 4)
    event = Event.objects.get(seq__gt=before)
    assert (event.kind, event.bead_id, event.data["changes"]) == (
        "bead.updated",
        "gt-a2",
        ["dependencies"],
    )
    targets = Dependency.objects.filter(issue_id="gt-a2").order_by("id")
    assert list(targets.values_list("depends_on_id", flat=True))[-1] == "gt-z9"
    # and back: the dependency removed again is an update too
    run("beads", "import", str(path))
    assert not Dependency.objects.filter(issue_id="gt-a2", depends_on_id="gt-z9").exists()
    assert Event.objects.filter(bead_id="gt-a2", kind="bead.updated").count() == 2


def test_reimport_with_a_close_writes_a_close_event(db, tmp_path):
    path = FIXTURES / "small.jsonl"
    run("beads", "import", str(path))
    changed = path.read_text().replace(
        '"id":"gt-a2","title":"Build the thing","status":"open"',
        '"id":"gt-a2","title":"Build the thing","status":"closed","closed_at":"2026-01-09T00:00:00Z"',
    )
    target = tmp_path / "changed.jsonl"
    target.write_text(changed)
    run("beads", "import", str(target))
    assert Bead.objects.get(pk="gt-a2").status == "closed"
    assert Event.objects.filter(kind="bead.closed", bead_id="gt-a2").count() == 1


def test_export_round_trip(db, tmp_path, both_paths):
    run("beads", "import", str(FIXTURES / "small.jsonl"))
    first = tmp_path / "first.jsonl"
    run("beads", "export", "-o", str(first))
    records = [json.loads(line) for line in first.read_text().splitlines()]
    by_id = {r["id"]: r for r in records}
    assert by_id["gt-a2"]["custom_field"] == {"kept": True}
    assert by_id["gt-a3"]["dependencies"][2]["depends_on_id"] == "external:bd:bd-zz9"
    assert by_id["hq-cv-abc12"]["issue_type"] == "convoy"
    assert "Owner: mayor/" in by_id["hq-cv-abc12"]["description"]
    Bead.objects.all().delete()
    Convoy.objects.all().delete()
    run("beads", "import", str(first))
    second = tmp_path / "second.jsonl"
    run("beads", "export", "-o", str(second))
    assert first.read_text() == second.read_text()


BAD_LINES = [
    (
        "invalid JSON",
        b'{"id": "gt-x1", "title": oops}\n',
        "invalid JSON (Expecting value at character 26)",
    ),
    ("not an object", b'["gt-x1"]\n', "expected a JSON object"),
    ("missing id", b'{"title": "no id"}\n', "missing required field 'id'"),
    (
        "wrong type",
        b'{"id": "gt-x1", "title": "t", "priority": "high"}\n',
        "field 'priority': expected integer, got string",
    ),
    ("NaN", b'{"id": "gt-x1", "title": "t", "priority": NaN}\n', "NaN is not valid JSON"),
    ("bad UTF-8", b'{"id": "gt-x1", "title": "\xff\xfe"}\n', "invalid UTF-8"),
    (
        "bad timestamp",
        b'{"id": "gt-x1", "title": "t", "created_at": "yesterday"}\n',
        "field 'created_at': invalid timestamp",
    ),
    (
        "bad dependency",
        b'{"id": "gt-x1", "title": "t", "dependencies": [{"type": "blocks"}]}\n',
        "dependencies[0].depends_on_id",
    ),
    ("duplicate id", b'{"id": "gt-epic1", "title": "again"}\n', "duplicate id 'gt-epic1'"),
    (
        "NUL character",
        b'{"id": "gt-x1", "title": "t", "labels": ["ok", "a\\u0000b"]}\n',
        "field 'labels[1]': contains a NUL character",
    ),
    ("shell in an id", b'{"id": "cm2-$(id)", "title": "t"}\n', "field 'id': id character '$'"),
    ("slash in an id", b'{"id": "gt-a/b", "title": "t"}\n', "field 'id': id character '/'"),
    ("braces in an id", b'{"id": "gt-{rig}", "title": "t"}\n', "field 'id': id character '{'"),
    ("option as an id", b'{"id": "--output=FILE", "title": "t"}\n', "must start with a letter"),
    ("long id", b'{"id": "gt-' + b"x" * 253 + b'", "title": "t"}\n', "is 256 characters long"),
    (
        "long convoy id",
        b'{"id": "hq-cv-' + b"x" * 59 + b'", "title": "t", "issue_type": "convoy"}\n',
        "field 'id': convoy id is 65 characters long (at most 64)",
    ),
    (
        "option as an assignee",
        b'{"id": "gt-x1", "title": "t", "assignee": "-rf"}\n',
        "field 'assignee': must not start with '-'",
    ),
    (
        "newline in a dependency target",
        b'{"id": "gt-x1", "title": "t", "dependencies": [{"depends_on_id": "gt-a\\nb"}]}\n',
        "field 'dependencies[0].depends_on_id': contains the control or format character",
    ),
    (
        "lone surrogate",
        b'{"id": "gt-x1", "title": "t\\ud800", "priority": 2}\n',
        "field 'title': contains a lone surrogate '\\ud800' (U+D800)",
    ),
    (
        "lone surrogate in an unknown key",
        b'{"id": "gt-x1", "title": "t", "notes_\\udc00": {"a": ["\\udfff"]}}\n',
        "contains a lone surrogate",
    ),
    ("priority -5", b'{"id": "gt-x1", "title": "t", "priority": -5}\n', "expected 0..4, got -5"),
    ("priority 99", b'{"id": "gt-x1", "title": "t", "priority": 99}\n', "expected 0..4, got 99"),
    (
        "convoy status nothing can move",
        b'{"id": "hq-cv-x1", "title": "t", "issue_type": "convoy", "status": "hooked"}\n',
        "field 'status': convoy status 'hooked' is not one of open, closed",
    ),
    (
        "bad completion_notified_at",
        b'{"id": "hq-cv-x1", "title": "t", "issue_type": "convoy", '
        b'"description": "Owner: mayor\\ncompletion_notified_at: soon"}\n',
        "field 'description': completion_notified_at: invalid timestamp 'soon'",
    ),
    (
        "no UTC equivalent",
        b'{"id": "gt-x1", "title": "t", "created_at": "0001-01-01T00:00:00+08:00"}\n',
        "field 'created_at': invalid timestamp",
    ),
    (
        "a key the import keeps for itself",
        b'{"id": "gt-x1", "title": "t", "_created_at": "2026-01-01T00:00:00Z"}\n',
        "field '_created_at': reserved for convoyweb's own bookkeeping",
    ),
    (
        "a dependency key the import keeps for itself",
        b'{"id": "gt-x1", "title": "t", "dependencies": '
        b'[{"depends_on_id": "gt-a1", "_no_metadata": true}]}\n',
        "field 'dependencies[0]._no_metadata': reserved",
    ),
    (
        "negative comment_count",
        b'{"id": "gt-x1", "title": "t", "comment_count": -1}\n',
        "field 'comment_count': expected 0 or more, got -1",
    ),
    (
        "comments not an array",
        b'{"id": "gt-x1", "title": "t", "comments": "none"}\n',
        "field 'comments': expected array, got string",
    ),
    (
        "memory value not a string",
        b'{"_type": "memory", "key": "k", "value": 5}\n',
        "field 'value': expected string, got integer",
    ),
    (
        "NUL in a memory key",
        b'{"_type": "memory", "key": "k\\u0000", "value": "v"}\n',
        "field 'key': contains a NUL character",
    ),
    (
        "long memory key",
        b'{"_type": "memory", "key": "' + b"k" * 256 + b'", "value": "v"}\n',
        "field 'key': is 256 characters long (at most 255)",
    ),
]


@pytest.mark.parametrize("name,line,message", BAD_LINES, ids=[b[0] for b in BAD_LINES])
def test_bad_line_rejects_the_whole_file(db, tmp_path, both_paths, name, line, message):
    run("beads", "import", str(FIXTURES / "small.jsonl"))
    before = counts()
    good = (FIXTURES / "small.jsonl").read_bytes()
    target = tmp_path / "bad.jsonl"
    target.write_bytes(good.replace(b"\n", b"\n", 3)[: good.index(b"\n", 0) + 1] + line + good)
    with pytest.raises(CommandError) as exc:
        run("beads", "import", str(target))
    assert f"{target}:2: " in str(exc.value)
    assert message in str(exc.value)
    assert counts() == before


def test_skipped_convoy_records_are_not_checked_as_convoys(db, tmp_path):
    """bd import skips tombstones and wisps whatever their status: so does this import."""
    target = tmp_path / "skipped.jsonl"
    target.write_text(
        '{"id": "hq-cv-t1", "title": "t", "issue_type": "convoy", "status": "tombstone"}\n'
        '{"id": "hq-cv-w1", "title": "t", "issue_type": "convoy", "status": "hooked", '
        '"ephemeral": true}\n'
    )
    report = jsonl.import_file(target)
    assert (report.skipped_tombstones, report.skipped_wisps, report.convoys) == (1, 1, 0)


def test_truncated_last_line_is_rejected(db, tmp_path, both_paths):
    target = tmp_path / "truncated.jsonl"
    good = (FIXTURES / "small.jsonl").read_bytes()
    target.write_bytes(good + b'{"id": "gt-z9", "title": "cut o')
    with pytest.raises(CommandError, match=r":9: truncated last line"):
        run("beads", "import", str(target))
    assert Bead.objects.count() == 0


def test_oversized_line_is_rejected(db, tmp_path, settings, both_paths):
    settings.CONVOY_IMPORT_MAX_LINE = 1000
    target = tmp_path / "big.jsonl"
    target.write_bytes(b'{"id": "gt-big", "title": "' + b"x" * 5000 + b'"}\n')
    with pytest.raises(CommandError, match=r":1: line is longer than 1000 bytes"):
        run("beads", "import", str(target))
    assert Bead.objects.count() == 0


def test_missing_file_is_one_line_error(db):
    with pytest.raises(CommandError, match="No such file"):
        run("beads", "import", "/nonexistent/issues.jsonl")


def bd_line_order(record):
    """Where bd writes a record: by id, or (Dolt-era files, with computed keys) by priority,
    newest first, then id."""
    if "dependency_count" in record:
        created = datetime.fromisoformat(record["created_at"]).timestamp()
        return (record["priority"], -created, record["id"])
    return (0, 0, record["id"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL_FILES))
def test_real_exports_import_and_come_back_as_they_came(db, tmp_path, name):
    path = shared_file(name)
    routes = shared_file("Cygnus-Wealth+gas-town-hq+routes.jsonl") if "Cygnus" in name else None
    report = jsonl.import_file(path, routes_path=routes)
    beads, convoys, tombstones, wisps = REAL_FILES[name]
    lines = path.read_text(encoding="utf-8").splitlines()
    assert (report.beads, report.convoys) == (beads, convoys)
    assert (report.skipped_tombstones, report.skipped_wisps) == (tombstones, wisps)
    assert report.beads + report.convoys + tombstones + wisps == len(lines)
    assert Bead.objects.count() == beads and Convoy.objects.count() == convoys

    exported = tmp_path / "export.jsonl"
    run("beads", "export", "-o", str(exported))
    out = exported.read_text(encoding="utf-8").splitlines()
    kept = [json.loads(line) for line in lines]
    kept = [(r, line) for r, line in zip(kept, lines, strict=True) if not beadfile.skipped(r)]
    out_ids = [json.loads(line)["id"] for line in out]
    in_ids = [r["id"] for r, _ in kept]
    moved = OUT_OF_ORDER.get(name, set())
    assert out_ids == [r["id"] for r, _ in sorted(kept, key=lambda k: bd_line_order(k[0]))]
    assert [i for i in out_ids if i not in moved] == [i for i in in_ids if i not in moved]
    # line by line: each line as it came, or (not written by Go) Go's writing of its record
    by_id = dict(zip(out_ids, out, strict=True))
    rewritten = 0
    for record, line in kept:
        if by_id[record["id"]] != line:
            assert by_id[record["id"]] == beadfile.to_line(record), record["id"]
            rewritten += 1
    assert rewritten == NOT_GO_LINES.get(name, 0)

    # the same file again changes nothing and says so
    events = Event.objects.count()
    again = jsonl.import_file(path, routes_path=routes)
    assert (again.beads_unchanged, again.convoys_unchanged) == (beads, convoys)
    assert Event.objects.count() == events


@pytest.mark.parametrize("name", OUR_FILES)
def test_our_bd_files_come_back_byte_for_byte(db, tmp_path, both_paths, name):
    run("beads", "import", str(FIXTURES / name))
    target = tmp_path / "export.jsonl"
    run("beads", "export", "-o", str(target))
    got, expected = target.read_bytes(), (FIXTURES / name).read_bytes()
    if connection.vendor == "postgresql":
        # jsonb keeps objects nested in unknown keys (metadata) in its own key order: the one
        # documented difference on PostgreSQL (convoys/services/jsonl/). Lines, top-level
        # keys and their order, and every value are still exactly the file's.
        lines = [json.loads(line) for line in got.splitlines()]
        assert lines == [json.loads(line) for line in expected.splitlines()]
        assert [list(line) for line in lines] == [
            list(json.loads(line)) for line in expected.splitlines()
        ]
    else:
        assert got == expected


def exported():
    out, _ = run("beads", "export")
    return [json.loads(line) for line in out.splitlines()]


def exported_by_id():
    return {record.get("id"): record for record in exported()}


def test_counts_and_parent_are_recomputed_from_the_stored_rows(db):
    run("beads", "import", str(FIXTURES / "bd-list.jsonl"))
    run("beads", "dep", "add", "ls-a", "ls-c")  # ls-a now waits for ls-c too
    run("beads", "dep", "add", "ls-c", "ls-a", "--type", "parent-child")
    records = exported_by_id()
    assert (records["ls-a"]["dependency_count"], records["ls-c"]["dependent_count"]) == (1, 2)
    assert records["ls-c"]["parent"] == "ls-a"
    # its comments were not in the file, so the count that came with it stays
    assert records["ls-a"]["comment_count"] == 2
    run("beads", "dep", "remove", "ls-b", "ls-c")
    records = exported_by_id()
    assert (records["ls-b"]["dependency_count"], records["ls-c"]["dependent_count"]) == (0, 1)
    assert records["ls-b"]["parent"] == "ls-a"


def test_counts_follow_kept_comments_and_a_file_without_them_gets_none(db, tmp_path):
    run("beads", "import", str(FIXTURES / "bd-export.jsonl"))
    target = tmp_path / "more.jsonl"
    record = next(r for r in exported() if r.get("id") == "ex-b")
    record["comments"].append(dict(record["comments"][0], id="c-2", text="done"))
    target.write_text(json.dumps(record) + "\n")
    run("beads", "import", str(target))
    assert exported_by_id()["ex-b"]["comment_count"] == 2

    for model in (Bead, Convoy, Memory):
        model.objects.all().delete()
    run("beads", "import", str(FIXTURES / "bd-plain.jsonl"))
    run("beads", "dep", "add", "pl-1", "pl-2", "--type", "parent-child")
    for record in exported():
        assert not record.keys() & {"_type", "dependency_count", "comment_count", "parent"}


def test_a_changed_timestamp_is_rfc3339_in_its_offset_and_the_others_keep_their_text(db):
    run("beads", "import", str(FIXTURES / "bd-list.jsonl"))
    run("beads", "close", "ls-b", "--reason", "done")
    bead = Bead.objects.get(pk="ls-b")
    record = exported_by_id()["ls-b"]
    assert record["created_at"] == "2026-02-21T10:00:00.123456789-08:00"
    assert record["dependencies"][0]["created_at"] == "2026-02-21T10:00:00.123456789-08:00"
    # a changed time in the offset its text had; a new one (no text) in UTC
    assert RFC3339.fullmatch(record["updated_at"]) and record["updated_at"].endswith("-08:00")
    assert RFC3339.fullmatch(record["closed_at"]) and record["closed_at"].endswith("Z")
    for name in ("updated_at", "closed_at"):
        assert datetime.fromisoformat(record[name]) == getattr(bead, name)
    assert exported_by_id()["ls-a"]["updated_at"] == "2026-02-20T10:00:00Z"


def test_a_bead_made_here_takes_the_shape_and_place_bd_gives_it(db):
    run("beads", "import", str(FIXTURES / "bd-export.jsonl"))
    run("beads", "create", "Made here", "--id", "ex-new", "--priority", "4")
    records = exported()
    made = records[-3]  # the lowest priority, before the memory lines
    assert list(made)[:3] == ["_type", "id", "title"] and made["id"] == "ex-new"
    assert (made["dependency_count"], made["dependent_count"], made["comment_count"]) == (0, 0, 0)
    assert RFC3339.fullmatch(made["created_at"]) and made["created_at"].endswith("Z")
    assert [r["_type"] for r in records[-2:]] == ["memory", "memory"]


def test_memory_lines_are_kept_updated_and_written_last_by_key(db, tmp_path):
    out, _ = run("beads", "import", str(FIXTURES / "bd-export.jsonl"))
    assert "  2 memories (kept for the export)" in out.splitlines()
    assert dict(Memory.objects.values_list("key", "value")) == {
        "deploy-window": "Fridays < 5pm & never on holidays",
        "owner": "mayor",
    }
    changed = tmp_path / "memories.jsonl"
    owner = '{"_type": "memory", "key": "owner", "value": "deacon"}'
    changed.write_text(
        owner + "\n"
        '{"_type":"memory","key":"alpha","value":"first"}\n'
        '{"_type":"memory","key":"empty","value":""}\n'
    )
    out, _ = run("beads", "import", str(changed), "--json")
    report = json.loads(out)
    assert (report["memories"], report["skipped_memories"]) == (2, 1)
    lines, _ = run("beads", "export")
    assert lines.splitlines()[-3:] == [
        '{"_type":"memory","key":"alpha","value":"first"}',
        '{"_type":"memory","key":"deploy-window","value":"Fridays \\u003c 5pm \\u0026 never on'
        ' holidays"}',
        owner,  # as it came
    ]


def test_cygnus_convoys_show_unknown_and_never_land(db):
    from convoys.services import convoys, feeding

    jsonl.import_file(
        shared_file("Cygnus-Wealth+gas-town-hq+issues.jsonl"),
        routes_path=shared_file("Cygnus-Wealth+gas-town-hq+routes.jsonl"),
    )
    open_before = set(Convoy.objects.filter(status="open").values_list("pk", flat=True))
    assert open_before
    convoys.check()
    feeding.stranded_scan()
    assert set(Convoy.objects.filter(status="open").values_list("pk", flat=True)) == open_before
    out, _ = run("convoy", "status", sorted(open_before)[0])
    assert "?" in out and "(not in database)" in out


def test_a_failed_write_stops_the_read_ahead_and_changes_nothing(db, tmp_path, monkeypatch):
    import multiprocessing

    monkeypatch.setattr(reading, "READ_AHEAD_MIN_BYTES", 0)
    path = tmp_path / "many.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"gt-m{i}", "title": f"bead {i}"}) + "\n" for i in range(5000))
    )
    write = jsonl.Importer._beads
    calls = []

    def failing(self, batch):
        calls.append(len(batch))
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return write(self, batch)

    monkeypatch.setattr(jsonl.Importer, "_beads", failing)
    before = counts()
    try:
        jsonl.import_file(path)
    except RuntimeError as exc:
        # the traceback keeps the import's frames alive, as in any caller's handler: the
        # child must be gone already, not waiting for the generator to be collected
        assert str(exc) == "disk full"
        assert multiprocessing.active_children() == []
    else:
        pytest.fail("the import did not fail")
    assert calls == [1000, 1000]
    assert counts() == before


def lines_of(count):
    return [json.dumps({"id": f"gt-d{i}", "title": f"bead {i}"}) for i in range(count)]


@pytest.mark.parametrize(
    "later,expected",
    [
        # a repeat 1,500 lines later, in another batch
        (
            {1501: '{"id": "gt-d7", "title": "again"}'},
            ":1502: duplicate id 'gt-d7' (first on line 8)",
        ),
        # ... is reported before a bad line after it in the same batch
        (
            {1501: '{"id": "gt-d7", "title": "again"}', 1600: "{oops"},
            ":1502: duplicate id 'gt-d7'",
        ),
        # ... and after a bad line before it
        ({1400: "{oops", 1501: '{"id": "gt-d7", "title": "again"}'}, ":1401: invalid JSON"),
        # two repeats in one batch: the earlier line is reported
        (
            {1501: '{"id": "gt-d9", "title": "x"}', 1502: '{"id": "gt-d3", "title": "y"}'},
            ":1502: duplicate id 'gt-d9' (first on line 10)",
        ),
        # an earlier-batch repeat comes before a repeat within the batch
        (
            {1501: '{"id": "gt-d2", "title": "x"}', 1510: '{"id": "gt-d1505", "title": "y"}'},
            ":1502: duplicate id 'gt-d2' (first on line 3)",
        ),
    ],
)
def test_duplicate_ids_across_batches_name_their_first_line(
    db, tmp_path, both_paths, later, expected
):
    lines = lines_of(3000)
    for index, text in later.items():
        lines[index] = text
    path = tmp_path / "dups.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(jsonl.ImportFailed) as exc:
        jsonl.import_file(path)
    assert expected in str(exc.value)
    assert Bead.objects.count() == 0


def test_a_killed_read_ahead_is_a_one_line_error_and_changes_nothing(db, tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(reading, "READ_AHEAD_MIN_BYTES", 0)
    path = tmp_path / "many.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"gt-k{i}", "title": "t"}) + "\n" for i in range(3000))
    )
    prepare = jsonl.prepare

    def dying(record, routes, now):
        if record["id"] == "gt-k2500":
            os.kill(os.getpid(), 9)  # in the child: as the out-of-memory killer would
        return prepare(record, routes, now)

    monkeypatch.setattr(reading, "prepare", dying)
    before = counts()
    with pytest.raises(jsonl.ImportFailed, match=r"many.jsonl: the read-ahead process ended"):
        jsonl.import_file(path)
    assert counts() == before


def test_an_import_reports_what_the_entry_rules_would_refuse(db, tmp_path):
    """An export may hold what no write here accepts (a cycle, work under way with nobody on
    it, a close before its blocker): the import keeps the records and names them."""
    target = tmp_path / "odd.jsonl"
    lines = [
        {
            "id": "gt-c1",
            "title": "a",
            "status": "open",
            "dependencies": [{"issue_id": "gt-c1", "depends_on_id": "gt-c2", "type": "blocks"}],
        },
        {
            "id": "gt-c2",
            "title": "b",
            "status": "open",
            "dependencies": [{"issue_id": "gt-c2", "depends_on_id": "gt-c1", "type": "blocks"}],
        },
        {"id": "gt-w1", "title": "c", "status": "in_progress"},
        {
            "id": "gt-e1",
            "title": "d",
            "status": "closed",
            "dependencies": [{"issue_id": "gt-e1", "depends_on_id": "gt-w1", "type": "blocks"}],
        },
    ]
    target.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out, _ = run("beads", "import", str(target))
    assert "warning: gt-w1: hooked or in progress with nobody assigned" in out
    assert "warning: gt-e1: closed while a blocker is not done" in out
    assert "warning: a blocking cycle gt-c2 → gt-c1 → gt-c2: staging refuses it" in out
    assert Bead.objects.get(pk="gt-w1").status == "in_progress"  # kept as it came
    clean = tmp_path / "clean.jsonl"
    clean.write_text(json.dumps({"id": "gt-z1", "title": "z", "status": "open"}) + "\n")
    Bead.objects.all().delete()
    assert jsonl.import_file(clean).warnings == []
