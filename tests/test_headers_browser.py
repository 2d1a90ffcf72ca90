"""Every page in Chromium with the demo data loaded, under the real Content Security Policy:
no violation reported (console or `securitypolicyviolation` events), the API docs render their
operations from local assets, and at a 390 px phone width no page scrolls sideways."""

import json
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from convoys.models import Bead, Convoy
from convoys.services import beads

from .support.browser import wait_js, wait_live
from .support.pages import page_urls
from .support.users import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
# Registered before any page script runs; Playwright's init scripts are exempt from the CSP.
COLLECT_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""


@pytest.fixture
def demo_site(server):
    call_command("demo", stdout=StringIO())
    User.objects.create_superuser("root", password=PASSWORD)
    return server, page_urls()


def signed_in(browser, base, **context_options):
    context = browser.new_context(**context_options)
    context.add_init_script(COLLECT_VIOLATIONS)
    page = context.new_page()
    console = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    page.goto(base + "/login/")
    page.fill("#id_username", "root")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")
    return context, page, console


def open_page(page, url):
    response = page.goto(url)
    assert response.status == 200, url
    page.wait_for_load_state("load")
    if url.endswith("/api/docs"):
        page.wait_for_selector(".opblock", timeout=20000)


def test_no_page_violates_the_content_security_policy(browser, demo_site):
    base, urls = demo_site
    context, page, console = signed_in(browser, base, viewport={"width": 1400, "height": 900})
    for url in [*urls, "/login/"]:
        console.clear()
        open_page(page, base + url)
        violations = page.evaluate("window.__csp")
        assert violations == [], (url, violations)
        reported = [m for m in console if "Content Security Policy" in m or "pageerror" in m]
        assert reported == [], (url, reported)
    # Live updates replace parts of the page with server-rendered fragments: still no violation.
    convoy = Convoy.objects.filter(status="open").order_by("created_at").first()
    page.goto(base + f"/convoys/{convoy.pk}/")
    wait_live(page)
    tracked = convoy.tracked.values_list("bead_id", flat=True)
    closing = Bead.objects.filter(pk__in=tracked, status="hooked").values_list("pk", flat=True)[0]
    row = f"document.getElementById('bead-row-{closing}').outerHTML"
    before = page.evaluate(row)
    beads.close_bead(closing, reason="done", actor="test")
    wait_js(page, f"{row} !== {json.dumps(before)}")
    assert page.evaluate("window.__csp") == []
    assert [m for m in console if "Content Security Policy" in m or "pageerror" in m] == []
    context.close()


def test_api_docs_render_their_operations_from_local_assets(browser, demo_site):
    base, _urls = demo_site
    context, page, _console = signed_in(browser, base, viewport={"width": 1400, "height": 900})
    requested = []
    page.on("request", lambda r: requested.append(r.url))
    open_page(page, base + "/api/docs")
    operations = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/api/convoys" in operations and "/api/beads/{bead_id}/close" in operations
    assert requested and all(url.startswith(base) for url in requested), requested
    # "Try it out" works from the page: same-origin fetch with the session (CSP connect-src).
    operation = page.locator(".opblock-get", has=page.locator("[data-path='/api/convoys']"))
    operation.locator(".opblock-summary").first.click()
    operation.locator("button.try-out__btn").click()
    operation.locator("button.execute").click()
    status = operation.locator(".live-responses-table tr.response .response-col_status").first
    status.wait_for(timeout=20000)
    assert status.inner_text().strip() == "200"
    context.close()


def test_the_ui_links_to_the_api_docs(browser, demo_site):
    base, _urls = demo_site
    context, page, _console = signed_in(browser, base, viewport={"width": 1400, "height": 900})
    page.click("nav a:text('API docs')")
    page.wait_for_selector(".opblock", timeout=20000)
    assert page.url == base + "/api/docs"
    context.close()


def test_no_page_scrolls_sideways_on_a_phone(browser, demo_site):
    base, urls = demo_site
    context, page, _console = signed_in(browser, base, viewport={"width": 390, "height": 844})
    for url in [*urls, "/login/"]:
        open_page(page, base + url)
        widths = page.evaluate(
            "[document.scrollingElement.scrollWidth, Math.min(window.innerWidth, 390),"
            " [...document.querySelectorAll('body *')].filter((e) => e.getBoundingClientRect().right"
            " > window.innerWidth + 1).slice(0, 5).map((e) => e.tagName + '.' + e.className)]"
        )
        assert widths[0] <= widths[1], (url, widths)
    context.close()


def test_long_unbroken_ids_and_titles_do_not_widen_a_phone_page(browser, demo_site):
    from convoys.services import convoys

    from .support.factories import bead, blocks, child

    base, _urls = demo_site
    long_id = "gt-" + "x" * 240
    bead(long_id, "W" * 300, assignee="worker-" + "y" * 200)
    bead("gt-" + "z" * 240, "V" * 300)
    blocks(long_id, "gt-" + "z" * 240)
    epic = "gt-" + "e" * 240
    bead(epic, "E" * 300, type="epic")
    child(epic, long_id)
    convoy_id = convoys.create("T" * 200, [long_id, "gt-" + "z" * 240]).pk
    context, page, _console = signed_in(browser, base, viewport={"width": 390, "height": 844})
    for url in [
        "/",
        f"/convoys/{convoy_id}/",
        f"/beads/{long_id}/",
        f"/stage/?epic={epic}",
        "/stranded/",
        "/subscriptions/",
    ]:
        open_page(page, base + url)
        widths = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
        assert widths[0] <= widths[1], (url, widths)
    context.close()
