"""The causes on a live convoy page equal a reload: a pause (an event naming no bead changes
every bead's cause), a new max in flight, a resume that feeds, a close that unblocks and a
decision that opens a gate, with a real web process and task cluster."""

import pytest

from convoys.models import Bead
from convoys.services import beads, controls, convoys

from .support.browser import login, wait_live
from .support.factories import bead, blocks
from .support.pages import assert_live_equals_reload
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def kinds(page):
    return page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll("#bead-table tr[data-bead]")]
             .map((row) => [row.dataset.bead, (row.querySelector("[data-cause]") || {dataset: {}}).dataset.cause || null]))"""
    )


def test_causes_on_the_live_convoy_page_equal_a_reload(browser, server, routes):
    for bead_id in ("gt-a", "gt-b", "gt-c", "gt-e"):
        bead(bead_id)
    bead("gt-d", "Go ahead?", type="decision")
    blocks("gt-a", "gt-b")
    blocks("gt-d", "gt-e")
    convoy = convoys.create("Live causes", ["gt-a", "gt-b", "gt-c", "gt-e"], actor="test")
    controls.pause(convoy.pk, actor="ops", reason="hold")
    full_staff("ann")
    context, page = login(browser, server, "ann")
    page.goto(f"{server}/convoys/{convoy.pk}/")
    wait_live(page)
    pages = {"convoy": page}
    assert kinds(page) == dict.fromkeys(["gt-a", "gt-b", "gt-c", "gt-e"], "paused")
    assert_live_equals_reload(pages, "opening a paused convoy")

    convoys.update_fields(convoy.pk, max_in_flight=1, actor="test")
    assert_live_equals_reload(pages, "a new max in flight")

    controls.resume(convoy.pk, actor="ops")  # feeds gt-a; gt-c waits for the one slot
    assert_live_equals_reload(pages, "resume")
    assert kinds(page) == {
        "gt-a": "working",
        "gt-b": "blocked",
        "gt-c": "waiting-for-capacity",
        "gt-e": "gated",
    }

    beads.close_bead("gt-a", actor="test")  # the feeder takes gt-b or gt-c
    assert_live_equals_reload(pages, "a close")
    assert Bead.objects.filter(pk__in=["gt-b", "gt-c"], status="hooked").count() == 1

    beads.close_bead("gt-d", actor="test")  # the gate opens: gt-e waits for the slot
    assert_live_equals_reload(pages, "the decision closed")
    assert kinds(page)["gt-e"] == "waiting-for-capacity"
    context.close()
