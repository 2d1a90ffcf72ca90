"""Search over beads and convoys (the /search/ page, GET /api/search, `read.search`): ids by
prefix, titles, labels, assignees and descriptions, kept true by the database's triggers for
every write path (the services, `beads import`, `beads sync`, the bulk loader, deletes), and
any text a person or a tool sends searched as plain words, never an error. Runs on SQLite
and, in the PostgreSQL pass, on PostgreSQL."""

import importlib
import io
import json
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from convoys.infra import bulk
from convoys.models import Bead, Convoy, Rig
from convoys.read import search
from convoys.services import beads, controls, convoys, demo

from .support.databases import require_postgres
from .support.factories import bead
from .support.paths import FIXTURES
from .support.sync import rewrite, run_sync
from .support.users import logged_in, viewer

pytestmark = pytest.mark.django_db


def ids(text, **kwargs):
    return [h.id for h in search.search(text, **kwargs).hits]


@pytest.fixture
def some(routes):
    beads.create_bead(
        "Lay the northern track",
        bead_id="gt-abc",
        description="Sleepers of oak, every forty centimetres",
        labels=["area:rails", "urgent"],
        assignee="gastown/polecats/nux",
        actor="test",
    )
    beads.create_bead("Paint the station", bead_id="gt-abd", actor="test")
    beads.create_bead("Sell the tickets", bead_id="bd-x1", issue_type="epic", actor="test")
    bead("gt-xyz", "Northern signals")
    convoy = convoys.create("Northbound launch", ["gt-abc", "gt-xyz"], owner="mayor/")
    return convoy


def test_ids_match_by_prefix_and_exactly_first(some):
    assert ids("gt-a") == ["gt-abc", "gt-abd"] or set(ids("gt-a")) == {"gt-abc", "gt-abd"}
    assert ids("gt-abd")[0] == "gt-abd"
    assert ids("gt-ab") and set(ids("gt-ab")) == {"gt-abc", "gt-abd"}
    assert ids(some.pk)[0] == some.pk
    assert ids(some.pk[:6]).count(some.pk) == 1  # a convoy id by prefix too


def test_titles_labels_assignees_and_descriptions(some):
    assert set(ids("northern")) == {"gt-abc", "gt-xyz"}
    assert ids("paint station") == ["gt-abd"]
    assert ids("urgent") == ["gt-abc"]
    assert ids("rails") == ["gt-abc"]
    assert ids("nux") == ["gt-abc"]
    assert ids("oak") == ["gt-abc"]
    assert ids("centim") == ["gt-abc"]  # the last word by prefix
    assert ids("Northbound") == [some.pk]
    assert ids("oak paint") == []  # every term must match


def test_hits_carry_kind_status_and_link(some):
    hits = {h.id: h for h in search.search("gt-abc sleepers").hits}
    assert hits["gt-abc"].kind == "bead" and hits["gt-abc"].status == "open"
    assert hits["gt-abc"].url == "/beads/gt-abc/"
    epic = search.search("tickets").hits[0]
    assert (epic.kind, epic.id) == ("epic", "bd-x1")
    convoy = search.search("northbound").hits[0]
    assert convoy.kind == "convoy" and convoy.status == "open" and convoy.url.endswith("/")
    controls.pause(some.pk, actor="test")
    assert search.search("northbound").hits[0].status == "paused"


def test_a_title_hit_ranks_above_a_description_hit(routes):
    beads.create_bead("Routine", bead_id="gt-r1", description="mentions the depot", actor="t")
    beads.create_bead("Depot roof", bead_id="gt-r2", actor="t")
    assert ids("depot") == ["gt-r2", "gt-r1"]


def test_words_of_any_script(routes):
    beads.create_bead("Café am Bahnhof 東京 Ünïcode", bead_id="gt-u1", actor="t")
    assert ids("café") == ["gt-u1"] and ids("東京") == ["gt-u1"] and ids("ÜNÏCODE") == ["gt-u1"]


def test_rigs_by_name(some):
    assert Rig.objects.filter(name="gastown").exists()  # the routes made it
    found = search.search("gast").hits
    assert found[0].kind == "rig" and found[0].id == "gastown"


def test_pages_of_results(routes):
    for i in range(25):
        beads.create_bead(f"Crate {i}", bead_id=f"gt-crate{i:02}", actor="t")
    first = search.search("crate", limit=10)
    assert first.total == 25 and len(first.hits) == 10 and first.next_offset == 10
    last = search.search("crate", limit=10, offset=20)
    assert len(last.hits) == 5 and last.next_offset is None and last.previous_offset == 10
    seen = {h.id for o in (0, 10, 20) for h in search.search("crate", limit=10, offset=o).hits}
    assert len(seen) == 25


