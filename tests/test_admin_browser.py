"""The admin in a real browser: log in, add a bead with a dependency through the form, see it
saved with its events (daphne and the task cluster as real processes, as in test_browser)."""

import pytest

from convoys.models import Bead, Event
from convoys.services import rigs

from .support.browser import shot
from .support.factories import bead
from .support.users import PASSWORD, full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_admin_adds_a_bead_with_a_dependency(browser, server):
    rigs.upsert_route("gt-", "gastown/mayor/rig")
    bead("gt-base")
    full_staff("ada")
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(server + "/admin/login/?next=/admin/convoys/bead/add/")
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(server + "/admin/convoys/bead/add/")
    page.fill("#id_id", "gt-web1.2")
    page.fill("#id_title", "Made in the admin")
    page.fill("#id_description", "Two lines,\n  the second indented.")
    page.select_option("#id_issue_type", "bug")
    page.fill("#id_labels", "ui\nadmin")
    page.fill("#id_dependencies-0-depends_on_id", "gt-base")
    page.click("input[name=_save]")
    page.wait_for_url(server + "/admin/convoys/bead/")
    assert "was added successfully" in page.inner_text(".messagelist")

    made = Bead.objects.get(pk="gt-web1.2")
    assert (made.title, made.issue_type, made.labels, made.rig_id) == (
        "Made in the admin",
        "bug",
        ["ui", "admin"],
        "gastown",
    )
    assert list(made.dependencies.values_list("depends_on_id", flat=True)) == ["gt-base"]
    page.goto(server + "/admin/convoys/event/?q=gt-web1.2")
    rows = page.inner_text("#result_list tbody")
    assert "bead.created" in rows and "bead.updated" in rows and "admin:ada" in rows
    assert list(
        Event.objects.filter(bead_id="gt-web1.2").order_by("seq").values_list("kind", "actor")
    ) == [("bead.created", "admin:ada"), ("bead.updated", "admin:ada")]
    shot(page, "admin-events")

    # saved again unchanged from the browser (textarea line breaks come back as CRLF): no change
    page.goto(server + "/admin/convoys/bead/gt-web1.2/change/")
    page.click("input[name=_save]")
    page.wait_for_url(server + "/admin/convoys/bead/")
    assert Bead.objects.get(pk="gt-web1.2").description == "Two lines,\n  the second indented."
    assert Event.objects.filter(bead_id="gt-web1.2").count() == 2
    context.close()
