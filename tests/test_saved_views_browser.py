"""Saved views in Chromium, from the dashboard itself: filter, save under a name, make it the
default (the dashboard opened bare shows it, "Show all" does not), open its link as another
user, rename and delete it."""

import pytest

from convoys.services import staging

from .support.browser import login, wait_live
from .support.factories import bead
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def rows(page):
    return set(
        page.locator("tr[data-convoy]").evaluate_all("(rs) => rs.map((r) => r.dataset.convoy)")
    )


def test_save_default_share_rename_delete_from_the_dashboard(browser, server, routes):
    bead("gt-v1", "Apples")
    bead("gt-v2", "Pears")
    apples = staging.stage(["gt-v1"], title="Apples", actor="test").convoy_id
    pears = staging.stage(["gt-v2"], title="Pears", actor="test").convoy_id
    full_staff("vera")
    full_staff("otto")
    context, page = login(browser, server, "vera")
    wait_live(page)
    assert {apples, pears} <= rows(page)

    page.fill("#dashboard-filters input[name=q]", "Apples")
    page.click("#dashboard-filters button[type=submit]")
    page.wait_for_url("**q=Apples**")
    assert rows(page) == {apples}
    page.fill("#saved-views form.save-view input[name=name]", "Apples only")
    page.click("#saved-views form.save-view button")
    page.wait_for_url("**q=Apples**")
    assert "Saved the view" in page.locator(".messages").inner_text()
    link = page.locator("#saved-views li a", has_text="Apples only")
    assert link.get_attribute("aria-current") == "page"
    shared = server + link.get_attribute("href")

    page.click("#saved-views li button:has-text('Make default')")
    page.wait_for_load_state("load")
    assert "is now your default" in page.locator(".messages").inner_text()
    page.goto(server + "/")
    assert "q=Apples" in page.url and rows(page) == {apples}
    page.click("#saved-views a.all-link")
    page.wait_for_url("**all=1")
    assert {apples, pears} <= rows(page)

    other, theirs = login(browser, server, "otto")
    theirs.goto(shared)
    assert "q=Apples" in theirs.url and rows(theirs) == {apples}
    other.close()

    page.fill("#saved-views li input[name=name]", "Just apples")
    page.click("#saved-views li button:has-text('Rename')")
    page.wait_for_load_state("load")
    assert page.locator("#saved-views li a").inner_text() == "Just apples"
    page.click("#saved-views li button:has-text('delete')")
    page.wait_for_load_state("load")
    assert "Deleted the view" in page.locator(".messages").inner_text()
    assert page.locator("#saved-views li").count() == 0
    page.goto(server + "/")
    assert page.url == server + "/"
    context.close()
