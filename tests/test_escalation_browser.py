"""In Chromium: a stuck convoy's escalation reaches the owner's open inbox live (a toast and
the Action needed list), the inbox's Acknowledge button stops it; a receipt the user takes in
the daily digest arrives in the inbox without a toast."""

import pytest

from convoys.models import Escalation, Event
from convoys.services import beads, convoys, escalation, notify

from .support.browser import login, shot, wait_js, wait_live
from .support.factories import STUCK, bead, blocks, started
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_escalation_toast_and_acknowledge_in_the_inbox(browser, server, routes):
    alice = full_staff("alice")
    bead("gt-gate", "Pick a database", type="decision")
    bead("gt-w", "Migrate")
    blocks("gt-gate", "gt-w")
    stuck = convoys.create("Stuck work", ["gt-w"], owner="alice")
    ctx, page = login(browser, server, "alice")
    page.goto(server + "/inbox/")
    wait_live(page)

    escalation.escalate_stuck(now=started(stuck) + STUCK)
    wait_js(
        page,
        "[...document.querySelectorAll('.toast.bad')]"
        ".some(t => t.textContent === '⚠ Convoy stuck: Stuck work')",
    )
    # Announced once: by the live region it is added to, not by a role of its own as well.
    toast = "document.querySelector('.toast.bad')"
    announced = page.evaluate(
        f"() => [{toast}.getAttribute('role'), {toast}.parentElement.getAttribute('aria-live')]"
    )
    assert announced == [None, "polite"]
    wait_js(page, "document.querySelector('#inbox-action form.ack button') !== null")
    assert "gt-w (gated): gated by gt-gate" in page.inner_text("#inbox-action")
    shot(page, "inbox-escalation")
    page.click("#inbox-action form.ack button")
    page.wait_for_url(server + "/inbox/")
    assert "acknowledged by web:alice" in page.inner_text("#inbox-action")
    assert Escalation.objects.get(pk=stuck.pk).acknowledged_by == "web:alice"
    page.goto(server + f"/convoys/{stuck.pk}/")
    assert "Acknowledged by web:alice" in page.inner_text("#convoy-escalation")
    shot(page, "convoy-escalation-acknowledged")
    page.goto(server + "/inbox/")

    # Receipts in the daily digest: in the inbox, no toast.
    notify.set_preferences(alice, receipts="digest")
    notify.subscribe(alice)
    wait_live(page)
    bead("gt-r", "Quick")
    landed = convoys.create("Quiet landing", ["gt-r"])
    beads.close_bead("gt-r")
    convoys.check(landed.pk)
    wait_js(page, "document.getElementById('inbox-receipts').textContent.includes('Quiet landing')")
    seq = Event.objects.filter(kind="notification", convoy_id=landed.pk).get().seq
    wait_js(page, f"window.convoyLive.last >= {seq}")  # handled (and toasted, were it loud)
    toasts = page.evaluate("window.convoyLive.toasts")
    assert not any("Quiet landing" in t for t in toasts), toasts
    ctx.close()
