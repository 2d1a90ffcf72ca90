"""Staleness is visible: ten seconds without a connection to the server (gone, or frozen with
its socket open), a page says since when it is not updated and marks what it shows; once the
server is back it catches up, the mark goes, and the page equals a reload (events that
happened meanwhile included)."""

import os
import signal

import pytest

from convoys.models import Convoy
from convoys.services import beads, staging
from convoys.services.launch import launch_staged

from .support.browser import login, wait_js, wait_live
from .support.factories import bead, blocks, child
from .support.pages import assert_live_equals_reload
from .support.processes import child_env, free_port, spawn, wait_port
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_page_without_its_server_says_since_when_and_catches_up(browser, routes):
    bead("gt-epic", "Outage", type="epic")
    for bead_id in ("gt-s1", "gt-s2"):
        bead(bead_id)
        child("gt-epic", bead_id)
    blocks("gt-s1", "gt-s2")
    convoy_id = staging.stage(["gt-epic"], actor="test").convoy_id
    launch_staged(convoy_id, force=True)
    full_staff("ann")
    port = free_port()
    env = child_env(DEBUG="1")
    web = spawn("web", env, port)
    try:
        wait_port(port)
        base = f"http://127.0.0.1:{port}"
        context, page = login(browser, base, "ann")
        page.goto(f"{base}/convoys/{convoy_id}/")
        wait_live(page)
        os.killpg(web.pid, signal.SIGKILL)  # the server is gone, as in a crash
        web.wait()
        wait_js(page, "document.getElementById('live-state').textContent.includes('reconnecting')")
        page.wait_for_timeout(3000)
        assert page.locator("#stale-banner").count() == 0  # a short blip is no outage
        wait_js(page, "document.body.classList.contains('stale')", timeout=15000)
        banner = page.locator("#stale-banner").inner_text()
        assert banner.startswith("Not updated since 20") and " UTC: no connection" in banner
        # Meanwhile the work goes on; the page cannot know yet.
        beads.close_bead("gt-s1", actor="worker")
        web = spawn("web", env, port)
        wait_port(port)
        wait_js(page, "!document.body.classList.contains('stale')", timeout=45000)
        assert page.locator("#stale-banner").count() == 0
        assert_live_equals_reload({"convoy": page}, "the server came back")
        assert Convoy.objects.get(pk=convoy_id).status == "open"
        # A frozen server keeps the socket open but answers nothing: the pings tell.
        wait_live(page)
        os.killpg(web.pid, signal.SIGSTOP)
        try:
            wait_js(page, "document.body.classList.contains('stale')", timeout=30000)
            assert "Not updated since" in page.locator("#stale-banner").inner_text()
        finally:
            os.killpg(web.pid, signal.SIGCONT)
        wait_js(page, "!document.body.classList.contains('stale')", timeout=45000)
        assert_live_equals_reload({"convoy": page}, "the frozen server woke")
        context.close()
    finally:
        if web.poll() is None:
            os.killpg(web.pid, signal.SIGTERM)
            web.wait(20)
