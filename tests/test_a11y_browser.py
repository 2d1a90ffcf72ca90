"""Accessibility, checked by axe-core (bundled by axe-playwright-python) in Chromium: every page a
user meets, signed out and signed in, in light and in dark mode, has no serious or critical
violation. Each finding is named by page, rule and element."""

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.admin.utils import quote
from django.urls import reverse

from convoys.models import Bead, Convoy
from convoys.services import savedviews, worklog

from .support.browser import sign_in
from .support.factories import big_convoy

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SERIOUS = {"serious", "critical"}


@pytest.fixture
def overview(demo):
    """A convoy drawn as an overview, built before the server's cluster starts (it projects
    what it sees: a bulk insert beside it would project the same beads twice)."""
    return big_convoy()[0]


def pages(overview):
    """{what: url} of each kind of page, on the demo town and a convoy drawn as an overview."""
    convoy = Convoy.objects.exclude(pk=overview).order_by("created_at").first()
    bead = Bead.objects.exclude(issue_type="epic").order_by("id").first()
    epic = Bead.objects.filter(issue_type="epic").order_by("id").first()
    return {
        "dashboard": "/",
        "convoy page": reverse("convoy", args=[convoy.pk]),
        "convoy overview": reverse("convoy", args=[overview]),
        "bead page": reverse("bead", args=[bead.pk]),
        "stage": f"/stage/?epic={epic.pk}",
        "create": "/create/",
        "stranded": "/stranded/",
        "inbox": "/inbox/",
        "subscriptions": "/subscriptions/",
        "search": f"/search/?q={bead.pk[:4]}",
        "admin change form": reverse("admin:convoys_bead_change", args=[quote(bead.pk)]),
    }


def serious(page, what):
    """One line per serious or critical violation axe finds on the page now."""
    found = Axe().run(page).response.get("violations", [])
    return [
        f"{what}: {v['id']} ({v['impact']}): {v['help']} at "
        + "; ".join(
            f"{node['target']} {node.get('failureSummary', '')}".replace("\n", " ")
            for node in v["nodes"][:3]
        )
        for v in found
        if v.get("impact") in SERIOUS
    ]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_no_page_has_a_serious_accessibility_violation(browser, demo, overview, server, scheme):
    urls = pages(overview)
    # The parts a page shows only once there is something: a worker's log, saved views.
    logged = Bead.objects.exclude(issue_type="epic").order_by("id").first()
    worklog.append(logged.pk, ["cloning", "running the tests"], actor="test")
    for page_name in ("dashboard", "stranded"):
        savedviews.save(demo, page_name, "Mine", "q=a")
    # axe injects its script the way Playwright evaluates any: the pages' CSP is not in question
    # here (tests/test_headers_browser.py checks it), so this context bypasses it.
    context = browser.new_context(
        color_scheme=scheme, bypass_csp=True, viewport={"width": 1400, "height": 900}
    )
    page = context.new_page()
    page.goto(server + "/login/")
    problems = serious(page, "login")
    sign_in(page, server, demo.username)
    for what, url in urls.items():
        page.goto(server + url)
        page.wait_for_load_state("load")
        problems += serious(page, what)
    # The command palette, open with its options listed, one of them active.
    page.goto(server + "/")
    page.keyboard.press("Control+k")
    page.keyboard.type(urls["bead page"].split("/")[2][:4])
    page.wait_for_selector("#palette-list [role=option][aria-selected=true]")
    page.wait_for_selector("#palette-list [role=option] >> text=Search for")
    problems += serious(page, "command palette")
    context.close()
    assert problems == [], "\n".join(problems)
