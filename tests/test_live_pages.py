"""Live pages equal a reload: every page open in Chromium while the services dispatch, fail,
close, land, reopen, park and unpark, and stage with warnings; after each step the live DOM of
each page's main content must equal a fresh render of the same URL (times and CSRF tokens
normalised). Plus: no reload with more than 5,000 events in the log, one toast per landing."""

import pytest
from django.db import transaction

from convoys.infra.dispatchers import Outcome
from convoys.log.events import last_seq, record_many
from convoys.models import Bead, Convoy, Event, Rig
from convoys.services import beads, dispatch, notify, rigs, staging
from convoys.services.launch import launch_staged

from .support.browser import login, wait_js, wait_live
from .support.factories import bead, blocks, child
from .support.pages import assert_live_equals_reload
from .support.users import full_staff
from .support.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class Refuses:
    """A dispatcher whose worker refuses the work."""

    def dispatch(self, bead_id, rig, convoy_id, worker):
        return Outcome(ok=False, error="worker refused")


@pytest.fixture
def epic(routes):
    bead("gt-ep", "Ship the live pages", type="epic")
    for bead_id in ("gt-ea", "gt-eb", "gt-ec"):
        bead(bead_id, f"Part {bead_id[-1]}")
        child("gt-ep", bead_id)
    blocks("gt-ea", "gt-eb")
    bead("gt-next", "Next epic", type="epic")
    for bead_id in ("gt-na", "gt-nb"):
        bead(bead_id)
        child("gt-next", bead_id)
    return staging.stage(["gt-ep"], actor="web:ann").convoy_id


def test_every_page_equals_a_reload_after_each_step(browser, server, epic):
    convoy_id = epic
    ann = full_staff("ann")
    notify.subscribe(ann, None)
    context, first = login(browser, server, "ann")
    urls = {
        "dashboard": "/",
        "convoy": f"/convoys/{convoy_id}/",
        "bead": "/beads/gt-eb/",
        "stranded": "/stranded/",
        "inbox": "/inbox/",
        "stage": "/stage/?epic=gt-next",
        "subscriptions": "/subscriptions/",
    }
    pages = {}
    for name, url in urls.items():
        page = first if name == "dashboard" else context.new_page()
        page.goto(server + url)
        wait_live(page)
        pages[name] = page
    navigations = {name: [] for name in pages}
    for name, page in pages.items():
        page.on("framenavigated", lambda frame, name=name: navigations[name].append(frame.url))
    assert_live_equals_reload(pages, "opening")

    with transaction.atomic():
        claim = dispatch.claim(Bead.objects.get(pk="gt-ec"), convoy_id=convoy_id)
    dispatch.run(claim, dispatcher=Refuses())
    assert_live_equals_reload(pages, "a failed dispatch")

    launch_staged(convoy_id, force=True, actor="web:ann")
    assert Bead.objects.get(pk="gt-ea").status == "hooked"
    assert_live_equals_reload(pages, "launch (dispatch)")

    beads.close_bead("gt-ea", actor="test")
    assert_live_equals_reload(pages, "a close (the next bead is fed)")

    for bead_id in ("gt-eb", "gt-ec"):
        beads.close_bead(bead_id, actor="test")
    wait_until(lambda: Convoy.objects.get(pk=convoy_id).status == "closed")
    assert_live_equals_reload(pages, "the landing")
    assert pages["convoy"].locator("#convoy-actions button", has_text="Check").count() == 0
    assert "Estimated landing" not in pages["convoy"].inner_text("#main")
    icons = pages["convoy"].locator("svg.dag .node .icon").all_text_contents()
    assert icons == ["✓", "✓", "✓"]
    assert pages["bead"].locator("#reopen-bead").count() == 1
    assert pages["inbox"].inner_text("#unread") == "1"

    beads.reopen_bead("gt-eb", actor="test")
    assert_live_equals_reload(pages, "a reopen")

    rig = Bead.objects.get(pk="gt-eb").rig_id
    rigs.set_rig_state(rig, Rig.PARKED, actor="test")
    assert_live_equals_reload(pages, "parking the rig")
    rigs.set_rig_state(rig, Rig.ACTIVE, actor="test")
    assert_live_equals_reload(pages, "un-parking the rig")

    plan = staging.stage(["gt-next"], actor="web:ann")
    assert plan.status == "staged_warnings"
    assert_live_equals_reload(pages, "staging with warnings")
    assert "staged with warnings" in pages["dashboard"].inner_text("#convoy-table")
    assert navigations == {name: [] for name in pages}  # nothing reloaded itself
    # the drawing still pans and zooms after its nodes were replaced live
    graph = pages["convoy"].locator("#dag svg")
    before = graph.get_attribute("viewBox")
    pages["convoy"].click("[data-zoom='1.25']")
    assert graph.get_attribute("viewBox") != before
    pages["convoy"].click("[data-zoom='0']")
    assert graph.get_attribute("viewBox") == before
    context.close()


