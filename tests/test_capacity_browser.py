"""The dashboard's Town capacity panel in Chromium, against a real web process and task
cluster: it follows the town live (a close frees a slot, the cluster fills it from the
queue, the panel shows one fewer queued) with no reload."""

import pytest

from convoys.services import beads, controls, staging
from convoys.services.launch import launch_staged

from .support.browser import login, shot, wait_js, wait_live
from .support.factories import bead
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_capacity_panel_follows_the_town_live(routes, browser, server):
    controls.set_cap(1, actor="ops")  # the run-time override: the server's processes read it
    plan = staging.stage([bead(f"gt-w{i}").id for i in range(3)], actor="test")
    launch_staged(plan.convoy_id, force=True)
    full_staff("viewer")
    context, page = login(browser, server, "viewer")
    try:
        panel = page.locator("#capacity-panel")
        assert "1 in flight / cap 1 · 0 free · 2 queued" in panel.inner_text()
        assert "set by ops" in panel.inner_text()
        wait_live(page)
        page.evaluate("() => { window.__sameDocument = true; }")
        beads.close_bead("gt-w0")  # the cluster feeds the town: gt-w1 takes the slot
        wait_js(
            page,
            "document.querySelector('#capacity-panel').innerText"
            ".includes('1 in flight / cap 1 · 0 free · 1 queued')",
        )
        text = panel.inner_text()
        assert "gt-w2" in text and "gt-w1" not in text
        assert page.evaluate("() => window.__sameDocument === true")  # live, not a reload
        shot(page, "dashboard-capacity")
    finally:
        context.close()
