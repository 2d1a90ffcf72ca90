"""Why is this bead not moving? One cause per tracked bead that is not done,
decided in a fixed order by `convoys.rules.causes`; the convoy page, the bead page, the API and
`convoy status` all show it and agree."""

import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from convoys.infra.dispatchers import Outcome
from convoys.models import Bead, Rig, Worker
from convoys.rules import capacity, causes, stranding
from convoys.rules.causes import BeadRow, CauseFacts, Pause
from convoys.services import controls, convoys, dispatch, rigs
from convoys.services.rigs import upsert_route

from .support.factories import bead, blocks, command
from .support.users import signed_in

NOW = timezone.now()


class Refuses:
    def dispatch(self, bead_id, rig, convoy_id, worker):
        return Outcome(ok=False, error="worker pool unreachable")


# --- the pure rule ---------------------------------------------------------------------------
def row(**changes):
    values = {
        "status": "open",
        "issue_type": "task",
        "assignee": "",
        "rig": "gastown",
        "rig_state": "active",
    }
    return BeadRow(**(values | changes))


def kind(**facts):
    return causes.decide(CauseFacts("gt-a", facts.pop("row", row()), **facts))["kind"]


def test_the_first_kind_that_holds_is_the_cause():
    everything = {
        "row": row(rig_state="parked"),
        "ready": True,
        "blockers": ["gt-b"],
        "gates": ["gt-decide"],
        "paused": [Pause("hq-cv-1", "ann", NOW, "release freeze")],
        "failures": 3,
        "cooling_until": NOW,
        "capacity": {"scope": "convoy", "position": 1, "text": "…"},
    }
    cleared = {
        "paused": [],
        "blockers": [],
        "gates": [],
        "row": row(),
        "failures": 0,
        "cooling_until": None,
        "capacity": None,
    }
    order = ["paused", "blockers", "gates", "row", "failures", "cooling_until", "capacity"]
    expected = [
        "paused",
        "blocked",
        "gated",
        "rig-parked",
        "circuit-broken",
        "cooling-down",
        "waiting-for-capacity",
    ]
    for name, want in zip(order, expected, strict=True):
        assert kind(**everything) == want
        everything[name] = cleared[name]
    assert kind(**everything) == "ready"
    assert causes.decide(CauseFacts("gt-a", None))["kind"] == "unknown"
    assert kind(row=row(issue_type="epic"), paused=everything["paused"]) == "not-slingable"
    assert kind(row=row(status="deferred")) == "not-slingable"
    assert kind(row=row(status="hooked")) == "not-slingable"  # hooked, nobody assigned
    assert kind(row=row(rig="")) == "not-slingable"
    assert kind(row=row(rig_state="docked")) == "rig-docked"
    assert kind(row=row(status="hooked", assignee="w"), ready=False) == "working"
    assert kind(row=row(status="hooked", assignee="w"), ready=True) == "dead-worker"
    # A pause stops new dispatches: work under way is still working; a dead worker's bead
    # waits for the resume (no rescue while paused).
    paused = [Pause("hq-cv-1", "ann", NOW, "release freeze")]
    held = row(status="in_progress", assignee="w")
    assert kind(row=held, ready=False, paused=paused) == "working"
    assert kind(row=held, ready=True, paused=paused) == "paused"
    # Cooling and capacity are about dispatching: a bead that is not ready is not waiting.
    assert kind(row=row(status="hooked", assignee="w"), cooling_until=NOW) == "working"


def test_summary_counts_in_the_order_kinds_are_decided():
    found = {
        "a": {"kind": "working"},
        "b": {"kind": "blocked"},
        "c": None,  # done
        "d": {"kind": "blocked"},
        "e": {"kind": "gated"},
        "f": {"kind": "waiting-for-capacity"},
    }
    assert causes.summary(found) == "2 blocked, 1 gated, 1 waiting for capacity, 1 working"
    assert causes.summary({}) == ""


# --- one bead per kind, through the services -------------------------------------------------
EXPECTED = {
    "gt-unknown": "unknown",
    "gt-epic": "not-slingable",
    "gt-paused": "paused",
    "gt-blocked": "blocked",
    "gt-gated": "gated",
    "pk-parked": "rig-parked",
    "dk-docked": "rig-docked",
    "gt-broken": "circuit-broken",
    "gt-cooling": "cooling-down",
    "gt-waiting": "waiting-for-capacity",
    "gt-working": "working",
    "gt-dead": "dead-worker",
    "gt-ready": "ready",
}


