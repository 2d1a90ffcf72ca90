"""One stranded/stuck rule: the dashboard badge, the convoy page, the API, /stranded/,
`convoy stranded` and the stranded scan agree, on the demo data and on hand-built cases."""

import html
import io
import json
import re
import time
from pathlib import Path

import pytest
from django.core.management import call_command

from convoys.models import Bead, Convoy, Dispatch, Event
from convoys.rules import stranding
from convoys.services import beads, convoys, feeding, rigs, staging
from convoys.services.launch import launch_staged

from .support.factories import bead, blocks
from .support.factories import command as cli
from .support.pages import dashboard_badges, text_of
from .support.users import signed_in

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def _no_grace(settings):
    """These tests compare every surface with the rule's verdict at once; the grace pages give
    a feedable convoy (one feed interval) has its own test below."""
    settings.CONVOY_FEED_INTERVAL = 0


@pytest.fixture
def client(db):
    return signed_in("watcher", "view_convoy", "view_bead", "change_convoy")


def page_badge(client, convoy_id):
    page = client.get(f"/convoys/{convoy_id}/").content.decode()
    badge = re.search(r'id="stranded-badge"[^>]*>(.*?)</span>', page, re.S)
    reason = re.search(r'class="stranded-reason">(.*?)</span>', page, re.S)
    return (text_of(badge.group(1)) if badge else None), (
        text_of(reason.group(1)) if reason else ""
    )


def assert_surfaces_agree(client):
    """Every surface against `stranding.classify`; returns the verdicts by convoy id."""
    every = list(Convoy.objects.order_by("id"))
    verdicts = stranding.classify(every)
    stranded = {c.pk for c in every if verdicts[c.pk].stranded}
    badges = dashboard_badges(client)
    for convoy in every:
        verdict = verdicts[convoy.pk]
        expected = verdict.label if verdict.stranded else None
        assert badges[convoy.pk] == expected, convoy
        assert page_badge(client, convoy.pk) == (expected, verdict.reason if expected else "")
    listed = {c["id"]: c for c in client.get("/api/convoys?status=all&limit=1000").json()}
    assert {i for i, c in listed.items() if c["progress"]["stranded"]} == stranded
    # The listings hold every open convoy, as `gt convoy stranded` does, each with its cause.
    explained = stranding.classify(every, explain=True)
    open_ = {i for i, v in explained.items() if v.kind}
    api_rows = client.get("/api/stranded").json()
    assert {r["id"]: (r["kind"], r["cause"], r["reason"]) for r in api_rows} == {
        i: (explained[i].kind, explained[i].code, explained[i].detail) for i in open_
    }
    for row in api_rows:
        assert row["ready_issues"] == explained[row["id"]].ready
        assert row["ready_count"] == len(row["ready_issues"])
    page = client.get("/stranded/").content.decode()
    assert set(re.findall(r'href="/convoys/([^/"]+)/"', page)) == open_
    for convoy_id in open_:
        assert html.escape(explained[convoy_id].detail) in page
    cli_rows = json.loads(cli("convoy", "stranded", "--json"))
    assert [r["id"] for r in cli_rows] == sorted(open_)
    text = cli("convoy", "stranded")
    for convoy_id in open_:
        assert convoy_id in text
        if explained[convoy_id].kind in (stranding.STUCK, stranding.MOVING):
            assert explained[convoy_id].detail in text
    return verdicts


def assert_scan_agrees(verdicts):
    """The scan feeds each feedable convoy once and reports the stuck ones."""
    before = set(Dispatch.objects.values_list("pk", flat=True))
    summary = feeding.stranded_scan()
    fresh = Dispatch.objects.exclude(pk__in=before).filter(path="stranded", ok=True)
    fed = {d.convoy_id: d.bead_id for d in fresh}
    feedable = {i for i, v in verdicts.items() if v.kind == stranding.FEEDABLE}
    assert set(fed) == feedable
    for convoy_id, bead_id in fed.items():
        assert bead_id in verdicts[convoy_id].ready
    stuck = {i for i, v in verdicts.items() if v.kind == stranding.STUCK}
    assert set(summary["stuck"]) | set(summary["landed"]) == stuck


