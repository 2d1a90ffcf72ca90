"""Browser tests: Playwright driving Debian's Chromium against daphne and the task cluster
running as real processes on the test database. Screenshots go to artifacts/screenshots/."""

import json
import shutil

import pytest

from convoys.models import Bead, Convoy, Event
from convoys.services import beads, notify, rigs, staging
from convoys.services.launch import launch_staged

from .support.browser import login, shot, wait_js, wait_live
from .support.factories import bead, blocks, child
from .support.paths import IN_CI, shared_file
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_stage_launch_and_close_through_the_browser(browser, server):
    from convoys.services import jsonl

    try:
        jsonl.import_file(shared_file("steveyegge+gastown+issues.jsonl"))
        epic = "gt-si8rq"
    except pytest.skip.Exception:
        bead("gt-si8rq", "Local epic", type="epic")
        for bead_id in ("gt-si8rq.1", "gt-si8rq.8"):
            bead(bead_id)
            child("gt-si8rq", bead_id)
        epic = "gt-si8rq"
    rigs.upsert_route("gt-", "gastown/mayor/rig")
    full_staff("ann")
    context, page = login(browser, server, "ann")
    page.goto(server + f"/stage/?epic={epic}")
    page.wait_for_selector("#preview")
    assert f"{epic} [epic]" in page.inner_text("pre.tree")
    shot(page, "stage")
    page.check("#force")
    page.click("#launch-button")
    page.wait_for_url(server + "/convoys/**")
    convoy = Convoy.objects.get()
    assert convoy.status == "open"
    page.wait_for_selector("svg.dag .node")
    assert page.locator("#wave-table tbody tr").count() >= 1
    shot(page, "dag")
    page.goto(server + "/")
    page.click(f"a[href='/convoys/{convoy.pk}/']")
    page.wait_for_selector("#bead-table")
    before = page.inner_text("#convoy-head .counts")
    hooked = Bead.objects.filter(status="hooked", pk__in=convoy.tracked.values("bead_id")).first()
    page.goto(server + f"/beads/{hooked.pk}/")
    page.fill("input[name=reason]", "Done in the browser")
    page.click("#close-bead")
    page.wait_for_selector(".msg.success")
    assert Bead.objects.get(pk=hooked.pk).status == "closed"
    page.goto(server + f"/convoys/{convoy.pk}/")
    assert page.inner_text("#convoy-head .counts") != before
    page.goto(server + "/")
    shot(page, "dashboard")
    context.close()


@pytest.fixture
def live_convoy(routes):
    ids = [bead(f"gt-v{i}").id for i in range(3)]
    blocks(ids[0], ids[1])
    plan = staging.stage(ids, actor="test")
    launch_staged(plan.convoy_id, force=True)
    return plan.convoy_id, ids


def test_changes_reach_the_other_browser(browser, server, live_convoy):
    """How fast is measured in bench/ (live-update figures in the README), not asserted here."""
    convoy_id, ids = live_convoy
    full_staff("ann")
    bob = full_staff("bob")
    notify.subscribe(bob, Convoy.objects.get(pk=convoy_id))
    ann_ctx, ann = login(browser, server, "ann")
    bob_ctx, bob_page = login(browser, server, "bob")
    bob_dash = bob_ctx.new_page()
    bob_dash.goto(server + "/")
    bob_page.goto(server + f"/convoys/{convoy_id}/")
    wait_live(bob_page)
    wait_live(bob_dash)
    # closed in one browser -> the other browser's convoy page and dashboard update
    ann.goto(server + f"/beads/{ids[0]}/")
    ann.click("#close-bead")
    wait_js(
        bob_page,
        f"document.querySelector('[data-bead=\"{ids[0]}\"] .b-status').textContent === 'closed'",
    )
    wait_js(
        bob_dash,
        f"document.querySelector('[data-convoy=\"{convoy_id}\"] .done-count').textContent === '1'",
        timeout=3000,
    )
    # the task cluster (another process) dispatches the next wave: that reaches the page too
    wait_js(
        bob_page,
        f"document.querySelector('[data-bead=\"{ids[1]}\"] .b-status').textContent === 'hooked (dispatched)'",
        timeout=5000,
    )
    # closing the last beads lands the convoy: toast and inbox entry for the subscriber
    beads.close_bead(ids[1])
    beads.close_bead(ids[2])
    wait_js(
        bob_page,
        "[...document.querySelectorAll('.toast')].some(t => t.textContent.includes('landed'))",
        timeout=8000,
    )
    wait_js(bob_page, "document.getElementById('unread').textContent === '1'")
    bob_page.goto(server + "/inbox/")
    assert "Convoy landed" in bob_page.inner_text("#inbox-list")
    ann_ctx.close()
    bob_ctx.close()


def test_offline_then_online_replays_every_missed_event_once(browser, server, live_convoy):
    convoy_id, ids = live_convoy
    full_staff("ann")
    ctx, page = login(browser, server, "ann")
    frames = []  # what the server sent, before the page's own de-duplication
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(payload)))
    page.goto(server + f"/convoys/{convoy_id}/")
    wait_live(page)
    watcher_ctx, watcher = login(browser, server, "ann")  # stays online throughout
    watcher.goto(server + f"/convoys/{convoy_id}/")
    wait_live(watcher)
    start = page.evaluate("window.convoyLive.last")
    ctx.set_offline(True)
    page.evaluate("window.convoyLive.socket.close()")
    for priority in (0, 1, 3):
        beads.update_bead(ids[2], priority=priority)
    expected = list(
        Event.objects.filter(seq__gt=start, bead_id__in=ids).values_list("seq", flat=True)
    )
    assert len(expected) == 3
    # the events have gone out live (the page that stayed online has them); the offline page
    # has missed them
    wait_js(watcher, f"window.convoyLive.last >= {max(expected)}")
    assert page.evaluate("window.convoyLive.last") == start
    ctx.set_offline(False)
    wait_js(page, f"window.convoyLive.last >= {max(expected)}", timeout=45000)
    wait_js(page, f"window.convoyLive.rendered >= {max(expected)}")  # and the page redrew
    messages = [json.loads(f) for f in frames if isinstance(f, str)]
    sent = [m["seq"] for m in messages if m.get("type") == "event" and m["seq"] > start]
    assert set(expected) <= set(sent)  # replayed after the reconnect
    assert len(sent) == len(set(sent)), sent  # each sent once on the wire
    assert page.evaluate("window.convoyLive.log.filter(s => s > %d)" % start) == sent
    watcher_ctx.close()
    ctx.close()


def test_chromium_available_for_ci():
    assert shutil.which("chromium") or not IN_CI
