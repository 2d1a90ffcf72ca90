"""Relative times keep true on a page left open: live.js words them again from the exact time
each <time> carries, with the server's clock; the exact time stays on hover."""

import pytest

from convoys.services import convoys

from .factories import bead
from .test_browser import browser, make_user, server, sign_in  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_page_left_open_ages_its_times(browser, server, routes):  # noqa: F811
    bead("gt-old")
    convoy = convoys.create("Left open", ["gt-old"])
    make_user("watcher")
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.clock.install()
    page = context.new_page()
    sign_in(page, server, "watcher")
    page.goto(f"{server}/convoys/{convoy.pk}/")
    created = page.locator("#convoy-head time[data-relative]").first
    assert created.text_content() == "just now"
    title = created.get_attribute("title")
    page.clock.run_for("05:00")  # five minutes with the page open, no event
    assert created.text_content() == "5m ago"
    page.clock.run_for("02:00:00")
    assert created.text_content() == "2h 5m ago"
    assert created.get_attribute("title") == title  # the exact time stays on hover
    exact = page.locator("time:not([data-relative])")
    assert all(t.text_content() == t.get_attribute("title") for t in exact.all())
    context.close()