@pytest.fixture
def every_kind(routes, settings):
    """An open convoy (max in flight 3) tracking one bead per kind and a closed bead."""
    upsert_route("pk-", "parkrig")
    upsert_route("dk-", "dockrig")
    for bead_id in EXPECTED:
        if bead_id == "gt-epic":
            bead(bead_id, type="epic")
        elif bead_id != "gt-unknown":
            bead(bead_id, f"Bead {bead_id}")
    bead("gt-decide", "Ship it?", type="decision")
    bead("gt-done", status="closed")
    blocks("gt-working", "gt-blocked")
    blocks("gt-decide", "gt-gated")
    for bead_id, times in (("gt-broken", 3), ("gt-cooling", 1)):
        for _ in range(times):
            dispatch.dispatch(Bead.objects.get(pk=bead_id), dispatcher=Refuses())
    for bead_id in ("gt-working", "gt-dead"):
        assert dispatch.dispatch(Bead.objects.get(pk=bead_id))["ok"]
    dead = Bead.objects.get(pk="gt-dead").assignee
    Worker.objects.filter(name=dead).update(last_seen=timezone.now() - timedelta(hours=2))
    rigs.set_rig_state("parkrig", "parked", actor="test")
    rigs.set_rig_state("dockrig", "docked", actor="test")
    main = convoys.create("Every kind", [*EXPECTED, "gt-done"], actor="test", max_in_flight=3)
    other = convoys.create("Frozen", ["gt-paused"], actor="test")
    controls.pause(other.pk, actor="ann", reason="release freeze")
    return main


def test_one_bead_per_kind(every_kind):
    found = causes.for_convoy(every_kind)
    assert {bead_id: c["kind"] for bead_id, c in found.items()} == EXPECTED
    assert list(found) == list(EXPECTED)  # tracking order; the closed bead has no cause
    assert found["gt-blocked"]["blockers"] == ["gt-working"]
    assert found["gt-gated"]["gates"] == ["gt-decide"]
    assert found["gt-paused"]["convoys"] != [every_kind.pk]
    assert (found["gt-paused"]["by"], found["gt-paused"]["reason"]) == ("ann", "release freeze")
    assert found["pk-parked"]["rig"] == "parkrig"
    broken = found["gt-broken"]
    assert (broken["failures"], broken["last_error"]) == (3, "worker pool unreachable")
    assert found["gt-cooling"]["until"] > timezone.now()
    waiting = found["gt-waiting"]
    assert (waiting["scope"], waiting["position"], waiting["cap"], waiting["in_flight"]) == (
        "convoy",
        1,
        3,
        2,
    )
    working = Bead.objects.get(pk="gt-working")
    assert found["gt-working"]["worker"] == working.assignee
    assert found["gt-working"]["last_seen"] is not None
    dead = found["gt-dead"]
    assert dead["dead_since"] < timezone.now() < dead["rescue_by"]
    assert found["gt-ready"]["convoys"] == [every_kind.pk]
    assert causes.for_bead("gt-done") is None
    assert causes.for_bead("gt-gated") == found["gt-gated"]
    assert causes.summary(found) == ", ".join(f"1 {causes.word(k)}" for k in EXPECTED.values())


def test_what_a_page_read_already_gives_the_same_causes(every_kind):
    """A convoy page hands over its rows, ready set and blockers (read by the same rules)."""
    from types import SimpleNamespace

    from convoys.rules.readiness import blocked_by, ready_beads
    from convoys.rules.rows import tracked_beads

    tracked, rows, _ = tracked_beads(every_kind)
    subset = Bead.objects.filter(pk__in=tracked)
    blockers = blocked_by(tracked)
    targets = {t for ts in blockers.values() for t in ts}
    known = SimpleNamespace(
        tracked=tracked,
        beads=rows,
        ready=set(ready_beads(subset).values_list("pk", flat=True)),
        blockers=blockers,
        target_types=dict(Bead.objects.filter(pk__in=targets).values_list("id", "issue_type")),
        rigs=dict(Rig.objects.values_list("name", "state")),
        cap=capacity.cap(),
    )

    def stable(found):
        return {i: {k: v for k, v in c.items() if k != "rescue_by"} for i, c in found.items()}

    with CaptureQueriesContext(connection) as fresh:
        alone = causes.for_convoy(every_kind)
    with CaptureQueriesContext(connection) as handed:
        given = causes.for_convoy(every_kind, known=known)
    assert stable(given) == stable(alone) and given.blockers == alone.blockers
    assert len(handed) == len(fresh) - 7  # rows, ready, blockers, types, rigs, cap


