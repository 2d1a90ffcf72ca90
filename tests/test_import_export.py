import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from convoys import readahead
from convoys.models import Bead, Convoy, Dependency, Event, Route, TrackedBead
from convoys.services import jsonl

from .conftest import FIXTURES, shared_file

REAL_FILES = {
    # file: (beads, convoys, tombstones, wisps)
    "steveyegge+beads+issues.jsonl": (150, 2, 0, 552),
    "steveyegge+beads+issues@ce622f5.jsonl": (2356, 47, 3319, 0),
    "steveyegge+gastown+issues.jsonl": (2668, 0, 1, 0),
    "Cygnus-Wealth+gas-town-hq+issues.jsonl": (1162, 102, 0, 0),
}


@pytest.fixture(params=["in-process", "read-ahead"])
def both_paths(request, monkeypatch):
    """Run the test with records parsed in this process, and in a forked read-ahead child."""
    threshold = 0 if request.param == "read-ahead" else 10**12
    monkeypatch.setattr(jsonl, "READ_AHEAD_MIN_BYTES", threshold)
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
    ("invalid JSON", b'{"id": "gt-x1", "title": oops}\n', "invalid JSON"),
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


@pytest.mark.parametrize("name", sorted(REAL_FILES))
def test_real_exports_import_with_matching_counts(db, name):
    path = shared_file(name)
    routes = shared_file("Cygnus-Wealth+gas-town-hq+routes.jsonl") if "Cygnus" in name else None
    report = jsonl.import_file(path, routes_path=routes)
    beads, convoys, tombstones, wisps = REAL_FILES[name]
    lines = sum(1 for line in path.read_bytes().splitlines() if line.strip())
    assert (report.beads, report.convoys) == (beads, convoys)
    assert (report.skipped_tombstones, report.skipped_wisps) == (tombstones, wisps)
    assert report.beads + report.convoys + tombstones + wisps + report.skipped_memories == lines
    assert Bead.objects.count() == beads and Convoy.objects.count() == convoys
    # the same file again changes nothing and says so
    events = Event.objects.count()
    again = jsonl.import_file(path, routes_path=routes)
    assert (again.beads_unchanged, again.convoys_unchanged) == (beads, convoys)
    assert Event.objects.count() == events


def test_real_export_round_trips(db, tmp_path):
    path = shared_file("steveyegge+gastown+issues.jsonl")
    jsonl.import_file(path)
    first = tmp_path / "a.jsonl"
    with first.open("w") as stream:
        jsonl.export_to(stream)
    originals = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        originals[record["id"]] = record
    exported = [json.loads(line) for line in first.read_text().splitlines()]
    for record in exported:
        original = originals[record["id"]]
        for key in ("title", "status", "priority", "issue_type", "assignee", "close_reason"):
            assert record.get(key) == original.get(key), (record["id"], key)
        assert len(record.get("dependencies", [])) == len(original.get("dependencies", []))
    Bead.objects.all().delete()
    jsonl.import_file(first)
    second = tmp_path / "b.jsonl"
    with second.open("w") as stream:
        jsonl.export_to(stream)
    assert first.read_text() == second.read_text()


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

    monkeypatch.setattr(jsonl, "READ_AHEAD_MIN_BYTES", 0)
    path = tmp_path / "many.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"gt-m{i}", "title": f"bead {i}"}) + "\n" for i in range(5000))
    )
    write = jsonl._Importer._beads
    calls = []

    def failing(self, batch):
        calls.append(len(batch))
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return write(self, batch)

    monkeypatch.setattr(jsonl._Importer, "_beads", failing)
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

    monkeypatch.setattr(jsonl, "READ_AHEAD_MIN_BYTES", 0)
    path = tmp_path / "many.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"gt-k{i}", "title": "t"}) + "\n" for i in range(3000))
    )
    prepare = jsonl._prepare

    def dying(record, routes, now):
        if record["id"] == "gt-k2500":
            os.kill(os.getpid(), 9)  # in the child: as the out-of-memory killer would
        return prepare(record, routes, now)

    monkeypatch.setattr(jsonl, "_prepare", dying)
    before = counts()
    with pytest.raises(jsonl.ImportFailed, match=r"many.jsonl: the read-ahead process ended"):
        jsonl.import_file(path)
    assert counts() == before