def test_many_matches_are_counted_up_to_a_cap(routes, monkeypatch):
    monkeypatch.setattr(search, "COUNT_CAP", 5)
    for i in range(8):
        beads.create_bead(f"Crate {i}", bead_id=f"gt-crate{i}", actor="t")
    found = search.search("crate", limit=2)
    assert found.total == 6 and found.more_than == 5 and found.next_offset == 2
    page = logged_in(viewer("v")).get("/search/", {"q": "crate"}).content.decode()
    assert "More than 5 matches" in page


# --- the index follows every write path -----------------------------------------------------


def test_update_and_delete_through_the_services(some):
    beads.update_bead("gt-abd", title="Repaint the depot", actor="test")
    assert ids("station") == [] and ids("repaint") == ["gt-abd"]
    beads.update_bead("gt-abd", description="blue and gold", assignee="rig/polecats/ace", actor="t")
    assert ids("gold") == ["gt-abd"] and ids("ace") == ["gt-abd"]
    beads.update_bead("gt-abd", status="in_progress", actor="test")
    assert search.search("repaint").hits[0].status == "in_progress"
    demo.reset()
    assert ids("northern") == [] and ids("gt-a") == [] and ids("launch") == []


def test_a_convoy_title_change_follows(some):
    Convoy.objects.filter(pk=some.pk).update(title="Southbound launch")  # any UPDATE
    assert ids("northbound") == [] and ids("southbound") == [some.pk]


def test_import_and_reimport(db, tmp_path):
    small = FIXTURES / "small.jsonl"
    call_command("beads", "import", str(small), stdout=io.StringIO())
    assert set(ids("thing")) == {"gt-a1", "gt-a2", "gt-a3"}
    assert "gt-epic1" in ids("demo")  # a label
    assert search.search("gt-epic").hits[0].kind == "epic"
    assert "hq-cv-abc12" in ids("hq-cv-abc")  # a convoy the import brought
    changed = tmp_path / "changed.jsonl"
    changed.write_text(small.read_text().replace('"Build the thing"', '"Weld the frame"'))
    call_command("beads", "import", str(changed), stdout=io.StringIO())
    assert set(ids("thing")) == {"gt-a1", "gt-a3"} and ids("weld") == ["gt-a2"]


def test_sync_passes(synced):
    assert "gt-s1" in ids("train")
    rewrite(synced, "gt-s1", title="Run the night express")
    run_sync(synced)
    assert ids("train") == [] and ids("express") == ["gt-s1"]


def test_the_bulk_loader(db):
    now = timezone.now()
    rows = [
        {"id": f"gt-bulk{i}", "title": f"Bulk wagon {i}", "created_at": now, "updated_at": now}
        for i in range(60)  # over COPY's threshold on PostgreSQL
    ]
    bulk.insert(Bead, rows)
    assert search.search("wagon").total == 60
    assert ids("gt-bulk59") == ["gt-bulk59"]