def demo_bead(title_start, prefix):
    return Bead.objects.get(title__startswith=title_start, pk__startswith=prefix)


@pytest.mark.slow
def test_every_surface_agrees_on_the_demo_convoys(client):
    call_command("demo", stdout=io.StringIO())
    verdicts = assert_surfaces_agree(client)
    launched = [v for v in verdicts.values() if v.kind]
    assert launched and all(v.kind == stranding.MOVING for v in launched)
    # Move the demo into every state: ready work nobody is on, a gate, a parked rig, empty.
    # (closes feed nobody here: on-commit tasks do not run in these tests)
    beads.close_bead(demo_bead("Design", "bd-").pk, actor="test")
    beads.close_bead(demo_bead("Prepare", "ops-").pk, actor="test")
    beads.close_bead(demo_bead("Step 1:", "gt-").pk, actor="test")
    rigs.set_rig_state("gastown", "parked", actor="test")
    empty = convoys.create("Nothing yet", actor="test")
    verdicts = assert_surfaces_agree(client)
    codes = {v.code for v in verdicts.values() if v.kind == stranding.STUCK}
    kinds = {v.kind for v in verdicts.values()}
    assert {stranding.FEEDABLE, stranding.STUCK, stranding.EMPTY} <= kinds
    assert {"gated", "parked_rig"} <= codes
    assert verdicts[empty.pk].kind == stranding.EMPTY
    gated = next(v for v in verdicts.values() if v.code == "gated")
    decision = demo_bead("Decide", "ops-")
    assert f"gated by {decision.pk}" in gated.reason
    assert_scan_agrees(verdicts)


@pytest.fixture
def one(routes):
    """Launch a convoy over the given beads (chain order given by `blocks` beforehand)."""

    def launch(*ids, force=True):
        plan = staging.stage(list(ids), actor="test")
        launch_staged(plan.convoy_id, force=force, actor="test")
        return Convoy.objects.get(pk=plan.convoy_id)

    return launch


@pytest.fixture
def gated(one):
    """gt-prep (being worked) then gt-roll, which the untracked decision gt-go also gates."""
    bead("gt-go", "Go / no-go", type="decision")
    bead("gt-prep")
    bead("gt-roll")
    blocks("gt-prep", "gt-roll")
    blocks("gt-go", "gt-roll")
    return one("gt-prep", "gt-roll")


def verdict(convoy):
    return stranding.classify_one(Convoy.objects.get(pk=convoy.pk))


def test_gated_convoy_is_stuck_naming_its_gate_and_has_no_eta(gated, client):
    convoy = gated
    assert verdict(convoy).kind == stranding.MOVING  # gt-prep is being worked
    page = client.get(f"/convoys/{convoy.pk}/").content.decode()
    assert "No estimate: gt-roll gated by gt-go." in page
    assert "<code>gt-roll</code> ← gt-go" in page  # the wave card names the untracked gate
    beads.close_bead("gt-prep", actor="test")
    found = verdict(convoy)
    assert (found.kind, found.code, found.reason) == ("stuck", "gated", "gt-roll gated by gt-go")
    page = client.get(f"/convoys/{convoy.pk}/").content.decode()
    assert "Estimated landing" not in page and "No estimate: gt-roll gated by gt-go." in page
    checked = client.post(f"/convoys/{convoy.pk}/check/", follow=True).content.decode()
    assert "1/2 done, not complete: stuck: gated — gt-roll gated by gt-go." in checked
    assert cli("convoy", "check", convoy.pk).splitlines() == [
        f"○ Convoy {convoy.pk} has 1 open issue(s) remaining",
        "  stuck: gated: gt-roll gated by gt-go",
    ]
    assert_surfaces_agree(client)