def test_a_page_opened_with_a_long_log_does_not_reload(browser, server, epic):
    convoy_id = epic
    full_staff("ann")
    with transaction.atomic():
        record_many(
            [
                dict(kind="bead.updated", bead_id="gt-na", actor="test", data={"n": i})
                for i in range(5200)
            ]
        )
    context, page = login(browser, server, "ann")
    for url in ("/stage/", "/subscriptions/", "/", f"/convoys/{convoy_id}/"):
        page.goto(server + url)
        wait_live(page)
        assert int(page.evaluate("document.body.dataset.asOf")) == last_seq()
        navigated = []
        page.on("framenavigated", lambda frame, seen=navigated: seen.append(frame.url))
        beads.update_bead("gt-ea", priority=1 if url == "/" else 3, actor="test")
        wait_js(page, f"window.convoyLive.last >= {last_seq()}", timeout=15000)
        page.wait_for_timeout(500)  # a reload would have started by now
        assert navigated == [], url
        assert page.evaluate("window.convoyLive.count") <= 2, url  # no history replayed
    context.close()


# Stands in for the browser's notifications: records what the page asks to show.
FAKE_NOTIFICATION = """
window.notified = [];
window.Notification = function (title, options) { window.notified.push([title, options.tag]); };
window.Notification.permission = "granted";
window.Notification.requestPermission = async () => "granted";
"""


def test_one_toast_per_landing_only_where_the_convoy_is_shown(browser, server, epic):
    convoy_id = epic
    ann = full_staff("ann")
    notify.subscribe(ann, None)
    launch_staged(convoy_id, force=True, actor="test")
    context, dashboard = login(browser, server, "ann")
    context.add_init_script(FAKE_NOTIFICATION)
    stranded = context.new_page()
    other = staging.stage(["gt-next"], actor="test").convoy_id
    elsewhere = context.new_page()  # another convoy's page: not told about this one
    full_staff("bob")  # subscribes to nothing: his dashboard shows the landing, quietly
    bob_context, bob = login(browser, server, "bob")
    for page, url in (
        (dashboard, "/"),
        (stranded, "/stranded/"),
        (elsewhere, f"/convoys/{other}/"),
    ):
        page.goto(server + url)
    for page in (dashboard, stranded, elsewhere, bob):
        wait_live(page)
    for bead_id in ("gt-ea", "gt-eb", "gt-ec"):
        beads.close_bead(bead_id, actor="test")
    wait_until(lambda: Convoy.objects.get(pk=convoy_id).status == "closed")
    wait_until(lambda: ann.notification_set.exists())
    final = last_seq()
    for page in (dashboard, stranded, elsewhere):
        wait_js(page, f"window.convoyLive.last >= {final}", timeout=15000)
    landed = Event.objects.filter(kind="convoy.landed").order_by("seq").last().seq
    wait_js(bob, f"window.convoyLive.last >= {landed}", timeout=15000)  # ann's notice is hers
    for page in (dashboard, stranded):
        toasts = page.evaluate("window.convoyLive.toasts")
        assert toasts.count(f"Convoy landed: Ship the live pages ({convoy_id})") == 1, toasts
        assert not [t for t in toasts if "Convoy: " in t], toasts
        assert not [t for t in toasts if "ispatch" in t], toasts  # the rows show dispatches
        assert page.locator(".toast").count() <= 3
    assert elsewhere.evaluate("window.convoyLive.toasts") == []
    assert bob.evaluate("window.convoyLive.toasts") == []  # not his to hear
    bob_context.close()
    # another convoy's page hears every event but asks for fragments only for its own (and
    # for the inbox badge: one request, after the landing's notification)
    assert elsewhere.evaluate("window.convoyLive.fetches") == 1
    # the browser notification: once for the three tabs, tagged with the landing
    shown = [n for page in (dashboard, stranded, elsewhere) for n in page.evaluate("notified")]
    assert shown == [["Convoy landed: Ship the live pages", f"landed:{convoy_id}"]]
    context.close()
