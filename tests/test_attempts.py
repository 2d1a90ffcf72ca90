"""Every dispatch attempt beside its bead: after real dispatches through the services (a
success, a failure, the retry after it, a sling), the bead page, the API's bead detail and
`beads show` list each one with its path, rig, worker, duration, outcome and the
dispatcher's output, escaped."""

import json
import re

import pytest
from django.test import Client

from convoys.infra.dispatchers import Outcome
from convoys.models import Bead
from convoys.services import actions, dispatch, sling
from convoys.services.tokens import create_token

from .support.factories import bead, command
from .support.pages import as_of, live
from .support.users import signed_in, user_with


class Fails:
    def dispatch(self, bead_id, rig, convoy_id, worker):
        return Outcome(ok=False, error="worker refused: disk full", output="<b>boom</b>\nline 2")


@pytest.fixture
def tried(routes, settings):
    """gt-a failed once (cooldown off), then its retry succeeded; gt-b slung by hand."""
    settings.CONVOY_RETRY_COOLDOWN = 0
    bead("gt-a", "Attempted")
    dispatch.dispatch(Bead.objects.get(pk="gt-a"), path="launch", dispatcher=Fails())
    dispatch.dispatch(Bead.objects.get(pk="gt-a"), path="stranded")
    bead("gt-b")
    sling.sling(["gt-b"], no_convoy=True, actor="test")


def test_the_bead_page_lists_every_attempt_newest_first(tried):
    client = signed_in("ann", "view_convoy", "view_bead")
    page = client.get("/beads/gt-a/").content.decode()
    table = page[page.index('id="bead-attempts"') :]
    table = table[: table.index("</section>")]
    assert "Dispatch attempts (2)" in table
    rows = re.findall(r'<tr id="attempt-(\d+)" class="attempt o-(\w+)">(.*?)</tr>', table, re.S)
    assert [(n, o) for n, o, _ in rows] == [("2", "ok"), ("1", "failed")]
    newest, oldest = rows[0][2], rows[1][2]
    assert "stranded scan" in newest and "retry" in newest and "taken by its worker" in newest
    assert "launch" in oldest and "worker refused: disk full" in oldest and " ms" in oldest
    assert "gastown" in oldest  # the rig
    # The dispatcher's output, collapsed and escaped.
    assert "<details" in oldest and "&lt;b&gt;boom&lt;/b&gt;" in oldest and "<b>boom" not in page
    worker = Bead.objects.get(pk="gt-a").assignee
    assert worker in newest


def test_a_new_attempt_arrives_in_a_live_update_as_a_reload_draws_it(tried):
    client = signed_in("ann", "view_convoy", "view_bead")
    page = client.get("/beads/gt-b/").content.decode()
    seq = as_of(page)
    Bead.objects.filter(pk="gt-b").update(status="open", assignee="")
    dispatch.dispatch(Bead.objects.get(pk="gt-b"), path="manual", dispatcher=Fails())
    fragment = live(client, "/beads/gt-b/", since=seq)["fragments"]["bead-attempts"]
    assert "Dispatch attempts (2)" in fragment and "disk full" in fragment
    fresh = client.get("/beads/gt-b/").content.decode()
    assert re.sub(r"<time [^>]*>[^<]*</time>", "", fragment) in re.sub(
        r"<time [^>]*>[^<]*</time>", "", fresh
    )


def test_the_api_and_the_cli_list_the_same_attempts(tried):
    user = user_with("tool", "view_bead")
    token = create_token(user, "t")
    answer = Client().get("/api/beads/gt-a", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    attempts = answer["attempts"]
    assert [(a["number"], a["path"], a["outcome"], a["retry"]) for a in attempts] == [
        (2, "stranded", "ok", True),
        (1, "launch", "failed", False),
    ]
    assert attempts[1]["output"] == "<b>boom</b>\nline 2"
    assert attempts[1]["duration_ms"] is not None and attempts[1]["rig"]

    shown = json.loads(command("beads", "show", "gt-a", "--json"))
    assert [a["outcome"] for a in shown["attempts"]] == ["ok", "failed"]
    text = command("beads", "show", "gt-a")
    assert "dispatch attempts (2, newest first):" in text
    assert re.search(r"#2 .* stranded scan \(retry\) .* taken by its worker", text)
    assert re.search(r"#1 .* launch .* failed: worker refused: disk full", text)
    sling_text = command("beads", "show", "gt-b")
    assert "#1" in sling_text and "sling" in sling_text


def test_an_attempt_an_operator_took_back_says_so_and_the_next_is_a_retry(tried):
    """A release (or reassign) ends the attempt that gave the bead to its worker: that
    attempt no longer reads "taken by its worker", and the dispatch after it is a retry."""
    assert (
        len(actions.run("release", ["gt-a"], actor="manager", reason="stuck on a lock").done) == 1
    )
    assert Bead.objects.get(pk="gt-a").assignee == ""
    sling.sling(["gt-a"], no_convoy=True, actor="test")
    actions.run("reassign", ["gt-a"], actor="lead", worker="gastown/polecats/slit")

    client = signed_in("ann", "view_convoy", "view_bead")
    page = client.get("/beads/gt-a/").content.decode()
    rows = re.findall(r'<tr id="attempt-(\d+)" class="attempt o-([\w-]+)">(.*?)</tr>', page, re.S)
    assert [(n, o) for n, o, _ in rows] == [
        ("3", "taken-back"),
        ("2", "taken-back"),
        ("1", "failed"),
    ]
    assert "taken back: reassigned by lead" in rows[0][2] and "retry" in rows[0][2]
    assert "taken back: released by manager (stuck on a lock)" in rows[1][2]
    assert "taken by its worker" not in page

    shown = json.loads(command("beads", "show", "gt-a", "--json"))["attempts"]
    assert [(a["outcome"], a["retry"]) for a in shown] == [
        ("taken-back", True),
        ("taken-back", True),
        ("failed", False),
    ]


def test_a_bead_never_dispatched_says_so(routes):
    bead("gt-z")
    client = signed_in("ann", "view_convoy", "view_bead")
    assert "Never dispatched." in client.get("/beads/gt-z/").content.decode()
    assert "dispatch attempts" not in command("beads", "show", "gt-z")