def test_parked_rig_stuck_then_feedable_after_unpark(one, client):
    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b")
    convoy = one("gt-a", "gt-b")
    rigs.set_rig_state("gastown", "parked", actor="test")
    beads.close_bead("gt-a", actor="test")
    found = verdict(convoy)
    assert (found.kind, found.code) == ("stuck", "parked_rig")
    assert found.reason == "rig gastown (parked) holds gt-b"
    assert_surfaces_agree(client)
    rigs.set_rig_state("gastown", "active", actor="test")
    assert verdict(convoy).kind == stranding.FEEDABLE and verdict(convoy).ready == ["gt-b"]
    assert_scan_agrees({convoy.pk: verdict(convoy)})


def test_blocked_outside_held_unknown_and_empty(routes, client):
    bead("gt-out")
    bead("gt-in")
    blocks("gt-out", "gt-in")
    outside = convoys.create("Outside", ["gt-in"], actor="test")
    bead("gt-later", status="deferred")
    held = convoys.create("Held", ["gt-later"], actor="test")
    ghost = convoys.create("Ghost", ["gt-nothere"], actor="test")
    empty = convoys.create("Empty", actor="test")
    bead("gt-held", assignee="gastown/polecats/ace")  # no heartbeat, updated now: not dead yet
    assigned = convoys.create("Assigned", ["gt-held"], actor="test")
    assert verdict(assigned).reason == "gt-held is assigned to gastown/polecats/ace"
    assert verdict(outside).reason == "gt-in blocked by gt-out outside the convoy"
    assert (verdict(held).code, verdict(held).reason) == ("held", "gt-later is deferred")
    assert verdict(ghost).reason == "gt-nothere not in the database"
    assert verdict(empty).kind == stranding.EMPTY
    assert_surfaces_agree(client)


def test_failing_dispatch_is_stuck_until_the_cooldown_passes(routes, client, settings):
    settings.CONVOY_DISPATCHER = "command"
    settings.CONVOY_DISPATCH_COMMAND = "false"
    bead("gt-f")
    convoy = convoys.create("Failing", ["gt-f"], actor="test")
    assert verdict(convoy).kind == stranding.FEEDABLE
    assert feeding.stranded_scan()["dispatched"] == []
    found = verdict(convoy)
    assert (found.kind, found.code) == ("stuck", "dispatch_failing")
    assert_surfaces_agree(client)
    settings.CONVOY_RETRY_COOLDOWN = 0
    assert verdict(convoy).kind == stranding.FEEDABLE


def test_max_in_flight_and_ready_beside_work_in_progress(routes, client):
    for bead_id in ("gt-p1", "gt-p2", "gt-p3"):
        bead(bead_id)
    convoy = convoys.create("Throttled", ["gt-p1", "gt-p2"], actor="test", max_in_flight=1)
    feeding.stranded_scan()
    assert Bead.objects.get(pk="gt-p1").status == "hooked"
    found = verdict(convoy)
    assert (found.kind, found.reason) == (
        "moving",
        "1 in progress (max in flight 1; 1 ready waiting)",
    )
    assert feeding.stranded_scan()["dispatched"] == []  # the scan keeps to max in flight
    wide = convoys.create("Wide", ["gt-p3", "gt-p1"], actor="test")
    assert verdict(wide).kind == stranding.FEEDABLE  # ready work beside work in progress
    assert_surfaces_agree(client)


def test_complete_open_convoy_waits_to_land_and_the_scan_lands_it(routes, client):
    bead("gt-done")
    convoy = convoys.create("Done soon", ["gt-done"], actor="test")
    beads.close_bead("gt-done", actor="test")  # its feeder task (on commit) does not run here
    found = verdict(convoy)
    assert (found.kind, found.label) == ("stuck", "waiting to land")
    assert_surfaces_agree(client)
    assert feeding.stranded_scan()["landed"] == [convoy.pk]
    assert Event.objects.filter(kind="convoy.landed", convoy_id=convoy.pk).exists()


def test_landed_convoy_page_has_no_eta(one, client):
    bead("gt-only")
    convoy = one("gt-only")
    assert "Critical path and ETA" in client.get(f"/convoys/{convoy.pk}/").content.decode()
    convoys.close(convoy.pk, force=True, actor="test")
    page = client.get(f"/convoys/{convoy.pk}/").content.decode()
    assert "Critical path and ETA" not in page and "stranded-badge" not in page