def test_ready_beads_past_the_free_slots_wait_in_priority_order(routes):
    for bead_id in ("gt-1", "gt-2", "gt-3", "gt-4"):
        bead(bead_id)
    bead("gt-0", priority=0)
    convoy = convoys.create("Capped", ["gt-1", "gt-2", "gt-3", "gt-4", "gt-0"], max_in_flight=2)
    assert dispatch.dispatch(Bead.objects.get(pk="gt-1"), convoy_id=convoy.pk)["ok"]
    found = causes.for_convoy(convoy)
    assert found["gt-1"]["kind"] == "working"
    assert found["gt-0"]["kind"] == "ready"  # priority 0 takes the one free slot
    assert [found[i].get("position") for i in ("gt-2", "gt-3", "gt-4")] == [1, 2, 3]
    assert {found[i]["kind"] for i in ("gt-2", "gt-3", "gt-4")} == {"waiting-for-capacity"}


def test_ready_beads_past_the_town_cap_wait_at_their_place_in_the_town_queue(routes, settings):
    for bead_id in ("gt-1", "gt-2", "gt-3", "gt-x"):
        bead(bead_id)
    first = convoys.create("First", ["gt-1", "gt-2", "gt-3"])
    second = convoys.create("Second", ["gt-x"])
    assert dispatch.dispatch(Bead.objects.get(pk="gt-1"), convoy_id=first.pk)["ok"]
    settings.CONVOY_MAX_IN_FLIGHT = 1
    positions = capacity.queue_positions()
    assert sorted(positions.values()) == [1, 2, 3]
    found = {**causes.for_convoy(first), **causes.for_convoy(second)}
    for bead_id, position in positions.items():
        waiting = found[bead_id]
        assert (waiting["kind"], waiting["scope"], waiting["position"]) == (
            "waiting-for-capacity",
            "town",
            position,
        )
        assert (waiting["in_flight"], waiting["cap"], waiting["queued"]) == (1, 1, 3)
    assert found["gt-1"]["kind"] == "working"
    settings.CONVOY_MAX_IN_FLIGHT = 2  # a free slot: the first in the queue is ready
    found = {**causes.for_convoy(first), **causes.for_convoy(second)}
    head = min(positions, key=positions.get)
    assert found[head]["kind"] == "ready"
    assert [found[i]["position"] for i in sorted(positions, key=positions.get)[1:]] == [1, 2]


def test_a_bead_outside_any_open_convoy_is_ready_to_sling(routes):
    bead("gt-solo")
    assert causes.for_bead("gt-solo")["text"] == "no open convoy feeds it: sling it"


def test_queries_do_not_grow_with_beads(routes):
    def convoy_of(n, prefix):
        ids = [f"gt-{prefix}{i}" for i in range(n)]
        for i, bead_id in enumerate(ids):
            bead(bead_id)
            if i % 3:
                blocks(ids[i - 1], bead_id)
        bead(f"gt-{prefix}gate", type="decision")
        blocks(f"gt-{prefix}gate", ids[0])
        convoy = convoys.create(prefix, [*ids, f"gt-{prefix}missing"], max_in_flight=5)
        dispatch.dispatch(Bead.objects.get(pk=ids[3]), dispatcher=Refuses())
        return convoy

    def queries(convoy):
        with CaptureQueriesContext(connection) as captured:
            found = causes.for_convoy(convoy)
        return len(captured), found

    # A few beads are read by id (fewer queries when none is assigned); many, by subquery.
    small, found_small = queries(convoy_of(10, "s"))
    large, found_large = queries(convoy_of(200, "l"))
    larger, _ = queries(convoy_of(260, "x"))
    assert small <= large == larger, (small, large, larger)
    assert len(found_large) == 201 and found_large["gt-lmissing"]["kind"] == "unknown"
    assert found_large["gt-l0"]["kind"] == "gated"


def test_the_stranded_reason_of_a_parked_bead_says_retry_not_cooldown(routes):
    bead("gt-a")
    bead("gt-b")
    convoy = convoys.create("Fragile", ["gt-a", "gt-b"])
    for _ in range(3):
        dispatch.dispatch(Bead.objects.get(pk="gt-a"), dispatcher=Refuses())
    dispatch.dispatch(Bead.objects.get(pk="gt-b"), dispatcher=Refuses())
    verdict = stranding.classify_one(convoy)
    assert (verdict.kind, verdict.code) == ("stuck", "dispatch_failing")
    assert verdict.reason == (
        "gt-a parked by the dispatch breaker (failed dispatches in a row; a retry clears it); "
        "dispatch failing for gt-b (retried after the cooldown)"
    )


