"""Browser tests: Playwright driving Debian's Chromium against daphne and the task cluster
running as real processes on the test database. Screenshots go to artifacts/screenshots/."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User

from convoys.models import Bead, Convoy, Event
from convoys.services import beads, notify, rigs, staging
from convoys.services.launch import launch_staged

from .conftest import IN_CI, ROOT, child_env, free_port, shared_file, spawn, wait_port
from .factories import bead, blocks, child

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
CHROMIUM = "/usr/bin/chromium"
SHOTS = ROOT / "artifacts" / "screenshots"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser():
    """Chromium through Playwright's sync API. That API keeps an event loop running in this
    thread, so Django takes the tests' own ORM calls (plain sync code) for calls from async
    code: DJANGO_ALLOW_ASYNC_UNSAFE is set here, only while the browser is open, and never
    reaches the processes the tests start (conftest.child_env drops it)."""
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing (apt-get install chromium; ./test.sh does it as root)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as mp, sync_playwright() as pw:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        instance = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield instance
        instance.close()


@pytest.fixture
def server(transactional_db):
    port = free_port()
    env = child_env(CONVOY_FEED_INTERVAL="1", CONVOY_STRANDED_INTERVAL="2", DEBUG="1")
    web = spawn("web", env, port)
    cluster = spawn("cluster", env)
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        for proc in (web, cluster):
            proc.send_signal(signal.SIGTERM)
        for proc in (web, cluster):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for proc in (web, cluster):  # DJANGO_ALLOW_ASYNC_UNSAFE never reaches them: nothing hidden
        assert "SynchronousOnlyOperation" not in Path(proc.log_path).read_text(errors="replace")


def make_user(name):
    user = User.objects.create_user(name, password="pw-pw-pw-123", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="convoys"))
    return user


def login(browser, base, name):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    sign_in(page, base, name)
    return context, page


def sign_in(page, base, name):
    """Log `name` in through the login form, in a page of a context the caller set up."""
    page.goto(base + "/login/")
    page.fill("#id_username", name)
    page.fill("#id_password", "pw-pw-pw-123")
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")


def wait_js(page, expression, timeout=10000):
    """Wait until a JavaScript expression is true in the page. Playwright's wait_for_function
    evaluates its string with eval(), which the pages' CSP (no 'unsafe-eval') refuses."""
    ends = time.monotonic() + timeout / 1000
    while not page.evaluate(f"() => Boolean({expression})"):
        assert time.monotonic() < ends, f"not true within {timeout} ms: {expression}"
        page.wait_for_timeout(50)


def wait_live(page):
    wait_js(
        page,
        "window.convoyLive && window.convoyLive.socket"
        " && window.convoyLive.socket.readyState === 1",
    )


def shot(page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


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
    make_user("ann")
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
    make_user("ann")
    bob = make_user("bob")
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
    make_user("ann")
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
