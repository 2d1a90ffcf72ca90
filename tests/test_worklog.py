"""The worker's own words: `POST /api/beads/{id}/log` appends lines (token auth), each cut to
CONVOY_LOG_LINE_CHARS, the oldest dropped past CONVOY_LOG_LINES lines or CONVOY_LOG_BYTES
bytes; hostile bodies are refused with one line and change nothing. The bead page's live
update of a log append is its log alone (and equals a reload); the convoy page shows the last
line beside a bead in progress; `beads log ID [--follow]` prints it."""

import re
import threading

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client

from convoys.models import Bead, BeadFacts, ConvoyFacts, Event, LogLine
from convoys.services import staging, worklog
from convoys.services.errors import NotFound, ServiceError
from convoys.services.launch import launch_staged
from convoys.services.tokens import create_token

from .support.factories import bead, command
from .support.pages import as_of, assert_parts_of, live
from .support.users import signed_in, user_with
from .support.waiting import wait_for

CLIENT = Client()


@pytest.fixture
def worker_token(routes):
    bead("gt-a", "Logged")
    return create_token(user_with("worker", "change_bead", "view_bead"), "w")


def post(token, bead_id, raw):
    response = CLIENT.post(
        f"/api/beads/{bead_id}/log",
        data=raw,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    return response.status_code, response.json()


def kept(bead_id="gt-a"):
    return list(
        LogLine.objects.filter(bead_id=bead_id).order_by("id").values_list("text", flat=True)
    )


def snapshot():
    return (Event.objects.count(), kept(), list(BeadFacts.objects.values_list("last_log")))


def test_a_worker_appends_lines_and_reads_them_back(worker_token):
    code, data = post(worker_token, "gt-a", '{"lines": ["compiling", "tests: 3 passed"]}')
    assert code == 200, data
    assert (data["appended"], data["dropped"]) == (2, 0)
    code, data = post(worker_token, "gt-a", '{"lines": ["two\\nlines"]}')
    assert data["appended"] == 2
    assert kept() == ["compiling", "tests: 3 passed", "two", "lines"]
    assert BeadFacts.objects.get(pk="gt-a").last_log == "lines"
    event = Event.objects.filter(kind="bead.log").last()
    assert event.bead_id == "gt-a" and event.data["lines"] == 2
    lines = CLIENT.get("/api/beads/gt-a/log", HTTP_AUTHORIZATION=f"Bearer {worker_token}").json()
    assert [x["text"] for x in lines] == kept()
    after = CLIENT.get(
        f"/api/beads/gt-a/log?after={lines[1]['id']}", HTTP_AUTHORIZATION=f"Bearer {worker_token}"
    ).json()
    assert [x["text"] for x in after] == ["two", "lines"]


def test_bounds_cut_long_lines_and_drop_the_oldest(worker_token, settings):
    settings.CONVOY_LOG_LINE_CHARS = 10
    settings.CONVOY_LOG_LINES = 5
    settings.CONVOY_LOG_BYTES = 1000
    done = worklog.append("gt-a", ["x" * 25], actor="t")
    assert done.cut == 1 and kept() == ["x" * 10]
    worklog.append("gt-a", [f"line {i}" for i in range(4)], actor="t")
    done = worklog.append("gt-a", ["line 4", "line 5"], actor="t")
    assert done.dropped == 2
    assert kept() == [f"line {i}" for i in range(1, 6)]
    # A batch longer than the bound keeps its newest lines.
    done = worklog.append("gt-a", [f"n{i}" for i in range(12)], actor="t")
    assert kept() == [f"n{i}" for i in range(7, 12)]
    # The size bound, in UTF-8 bytes: "é" is two.
    settings.CONVOY_LOG_BYTES = 8
    worklog.append("gt-a", ["éé", "éé"], actor="t")
    assert kept() == ["éé", "éé"]
    assert BeadFacts.objects.get(pk="gt-a").last_log == "éé"


def test_the_defaults_are_safe(settings):
    assert settings.CONVOY_LOG_LINE_CHARS == 2000
    assert settings.CONVOY_LOG_LINES == 1000
    assert settings.CONVOY_LOG_BYTES == 256 * 1024


@pytest.mark.parametrize(
    "raw,field",
    [
        ('"hello"', "body"),
        ("[1, 2]", "body"),
        ('{"lines": "one line"}', "lines"),
        ('{"lines": [1, 2]}', "lines"),
        ('{"lines": ["ok", null]}', "lines"),
        ('{"lines": []}', "lines"),
        ('{"lines": ["a\\u0000b"]}', "lines"),
        ('{"lines": ["\\ud800"]}', "lines"),
        ('{"lines": ["ok"], "extra": 1}', "extra"),
        ("{}", "lines"),
        ("not json", ""),
    ],
)
def test_hostile_bodies_are_refused_and_change_nothing(worker_token, raw, field):
    before = snapshot()
    code, data = post(worker_token, "gt-a", raw)
    assert code in (400, 422), data
    assert field in str(data["detail"])
    assert snapshot() == before


def test_a_huge_body_is_refused(worker_token, settings):
    before = snapshot()
    code, data = post(worker_token, "gt-a", '{"lines": ["' + "x" * 11_000_000 + '"]}')
    assert code == 413 and "detail" in data
    assert snapshot() == before


def test_an_unknown_or_odd_bead_is_a_404_and_changes_nothing(worker_token):
    before = snapshot()
    for bead_id in ("gt-nope", "%2e%2e", "x" * 300):
        code, data = post(worker_token, bead_id, '{"lines": ["hi"]}')
        assert code == 404, (bead_id, data)
        assert "not found" in data["detail"]
    assert snapshot() == before
    with pytest.raises(NotFound):
        worklog.append("gt-nope", ["x"], actor="t")


def test_the_service_refuses_what_is_not_a_list_of_strings(routes):
    bead("gt-s")
    for value, words in ((None, "lines: must be a list"), (["a", 3], "lines[1]: must be a string")):
        with pytest.raises(ServiceError, match=words.replace("[", r"\[").replace("]", r"\]")):
            worklog.append("gt-s", value, actor="t")
    assert kept("gt-s") == []


def test_appending_needs_a_token_with_change_bead(worker_token):
    response = CLIENT.post(
        "/api/beads/gt-a/log", data='{"lines": ["x"]}', content_type="application/json"
    )
    assert response.status_code == 401
    reader = create_token(user_with("reader", "view_bead"), "r")
    code, data = post(reader, "gt-a", '{"lines": ["x"]}')
    assert code == 403
    code, data = post("not-a-token", "gt-a", '{"lines": ["x"]}')
    assert code == 401
    assert kept() == []


def test_a_log_append_is_cheap_for_the_projection_and_the_live_bead_page(routes):
    bead("gt-c")
    plan = staging.stage(["gt-c"], actor="test")
    launch_staged(plan.convoy_id, actor="test")
    graph_seq = ConvoyFacts.objects.get(pk=plan.convoy_id).graph_seq
    facts_seq = BeadFacts.objects.get(pk="gt-c").seq
    client = signed_in("ann", "view_convoy", "view_bead")
    seq = as_of(client.get("/beads/gt-c/").content.decode())
    worklog.append("gt-c", ["<script>alert(1)</script>", "step 2"], actor="api:w")
    assert ConvoyFacts.objects.get(pk=plan.convoy_id).graph_seq == graph_seq
    assert BeadFacts.objects.get(pk="gt-c").seq == facts_seq  # nothing re-derived
    answer = live(client, "/beads/gt-c/", since=seq)
    assert set(answer["fragments"]) == {"bead-log", "unread"}
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in answer["fragments"]["bead-log"]
    page = client.get("/beads/gt-c/").content.decode()
    assert_parts_of(page, answer["fragments"])
    # Not in the history: the lines have their own card.
    start = page.index('id="bead-history"')
    history = page[start : page.index("</section>", start)]
    assert "logged" not in history and "bead.log" not in history


def test_the_convoy_page_shows_the_last_line_beside_a_bead_in_progress(routes):
    bead("gt-d")
    bead("gt-e")
    plan = staging.stage(["gt-d", "gt-e"], actor="test")
    launch_staged(plan.convoy_id, actor="test")
    assert Bead.objects.get(pk="gt-d").status == "hooked"
    client = signed_in("ann", "view_convoy", "view_bead")
    url = f"/convoys/{plan.convoy_id}/"
    first = client.get(url).content.decode()
    seq, layout = as_of(first), re.search(r'data-layout="([^"]+)"', first).group(1)
    worklog.append("gt-d", ["running tests <3>"], actor="api:w")
    answer = live(client, url, since=seq, **{"X-Live-Layout": layout})["fragments"]
    row = answer["bead-row-gt-d"]
    assert "b-lastlog" in row and "running tests &lt;3&gt;" in row
    assert "dag-card" not in answer and "bead-table" not in answer
    page = client.get(url).content.decode()
    assert_parts_of(page, {"bead-row-gt-d": row})
    # A bead not in progress shows no line.
    Bead.objects.filter(pk="gt-d").update(status="open", assignee="")
    assert "running tests" not in client.get(url).content.decode()


def test_beads_log_prints_the_lines(worker_token):
    worklog.append("gt-a", ["first", "second"], actor="t")
    assert command("beads", "log", "gt-a") == "first\nsecond\n"
    with pytest.raises(CommandError, match="not found"):
        command("beads", "log", "gt-nope")
    with pytest.raises(CommandError, match="--every: seconds between polls"):
        command("beads", "log", "gt-a", "--follow", "--every", "nan")
    # A worker's escape sequences reach the terminal as text, never as commands.
    worklog.append("gt-a", ["\x1b]0;owned\x07\x1b[2Jred\tok"], actor="t")
    assert command("beads", "log", "gt-a").splitlines()[-1] == "\\x1b]0;owned\\x07\\x1b[2Jred\tok"


@pytest.mark.django_db(transaction=True)
def test_beads_log_follow_prints_new_lines_as_they_come(routes):
    bead("gt-f")
    worklog.append("gt-f", ["before"], actor="t")
    out: list[str] = []

    class Sink:
        def write(self, text):
            out.append(text)

        def flush(self):
            pass

    def follow():
        try:
            call_command(
                "beads", "log", "gt-f", "--follow", "--every", "0.1", "--for", "4", stdout=Sink()
            )
        finally:
            connection.close()

    thread = threading.Thread(target=follow)
    thread.start()
    wait_for(lambda: "before" in "".join(out), timeout=5)
    worklog.append("gt-f", ["after"], actor="t")
    wait_for(lambda: "after" in "".join(out), timeout=5)
    thread.join(timeout=15)
    assert "".join(out).split() == ["before", "after"]


def test_a_log_append_redraws_nothing_on_the_dashboard(routes):
    bead("gt-g")
    plan = staging.stage(["gt-g"], actor="test")
    launch_staged(plan.convoy_id, actor="test")
    client = signed_in("ann", "view_convoy", "view_bead")
    seq = as_of(client.get("/").content.decode())
    worklog.append("gt-g", ["quiet"], actor="t")
    assert set(live(client, "/", since=seq)["fragments"]) == {"unread", "feeding-stopped"}


def test_log_lines_are_no_step_of_the_convoys_story(routes):
    bead("gt-h")
    plan = staging.stage(["gt-h"], actor="test")
    launch_staged(plan.convoy_id, actor="test")
    client = signed_in("ann", "view_convoy", "view_bead")
    url = f"/convoys/{plan.convoy_id}/"

    def steps():
        page = client.get(url).content.decode()
        return re.search(r'id="gantt-card" data-steps="(\d+)"', page).group(1), page

    before, page = steps()
    client.post(f"{url}visit/", {"seq": str(as_of(page))})
    worklog.append("gt-h", ["one", "two"], actor="t")
    after, page = steps()
    assert after == before
    # The next visit: no bead changed since the last one.
    report = client.post(f"{url}visit/", {"seq": str(as_of(page))}).json()
    assert report["changed"] == []


def test_a_rebuild_of_the_read_model_keeps_the_last_line(routes):
    bead("gt-r")
    worklog.append("gt-r", ["kept across a rebuild"], actor="t")
    command("convoy", "reproject")
    assert BeadFacts.objects.get(pk="gt-r").last_log == "kept across a rebuild"