def test_the_dashboard_row_of_a_paused_convoy_wears_a_paused_badge(routes):
    bead("gt-a")
    convoy = convoys.create("Held", ["gt-a"])
    bead("gt-b", status="closed")
    landed = convoys.create("Done, waiting to land", ["gt-b"])
    client = signed_in("watcher", "view_convoy")

    def row(convoy_id):
        page = client.get("/").content.decode()
        return re.search(rf'<tr data-convoy="{convoy_id}".*?</tr>', page, re.S).group(0)

    assert "paused" not in row(convoy.pk)
    controls.pause(convoy.pk, actor="web:ann", reason="release freeze")
    controls.pause(landed.pk, actor="web:ann")  # web:ann, api:ann and ann are one person
    # Its stuck badge says it, in the pause colour; who and why on hover.
    badge = re.search(
        r'<span class="tag paused stranded-badge" title="([^"]*)">([^<]*)<', row(convoy.pk)
    )
    assert badge.groups() == ("paused by ann: release freeze", "stuck: paused")
    # A convoy stuck for another reason (complete, waiting to land) wears its own badge too.
    other = row(landed.pk)
    assert '<span class="tag paused" title="paused by ann">paused</span>' in other
    assert "waiting to land" in other


def test_the_bead_page_and_bead_json_name_the_same_cause(every_kind):
    client = signed_in("watcher", "view_convoy", "view_bead")
    found = causes.for_convoy(every_kind)
    for bead_id, kind in EXPECTED.items():
        if bead_id == "gt-unknown":
            assert client.get(f"/api/beads/{bead_id}").status_code == 404
            continue
        cause = client.get(f"/api/beads/{bead_id}").json()["cause"]
        assert cause == {
            k: v for k, v in causes.jsonable(found[bead_id]).items() if k != "rescue_by"
        } | ({"rescue_by": cause["rescue_by"]} if "rescue_by" in cause else {})
        page = client.get(f"/beads/{bead_id}/").content.decode()
        shown = re.search(r'id="bead-cause"><span class="cause k-([a-z-]+)" data-cause', page)
        assert shown.group(1) == kind
    assert client.get("/api/beads/gt-done").json()["cause"] is None
    assert 'id="bead-cause"' not in client.get("/beads/gt-done/").content.decode()


# --- every surface says the same -------------------------------------------------------------
def page_causes(client, url):
    """{bead id: kind} from the convoy page's bead rows, and the summary's {kind: beads}."""
    page = client.get(url).content.decode()
    rows = {}
    for bead_id, row in re.findall(
        r'<tr data-bead="([^"]+)" id="bead-row-[^>]*>(.*?)</tr>', page, re.S
    ):
        cell = re.search(
            r'<td class="b-cause"><span class="cause k-[^"]+" data-cause="([^"]+)"', row
        )
        rows[bead_id] = cell.group(1) if cell else None
    summary = re.search(r'id="cause-summary">(.*?)</p>', page, re.S).group(1)
    counts = {k: int(n) for k, n in re.findall(r'data-cause="([^"]+)">(\d+) [a-z ]+<', summary)}
    return rows, counts


def test_page_api_and_cli_agree_on_every_kind(every_kind):
    client = signed_in("watcher", "view_convoy", "view_bead")
    convoy_id = every_kind.pk
    rows, summary = page_causes(client, f"/convoys/{convoy_id}/")
    assert rows == EXPECTED | {"gt-done": None}
    assert summary == dict.fromkeys(EXPECTED.values(), 1)

    api = client.get(f"/api/convoys/{convoy_id}").json()
    cli = json.loads(command("convoy", "status", convoy_id, "--json"))
    for data in (api, cli):
        tracked = {t["id"]: t["cause"] for t in data["tracked"]}
        assert {i: c["kind"] for i, c in tracked.items() if c} == EXPECTED
        assert tracked["gt-done"] is None
        assert data["causes"] == summary
    assert stable(api) == stable(cli)


def stable(status):
    """Each tracked bead's cause without the time read from the clock (the next scan's)."""
    return [
        {k: v for k, v in (t["cause"] or {}).items() if k != "rescue_by"} for t in status["tracked"]
    ]


def test_convoy_status_names_each_cause(every_kind):
    status = json.loads(command("convoy", "status", every_kind.pk, "--json"))
    text = command("convoy", "status", every_kind.pk)
    assert "  Not done: " + causes.summary([t["cause"] for t in status["tracked"]]) in text
    for bead_id, kind in EXPECTED.items():
        line = next(line for line in text.splitlines() if f" {bead_id} " in line)
        assert f"— {kind}: " in line, line
    broken = next(line for line in text.splitlines() if " gt-broken " in line)
    assert "parked: dispatch failed 3 times in a row" in broken
    cooling = next(line for line in text.splitlines() if " gt-cooling " in line)
    assert re.search(r"\(until \d\d:\d\d:\d\d UTC\)$", cooling)