@pytest.mark.django_db(transaction=True)
def test_a_flush_empties_the_index(some):
    """Django's flush (TRUNCATE on PostgreSQL, which fires no row trigger) leaves no stale
    row to find or to collide with."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("TRUNCATE convoys_bead CASCADE")
        else:
            cursor.execute("DELETE FROM convoys_bead")
    assert ids("northern") == []
    bead("gt-abc", "Lay the track again")  # the same id again: no stale row in the way
    assert ids("gt-abc") == ["gt-abc"] and ids("oak") == []


# --- any text ---------------------------------------------------------------------------------

HOSTILE = [
    "",
    "   ",
    '"',
    "'",
    '"unclosed',
    "*",
    "**",
    "a*b",
    "NEAR(a b)",
    "AND",
    "OR NOT",
    "title:oak",
    "-oak",
    "^oak",
    "(oak",
    "oak)",
    "{ids}: oak",
    "a & b | !c",
    "<->",
    "a:* <-> b",
    "%_%",
    "\\",
    "'; DROP TABLE convoys_bead; --",
    "\x00",
    "oak\x00",
    "🚂 train",
    "é" * 3000,
    "x" * 10_000,
    "oak " * 2500,
    "gt-" * 3000,
    "0" * 5000,
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_any_text_is_plain_words(some, text):
    found = search.search(text)
    assert found.total >= 0
    client = logged_in(viewer("v"))
    page = client.get("/search/", {"q": text})
    assert page.status_code == 200
    answer = client.get("/api/search", {"q": text})
    if "\x00" in text:
        assert answer.status_code == 422 and "q" in str(answer.json()["detail"])
    else:
        assert answer.status_code == 200, answer.content[:300]


def test_a_lone_surrogate_is_not_a_word(some):
    assert search.search("\ud800 oak").hits[0].id == "gt-abc"
    assert search.search("\ud800").hits == []
    client = logged_in(viewer("v"))
    assert client.get("/search/?q=%ED%A0%80+oak").status_code == 200
    assert client.get("/api/search?q=%ED%A0%80").status_code in (200, 422)


def test_syntax_characters_still_find_the_words(some):
    assert ids('"oak"') == ["gt-abc"]
    assert ids("oak*") == ["gt-abc"]
    assert ids("(urgent)") == ["gt-abc"]
    assert ids("NEAR(oak") == [] or ids("NEAR(oak") == ["gt-abc"]


# --- the page and the API ---------------------------------------------------------------------


def test_the_page(some):
    client = logged_in(viewer("v"))
    html = client.get("/search/", {"q": "gt-a"}).content.decode()
    assert 'href="/beads/gt-abc/"' in html and "2 matches" in html
    assert 'data-kind="bead"' in html
    assert "Nothing matches" in client.get("/search/", {"q": "zebra"}).content.decode()
    bad = client.get("/search/", {"q": "oak", "offset": "x"})
    assert bad.status_code == 422 and b"Offset: a whole number" in bad.content
    said = bad.content.decode()
    assert "not one the search page knows" in said and 'href="/search/?q=oak"' in said
    assert client.get("/search/", {"q": "oak", "offset": "99999"}).status_code == 422


def test_the_page_needs_sign_in(some, client):
    assert client.get("/search/?q=oak").status_code == 302


def test_the_api(some):
    client = logged_in(viewer("v"))
    answer = client.get("/api/search", {"q": "northern", "limit": 1}).json()
    assert answer["total"] == 2 and answer["next"] == 1 and len(answer["hits"]) == 1
    assert set(answer["hits"][0]) == {"kind", "id", "title", "status", "url"}
    assert client.get("/api/search", {"q": "oak", "limit": 0}).status_code == 422
    assert client.get("/api/search", {"q": "oak", "limit": "many"}).status_code == 422
    too_long = client.get("/api/search", {"q": "x" * 20_001})
    assert too_long.status_code == 422 and "q" in str(too_long.json()["detail"])


def test_the_api_needs_credentials(some, client):
    assert client.get("/api/search?q=oak").status_code == 401


def beads_search(*args):
    out = io.StringIO()
    call_command("beads", "search", *args, stdout=out)
    return out.getvalue()


def test_the_command_line(some):
    assert beads_search("gt-abd") == "bead    gt-abd  Paint the station  (open)\n"
    assert "gt-abc" in beads_search("northern", "track", "--json")
    assert json.loads(beads_search("northern", "--json"))["total"] == 2
    assert beads_search("northern", "--limit", "1").endswith("1 of 2 matches (--limit for more).\n")
    assert beads_search('"*"') == "Nothing matches.\n"
    with pytest.raises(CommandError, match="--limit must be 1 to 100"):
        beads_search("oak", "--limit", "0")


# --- the index itself, per vendor ---------------------------------------------------------------


def test_postgresql_keeps_a_gin_index():
    require_postgres()
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'convoys_search'")
        defs = " ".join(row[0] for row in cursor.fetchall())
    assert "gin (doc)" in defs


def test_sqlite_keeps_an_fts5_table():
    if connection.vendor != "sqlite":
        pytest.skip("runs in the SQLite pass")
    with connection.cursor() as cursor:
        cursor.execute("SELECT sql FROM sqlite_master WHERE name = 'convoys_search'")
        assert "fts5" in cursor.fetchone()[0].lower()


def test_the_migration_indexes_what_is_there_and_comes_off_cleanly(some):
    """Its reverse drops the index and the triggers; run again, it indexes every row that is
    there (a database migrated with its beads in place)."""
    step = importlib.import_module("convoys.migrations.0029_search")
    editor = SimpleNamespace(connection=connection)  # what its steps use of a schema editor
    step.backward(None, editor)
    beads.update_bead("gt-abd", title="Repaint the depot", actor="test")  # no trigger now
    step.forward(None, editor)
    assert ids("repaint") == ["gt-abd"] and ids("oak") == ["gt-abc"]
    assert ids("northbound") == [some.pk]
    bead("gt-new", "Fresh rails")  # and the triggers are back
    assert ids("fresh") == ["gt-new"]
