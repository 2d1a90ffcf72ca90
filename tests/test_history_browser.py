"""The convoy's story over time in Chromium: the timeline by wave follows
the log live, the time slider shows the page as after a past event and comes back to now,
and beads changed since the user's last visit are marked. Screenshots: timeline, slider."""

import time

import pytest
from playwright.sync_api import Error as PlaywrightError

from convoys.log.events import last_seq
from convoys.models import Bead, Convoy, ConvoyVisit
from convoys.services import beads, staging
from convoys.services.launch import launch_staged

from .support.browser import SHOTS, login, wait_js, wait_live
from .support.factories import bead, blocks, child
from .support.users import full_staff
from .support.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def screenshot(page, locator, name):
    """A screenshot for the artifacts; a live update may replace the element while it is
    taken (it is not part of what the test asserts), then the next one is taken."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        try:
            page.locator(locator).screenshot(path=str(SHOTS / f"{name}.png"))
            return
        except PlaywrightError:
            if attempt == 2:
                raise


@pytest.fixture
def convoy_id(routes):
    bead("gt-hx", "Story epic", type="epic")
    for bead_id in ("gt-h1", "gt-h2", "gt-h3", "gt-h4"):
        bead(bead_id, f"Step {bead_id[-1]}")
        child("gt-hx", bead_id)
    blocks("gt-h1", "gt-h2")
    blocks("gt-h2", "gt-h3")
    blocks("gt-h1", "gt-h4")
    convoy_id = staging.stage(["gt-hx"], actor="test").convoy_id
    launch_staged(convoy_id, force=True, actor="test")
    return convoy_id


def node_class(page, bead_id):
    return page.evaluate(
        f"() => document.querySelector('#dag g.node[data-id=\"{bead_id}\"]').getAttribute('class')"
    )


def test_timeline_slider_and_since_last_visit(browser, server, convoy_id):
    full_staff("hana")
    context, page = login(browser, server, "hana")
    url = f"{server}/convoys/{convoy_id}/"
    assert Bead.objects.get(pk="gt-h1").status == "hooked"
    page.goto(url)
    wait_live(page)
    # First visit: nothing marked, the report says nothing.
    wait_js(page, "window.convoyHistory && window.convoyHistory.changed !== undefined")
    assert page.locator("#since-visit").is_hidden()

    # The timeline: wave 1 (the frontier) shows gt-h1 in progress; a close moves it live.
    assert page.locator('#gantt tr[data-bead="gt-h1"] rect.g-active').count() == 1
    beads.close_bead("gt-h1", actor="test")
    wait_until(lambda: Bead.objects.get(pk="gt-h2").status == "hooked")  # the cluster fed it
    wait_js(page, "document.querySelector('#gantt-card').dataset.wave === '2'", 20000)
    wait_js(page, "document.querySelector('#gantt tr[data-bead=\"gt-h2\"] rect.g-active')", 20000)
    page.select_option("#gantt-card select[name=twave]", "1")
    page.click("#gantt-card form button")
    page.wait_for_url("**twave=1")
    wait_live(page)
    row = '#gantt tr[data-bead="gt-h1"]'
    assert page.locator(f"{row} rect.g-active").count() == 1
    assert page.locator(f"{row} rect.g-done").count() == 1
    screenshot(page, "#gantt-card", "timeline")

    # The slider: step 1 is the first event of the convoy's stream (gt-h1 created: nothing
    # done, the rest not yet in the log); the DAG, the wave table and the counts say so.
    slider = page.locator("#history-slider")
    steps = int(slider.get_attribute("max"))
    assert steps > 10 and slider.evaluate("s => s.value") == str(steps)
    # A live update landing while the move waits to be shown leaves the slider where the
    # user put it (it used to snap back to the end, and the step was never shown).
    slider.evaluate(
        "s => { s.value = '1'; s.dispatchEvent(new Event('input'));"
        " document.dispatchEvent(new CustomEvent('convoy:fragments')); }"
    )
    wait_js(page, "document.body.classList.contains('history-past')")
    wait_js(page, "window.convoyHistory.past && window.convoyHistory.past.step === 1")
    assert slider.evaluate("s => s.value") == "1"
    assert "step 1 of" in page.inner_text("#history-state")
    assert "st-ready" in node_class(page, "gt-h1")
    assert "st-unknown" in node_class(page, "gt-h3")
    assert page.inner_text("#wave-1 .c-done") == "0"
    assert page.inner_text("#convoy-head p.counts").startswith("As after event #")
    assert " 0/4 done (0%)" in page.inner_text("#convoy-head p.counts")
    assert page.locator("#convoy-head svg.bar rect.seg.done").count() == 0
    # The step after gt-h1's close: done, and gt-h2 ready (not yet fed).
    past = page.evaluate(
        f"async () => (await fetch('/convoys/{convoy_id}/history/?step={steps}')).json()"
    )
    assert past["states"]["gt-h1"] == "done"
    screenshot(page, "#main", "slider")
    # A live update while the past is shown: the past stays shown, the slider's end grows.
    beads.close_bead("gt-h4", actor="test")
    wait_js(page, f"parseInt(document.getElementById('history-slider').max, 10) > {steps}", 20000)
    assert "st-ready" in node_class(page, "gt-h1")
    page.click("#history-now")
    wait_js(page, "!document.body.classList.contains('history-past')")
    wait_js(
        page,
        "document.querySelector('#dag g.node[data-id=\"gt-h1\"]').classList.contains('st-done')",
    )
    assert page.inner_text("#history-state") == "Showing now."
    assert "As after" not in page.inner_text("#convoy-head p.counts")

    # Since your last visit: gt-h2 closes while the user is away; the next visit marks it.
    page.goto("about:blank")
    beads.close_bead("gt-h2", actor="test")
    page.goto(url)
    wait_js(page, "!document.getElementById('since-visit').hidden")
    text = page.inner_text("#since-visit")
    assert "Since your last visit" in text and "gt-h2" in text and "gt-h1" not in text
    assert "since-visit" in node_class(page, "gt-h2")
    assert "since-visit" not in node_class(page, "gt-h1")
    assert Convoy.objects.get(pk=convoy_id).status == "open"
    context.close()


def _shown_up_to(page, seq):
    wait_js(page, f"parseInt(document.body.dataset.rendered || '0', 10) >= {seq}", 20000)


def _visit_seq(username, convoy_id):
    visit = ConvoyVisit.objects.filter(user__username=username, convoy_id=convoy_id).first()
    return visit.seq if visit else 0


def test_what_a_visible_page_showed_is_seen_and_a_hidden_tab_marks_it(browser, server, convoy_id):
    full_staff("ines")
    context, page = login(browser, server, "ines")
    url = f"{server}/convoys/{convoy_id}/"
    page.goto(url)
    wait_live(page)
    wait_until(lambda: _visit_seq("ines", convoy_id) > 0)
    # Watched live: the change is seen, and a reload marks nothing.
    beads.update_bead("gt-h3", title="Step 3, renamed", actor="test")
    seq = last_seq()
    _shown_up_to(page, seq)
    wait_until(lambda: _visit_seq("ines", convoy_id) >= seq)
    page.reload()
    wait_js(page, "!document.getElementById('since-visit').hidden")
    assert "Nothing changed since your last visit" in page.inner_text("#since-visit")
    assert "since-visit" not in node_class(page, "gt-h3")
    wait_live(page)
    # The tab is hidden while a change arrives: applied, not seen; shown again, it is marked.
    page.evaluate(
        "() => { Object.defineProperty(document, 'visibilityState', "
        "{ value: 'hidden', configurable: true }); "
        "document.dispatchEvent(new Event('visibilitychange')); }"
    )
    before = _visit_seq("ines", convoy_id)
    beads.update_bead("gt-h2", title="Step 2, renamed", actor="test")
    seq = last_seq()
    _shown_up_to(page, seq)
    time.sleep(1)
    assert _visit_seq("ines", convoy_id) == before  # not reported while hidden
    page.evaluate(
        "() => { Object.defineProperty(document, 'visibilityState', "
        "{ value: 'visible', configurable: true }); "
        "document.dispatchEvent(new Event('visibilitychange')); }"
    )
    wait_js(page, "document.getElementById('since-visit').textContent.includes('hidden')")
    text = page.inner_text("#since-visit")
    assert "While this tab was hidden: 1 bead changed" in text and "gt-h2" in text
    assert "since-visit" in node_class(page, "gt-h2")
    assert "since-visit" not in node_class(page, "gt-h3")
    wait_until(lambda: _visit_seq("ines", convoy_id) >= seq)
    context.close()
