"""The worker's own words in Chromium: the bead page tails the log live as a worker POSTs
lines (through the real server's API, with its token), the convoy page's row shows the last
line beside the bead in progress, and both equal a reload."""

import json
import urllib.request

import pytest

from convoys.models import Bead
from convoys.services import staging
from convoys.services.launch import launch_staged
from convoys.services.tokens import create_token

from .support.browser import login, wait_js, wait_live
from .support.factories import bead
from .support.pages import assert_live_equals_reload
from .support.users import full_staff, user_with

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def post_lines(server, token, bead_id, lines):
    request = urllib.request.Request(
        f"{server}/api/beads/{bead_id}/log",
        data=json.dumps({"lines": lines}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 (the test server)
        assert answer.status == 200


def test_the_bead_and_convoy_pages_tail_the_log_live(browser, server, routes):
    bead("gt-w1", "Logged live")
    bead("gt-w2")
    convoy_id = staging.stage(["gt-w1", "gt-w2"], actor="test").convoy_id
    launch_staged(convoy_id, actor="test")
    assert Bead.objects.get(pk="gt-w1").status == "hooked"
    token = create_token(user_with("polecat", "change_bead", "view_bead"), "worker")
    full_staff("lena")
    context, page = login(browser, server, "lena")
    page.goto(f"{server}/beads/gt-w1/")
    wait_live(page)
    assert "has logged nothing" in page.locator("#bead-log").inner_text()
    convoy = context.new_page()
    convoy.goto(f"{server}/convoys/{convoy_id}/")
    wait_live(convoy)
    dashboard = context.new_page()
    dashboard.goto(f"{server}/")
    wait_live(dashboard)
    heard, fetched = dashboard.evaluate("[window.convoyLive.count, window.convoyLive.fetches]")

    post_lines(server, token, "gt-w1", ["cloning the rig", "running <tests>"])
    wait_js(page, "document.querySelectorAll('#bead-log .logline').length === 2", 20000)
    assert page.locator("#bead-log .logline").all_inner_texts() == [
        "cloning the rig",
        "running <tests>",
    ]
    wait_js(
        convoy,
        "(document.querySelector('#bead-row-gt-w1 .b-lastlog') || {}).textContent"
        " && document.querySelector('#bead-row-gt-w1 .b-lastlog').textContent"
        ".includes('running <tests>')",
        20000,
    )
    assert_live_equals_reload({"bead page": page, "convoy page": convoy}, "two lines logged")
    # The dashboard hears of the lines and asks for nothing: it shows none of them.
    wait_js(dashboard, f"window.convoyLive.count > {heard}", 20000)
    assert dashboard.evaluate("window.convoyLive.fetches") == fetched

    # A log append redraws the log alone: the head drawn before stays the same element.
    page.evaluate("document.getElementById('bead-head').dataset.kept = '1'")
    post_lines(server, token, "gt-w1", ["all 12 passed"])
    wait_js(page, "document.querySelectorAll('#bead-log .logline').length === 3", 20000)
    wait_js(
        convoy,
        "document.querySelector('#bead-row-gt-w1 .b-lastlog')"
        ".textContent.includes('all 12 passed')",
        20000,
    )
    assert page.evaluate("document.getElementById('bead-head').dataset.kept") == "1"
    page.evaluate("delete document.getElementById('bead-head').dataset.kept")
    assert_live_equals_reload({"bead page": page, "convoy page": convoy}, "a third line")
    context.close()
