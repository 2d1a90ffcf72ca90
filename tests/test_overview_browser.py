"""The overview of a big convoy in Chromium: under the DOM budget, a wave opened on demand
draws its beads (fetched as fragments, the URL keeps it for live updates and a reload),
"Focus on" a bead of a wave not drawn draws it; screenshot artifacts/screenshots/overview.png."""

import pytest

from convoys.read import sizes
from convoys.services import beads

from .support.browser import SHOTS, login, wait_js
from .support.factories import big_convoy
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DOM_BUDGET = 10_000


def test_a_big_convoy_overview_stays_small_and_opens_waves(browser, server, routes):
    convoy_id, ids = big_convoy(size=2000, done=300)
    full_staff("ann")
    context, page = login(browser, server, "ann")
    page.goto(server + f"/convoys/{convoy_id}/")
    page.wait_for_selector("#dag svg g.node")
    assert page.locator("#overview-note").is_visible()
    assert page.evaluate("document.getElementsByTagName('*').length") < DOM_BUDGET
    drawn = page.locator("#dag g.node[data-id]").count()
    assert 0 < drawn <= sizes.WAVE_DRAWN + sizes.CRITICAL_DRAWN
    # (by script: the server's stranded scan feeds this convoy, so a live update may
    # replace the card while a locator waits for it to be stable)
    page.evaluate("document.getElementById('dag-card').closest('section').scrollIntoView()")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "overview.png"))  # the graph and the wave bands
    # open the last wave listed in the wave table: its beads are drawn, without a reload
    link = page.locator("#wave-table a[data-open-wave]").last
    wave = link.get_attribute("data-open-wave")
    page.evaluate("window.notReloaded = true")
    link.click()
    wait_js(page, f"new URL(location.href).searchParams.get('open') === '{wave}'")
    wait_js(
        page,
        f"document.querySelector('#dag text.column') && [...document.querySelectorAll('#dag text.column')].some((t) => t.textContent === 'Wave {wave}')",
    )
    wait_js(page, f"document.querySelectorAll('#dag g.node[data-id]').length > {drawn}")
    assert page.evaluate("window.notReloaded") is True
    assert page.evaluate("document.getElementsByTagName('*').length") < DOM_BUDGET
    opened = page.locator("#dag g.node[data-id]").evaluate_all(
        "(gs) => gs.map((g) => g.dataset.id)"
    )
    # a live update after opening keeps the wave drawn (the URL carries ?open=)
    target = sorted(set(opened) & set(ids))[-1]
    beads.update_bead(target, status="in_progress", assignee="ann", actor="test")
    wait_js(page, f"document.querySelector('#n-{target} g.node.st-active')", timeout=20000)
    assert page.locator(f'#wave-table tr[data-wave="{wave}"] .tag').count() == 1
    # "Focus on" a bead in a wave not drawn: the page draws that wave and centres the bead
    far = ids[-1]
    assert page.locator(f'#dag g.node[data-id="{far}"]').count() == 0
    page.fill("input[name=focus]", far)
    page.click("form:has(input[name=focus]) button[type=submit]")
    page.wait_for_selector(f'#dag g.node[data-id="{far}"]')
    assert page.locator("#dag").get_attribute("data-focus") == far
    assert page.locator("#focus-missing").count() == 0
    context.close()
