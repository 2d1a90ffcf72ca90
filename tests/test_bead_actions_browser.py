"""In Chromium: on a convoy page, tick one bead, shift-click another to tick the range, choose
retry, see the preview, confirm, see the summary and the beads change live; the page equals
a reload."""

import pytest

from convoys.models import Bead, Event
from convoys.services import convoys

from .support.browser import login, shot, wait_js, wait_live
from .support.factories import bead, command
from .support.pages import assert_live_equals_reload
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_retry_a_range_of_beads_with_a_preview(browser, server, routes):
    full_staff("ann")
    for bead_id in ("gt-k1", "gt-k2", "gt-k3", "gt-k4"):
        bead(bead_id)
    convoy = convoys.create("Parked work", ["gt-k1", "gt-k2", "gt-k3", "gt-k4"])
    # Three parked by the breaker; gt-k2 never failed, so retry refuses it.
    Bead.objects.filter(pk__in=["gt-k1", "gt-k3", "gt-k4"]).update(dispatch_failures=3)
    ctx, page = login(browser, server, "ann")
    page.goto(server + f"/convoys/{convoy.pk}/")
    wait_live(page)

    page.click('#bead-table input[data-pick][value="gt-k1"]')
    page.click('#bead-table input[data-pick][value="gt-k3"]', modifiers=["Shift"])
    ticked = page.eval_on_selector_all(
        "#bead-table input[data-pick]", "boxes => boxes.filter(b => b.checked).map(b => b.value)"
    )
    assert ticked == ["gt-k1", "gt-k2", "gt-k3"]
    assert page.inner_text("#action-picked") == "3 selected"
    page.select_option("#action-choice", "retry")
    page.fill("#action-reason", "pool is back")
    page.click("#action-preview")
    wait_js(page, "document.getElementById('action-confirm')")
    preview = page.inner_text("#action-result")
    assert (
        "Preview: 2 would be retried, 1 refused (gt-k2: gt-k2 has no failed dispatches" in preview
    )
    assert "gt-k1: clears the breaker (3 failed dispatches); dispatches to rig gastown" in preview
    assert not Event.objects.filter(kind="bead.retried").exists()  # the preview changed nothing

    page.click("#action-confirm")
    wait_js(page, "document.getElementById('action-summary').textContent.includes('2 retried')")
    assert "1 refused (gt-k2: gt-k2 has no failed dispatches to retry)" in page.inner_text(
        "#action-summary"
    )
    # The retried beads were fed at once: their rows change live, as any event does.
    wait_js(
        page,
        "['gt-k1', 'gt-k3'].every(i => document.querySelector(`#bead-row-${i} .b-status`)"
        ".textContent.includes('hooked'))",
    )
    assert set(Event.objects.filter(kind="bead.retried").values_list("bead_id", "actor")) == {
        ("gt-k1", "web:ann"),
        ("gt-k3", "web:ann"),
    }
    assert Bead.objects.get(pk="gt-k4").dispatch_failures == 3  # not selected: untouched
    assert_live_equals_reload({"convoy": page}, "the retry")

    # A skip from elsewhere (the command line) shows live on the convoy page and the bead page.
    bead_page = ctx.new_page()
    bead_page.goto(server + "/beads/gt-k4/")
    wait_live(bead_page)
    pages = {"convoy": page, "bead": bead_page}
    command("beads", "skip", "gt-k4", "--reason", "not needed after all")
    wait_js(
        page,
        "document.querySelector('#bead-row-gt-k4 .b-status').textContent.includes('skipped')",
    )
    wait_js(page, "document.querySelector('#wave-1 .c-skipped')")
    wait_js(bead_page, "document.getElementById('bead-history').textContent.includes('skipped')")
    assert "⤼ 1 skipped" in page.inner_text("#convoy-head")
    assert_live_equals_reload(pages, "the skip")
    shot(page, "bead-actions-done")  # last: a full-page shot leaves style="" on the page
    ctx.close()
