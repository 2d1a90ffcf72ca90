"""Create and fix work in a real browser (daphne and the task cluster as real processes, as in
test_browser): an epic with children from /create/, then on its staged convoy's page the
parked-rig warning and the Un-park button that makes it ready to launch."""

import re

import pytest

from convoys.models import Bead, Convoy, Dependency
from convoys.services import rigs, staging

from .support.browser import login, shot
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_create_an_epic_then_unpark_its_rig_from_the_convoy_page(browser, server):
    rigs.upsert_route("gt-", "gastown/mayor/rig")
    full_staff("maker")
    context, page = login(browser, server, "maker")
    page.click("nav >> text=Create")
    page.check("#id_kind_1")
    page.select_option("#id_prefix", "gt-")
    page.fill("#id_title", "Made in the browser")
    page.fill("#id_children", "Design\nBuild | after 1\n")
    shot(page, "create-epic")
    page.click("#create-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/beads/gt-[0-9a-z]{5}/$"))
    epic = Bead.objects.get(title="Made in the browser")
    assert f"Created {epic.pk} with 2 children." in page.inner_text(".messages")
    design = Bead.objects.get(title="Design")
    build = Bead.objects.get(title="Build")
    assert Dependency.objects.filter(issue=build, depends_on_id=design.pk, type="blocks").exists()

    rigs.set_rig_state("gastown", "parked", actor="test")
    convoy_id = staging.stage([epic.pk], actor="test").convoy_id
    page.goto(f"{server}/convoys/{convoy_id}/")
    assert 'target parked rig "gastown"' in page.inner_text("#staging-warnings")
    shot(page, "staging-panel")
    page.click("text=Un-park gastown")
    page.wait_for_selector("text=No warnings at the last check")
    assert "now ready to launch" in page.inner_text(".messages")
    assert Convoy.objects.get(pk=convoy_id).status == "staged_ready"
    context.close()