def test_imported_hooked_work_of_silent_workers_is_listed_and_rescued(routes, client, settings):
    """bd's hooked work whose assignee never reports here is ready once the
    bead is CONVOY_WORKER_TIMEOUT old; `convoy stranded` lists it and `convoy feed` rescues it,
    one bead per convoy per scan."""
    settings.CONVOY_WORKER_TIMEOUT = 600
    cli("beads", "import", str(FIXTURES / "hooked.jsonl"))
    cli("beads", "heartbeat", "gastown/polecats/alive")
    [row] = json.loads(cli("convoy", "stranded", "--json"))
    assert (row["id"], row["tracked_count"], row["ready_issues"]) == (
        "hq-cv-hk",
        4,
        ["gt-hk1", "gt-hk2"],
    )
    assert "2 ready: gt-hk1, gt-hk2" in cli("convoy", "stranded")
    assert_surfaces_agree(client)
    for rescued in ("gt-hk1", "gt-hk2"):
        scan = json.loads(cli("convoy", "feed", "--once", "--json"))["stranded"]
        assert scan["dispatched"] == [rescued]
        bead_now = Bead.objects.get(pk=rescued)
        assert bead_now.status == "hooked" and bead_now.assignee != "gastown/polecats/ghost"
        assert Dispatch.objects.get(bead_id=rescued).path == "stranded"
    assert json.loads(cli("convoy", "feed", "--once", "--json"))["stranded"]["dispatched"] == []
    [row] = json.loads(cli("convoy", "stranded", "--json"))
    assert row["ready_issues"] == [] and row["ready_count"] == 0
    assert "stuck behind work in progress: 4 in progress (4 tracked, 0 ready)" in cli(
        "convoy", "stranded"
    )
    assert_surfaces_agree(client)


def test_convoy_stuck_behind_work_in_progress_is_listed_with_its_cause(gated, client):
    """The original lists every open convoy; one with no ready work while
    beads are in progress is its "stuck", here with what holds the rest."""
    convoy = gated
    assert verdict(convoy).kind == stranding.MOVING
    assert cli("convoy", "stranded").splitlines() == [
        f"🚚 {convoy.pk}: {convoy.title}",
        "    stuck behind work in progress: 1 in progress; gt-roll gated by gt-go"
        " (2 tracked, 0 ready)",
    ]
    [row] = client.get("/api/stranded").json()
    assert (row["kind"], row["cause"], row["ready_count"]) == ("moving", "in_progress", 0)
    assert row["reason"] == "1 in progress; gt-roll gated by gt-go"
    [cli_row] = json.loads(cli("convoy", "stranded", "--json"))
    assert set(cli_row) == {
        "id",
        "title",
        "tracked_count",
        "ready_count",
        "ready_issues",
        "created_at",
    }  # the original's shape (I-10: parseable JSON)
    assert dashboard_badges(client)[convoy.pk] is None  # moving: no badge, nothing to do
    bead("gt-later")
    staged = staging.stage(["gt-later"], actor="test")  # a staged convoy is never listed (I-7)
    assert staged.convoy_id not in {r["id"] for r in client.get("/api/stranded").json()}
    assert_surfaces_agree(client)


def test_ready_work_is_called_stranded_only_after_one_feed_interval(routes, client, settings):
    """A close makes work ready and the feeder takes it within a feed interval: pages never
    call the convoy stranded in between, and do once the work has waited longer."""
    settings.CONVOY_FEED_INTERVAL = 1
    bead("gt-w1")
    convoy = convoys.create("Waiting", ["gt-w1"], actor="test")
    assert stranding.classify_one(convoy).kind == stranding.FEEDABLE
    assert dashboard_badges(client)[convoy.pk] is None
    assert page_badge(client, convoy.pk) == (None, "")
    time.sleep(1.1)
    assert dashboard_badges(client)[convoy.pk] == "stranded"
    assert page_badge(client, convoy.pk)[0] == "stranded"
    assert client.get(f"/api/convoys/{convoy.pk}").json()["progress"]["stranded"] is True
