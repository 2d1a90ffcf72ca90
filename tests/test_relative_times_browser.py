"""Relative times keep true on a page left open: live.js words them again from the exact time
each <time> carries, with the server's clock; the exact time stays on hover."""

import pytest

from convoys.services import convoys

from .support.browser import sign_in, wait_live
from .support.factories import bead
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_page_left_open_ages_its_times(browser, server, routes):
    bead("gt-old")
    convoy = convoys.create("Left open", ["gt-old"])
    full_staff("watcher")
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.clock.install()
    page = context.new_page()
    sign_in(page, server, "watcher")
    page.goto(f"{server}/convoys/{convoy.pk}/")
    created = page.locator("#convoy-head time[data-relative]").first
    assert created.text_content() == "just now"
    title = created.get_attribute("title")
    wait_live(page)
    page.clock.run_for("05:00")  # five minutes with the page open, no event
    reads(page, created, "5m ago")
    page.clock.run_for("02:00:00")
    reads(page, created, "2h 5m ago")
    assert created.get_attribute("title") == title  # the exact time stays on hover
    exact = page.locator("time:not([data-relative])")
    assert all(t.text_content() == t.get_attribute("title") for t in exact.all())
    context.close()


def reads(page, time_element, text):
    """Wait until `time_element` reads `text`. A live fragment still in flight when the clock
    moved (the convoy's own creation, relayed late on a busy machine) redraws the head with the
    server's words for the real time; the next rewording, at most 20 s of page time later and
    well within the same minute, words it from the page's clock again."""
    for attempt in range(30):
        if time_element.text_content() == text:
            return
        page.wait_for_timeout(100)
        if attempt in (9, 19):
            page.clock.run_for(20_000)
    assert time_element.text_content() == text
