"""The bead actions from the pages: the action bar on the bead page and the convoy page,
a preview that changes nothing, a confirm that applies, with and without the page's script."""

import re

import pytest

from convoys.models import Bead, Event
from convoys.services import convoys

from .support.factories import bead, blocks
from .support.users import signed_in

pytestmark = pytest.mark.django_db
URL = "/beads/actions/"


@pytest.fixture
def convoy(routes):
    for bead_id in ("gt-p1", "gt-p2", "gt-p3"):
        bead(bead_id)
    blocks("gt-p1", "gt-p3")
    blocks("gt-p2", "gt-p3")
    return convoys.create("Pages", ["gt-p1", "gt-p2", "gt-p3"])


@pytest.fixture
def editor(convoy):
    return signed_in("editor", "view_bead", "view_convoy", "change_bead")


def test_the_pages_offer_the_action_bar_only_with_the_permission(convoy, editor):
    page = editor.get(f"/convoys/{convoy.pk}/").content.decode()
    assert 'id="bead-action-form"' in page and 'data-pick aria-label="Select gt-p1"' in page
    assert 'data-pick-wave="1"' in page and "convoys/actions.js" in page
    assert 'id="bead-action-form"' in editor.get("/beads/gt-p1/").content.decode()
    viewer = signed_in("viewer", "view_bead", "view_convoy")
    assert "bead-action-form" not in viewer.get(f"/convoys/{convoy.pk}/").content.decode()
    assert viewer.post(URL, {"action": "skip", "ids": ["gt-p1"]}).status_code == 403
    assert Bead.objects.get(pk="gt-p1").status == "open"


def test_preview_then_confirm_without_the_script(convoy, editor):
    seq = Event.objects.count()
    body = {
        "action": "skip",
        "ids": ["gt-p1", "gt-p2"],
        "reason": "moot",
        "next": f"/convoys/{convoy.pk}/",
    }
    preview = editor.post(URL, body)
    html = preview.content.decode()
    assert preview.status_code == 200 and Event.objects.count() == seq
    assert "Preview: 2 would be skipped" in html and "makes gt-p3 ready" in html
    assert 'name="confirm" value="1"' in html and "Confirm: skip 2 beads" in html
    done = editor.post(URL, body | {"confirm": "1"})
    assert done.status_code == 302 and done["Location"] == f"/convoys/{convoy.pk}/"
    assert set(Bead.objects.filter(status="skipped").values_list("id", flat=True)) == {
        "gt-p1",
        "gt-p2",
    }
    page = editor.get(f"/convoys/{convoy.pk}/").content.decode()
    assert "2 skipped" in page  # the message, and the counts
    assert "⤼ 2 skipped" in page


def test_the_script_gets_the_result_as_a_fragment(convoy, editor):
    answer = editor.post(URL, {"action": "retry", "ids": ["gt-p1"]}, HTTP_X_LIVE="1").json()
    assert "gt-p1 has no failed dispatches to retry" in answer["fragments"]["action-result"]
    assert "action-confirm" not in answer["fragments"]["action-result"]  # nothing to confirm
    none = editor.post(URL, {"action": "skip"}, HTTP_X_LIVE="1")
    assert (
        none.status_code == 400
        and "ids: give at least one bead id" in none.json()["fragments"]["action-result"]
    )
    odd = editor.post(URL, {"action": "explode", "ids": ["gt-p1"]}, HTTP_X_LIVE="1")
    assert (
        odd.status_code == 400
        and "action: one of retry" in odd.json()["fragments"]["action-result"]
    )


def test_next_never_leaves_the_site(convoy, editor):
    html = editor.post(
        URL, {"action": "skip", "ids": ["gt-p1"], "next": "javascript:alert(1)"}
    ).content.decode()
    assert "javascript:" not in html
    done = editor.post(
        URL, {"action": "skip", "ids": ["gt-p1"], "confirm": "1", "next": "//evil.example/"}
    )
    assert done.status_code == 302 and "evil" not in done["Location"]


def test_the_bead_history_names_who_and_why(convoy, editor):
    editor.post(
        URL, {"action": "skip", "ids": ["gt-p1"], "reason": "done upstream", "confirm": "1"}
    )
    page = editor.get("/beads/gt-p1/").content.decode()
    assert "bead skipped (not needed)" in page
    assert '<span class="actor">by editor</span> <span class="did">— closes it as skipped' in page
    assert '<q class="why">done upstream</q>' in page


def test_every_part_of_the_convoy_page_draws_a_skipped_bead(convoy, editor):
    Bead.objects.filter(pk="gt-p1").update(dispatch_failures=3)
    editor.post(URL, {"action": "skip", "ids": ["gt-p1"], "confirm": "1"})
    page = editor.get(f"/convoys/{convoy.pk}/")
    html = page.content.decode()
    assert page.status_code == 200 and 'class="c-skipped">1<' in html
    assert 'id="bead-row-gt-p1" class="st-skipped"' in html and "skipped (not needed)" in html
    steps = (
        Event.objects.filter(convoy_id=convoy.pk).count()
        + Event.objects.filter(bead_id__startswith="gt-p").count()
    )
    for step in range(1, steps + 1):
        answer = editor.get(f"/convoys/{convoy.pk}/history/?step={step}")
        assert answer.status_code in (200, 400), step
    assert editor.get(f"/convoys/{convoy.pk}/?wave=1").status_code == 200
    assert editor.get("/").status_code == 200
    assert editor.get("/beads/gt-p1/").status_code == 200


def test_a_skipped_bead_offers_reopen_on_its_page_with_a_preview_first(convoy, editor):
    editor.post(URL, {"action": "skip", "ids": ["gt-p1"], "confirm": "1"})
    page = editor.get("/beads/gt-p1/").content.decode()
    assert 'id="reopen-bead"' in page and 'id="close-bead"' not in page
    button = page[
        page.rindex("<form", 0, page.index('id="reopen-bead"')) : page.index('id="reopen-bead"')
    ]
    fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', button))
    assert f'action="{URL}"' in button
    assert (fields["action"], fields["ids"], fields["next"]) == ("reopen", "gt-p1", "/beads/gt-p1/")
    preview = editor.post(URL, fields).content.decode()  # what the button sends
    assert "opens it again" in preview and Bead.objects.get(pk="gt-p1").status == "skipped"
    assert editor.post(URL, fields | {"confirm": "1"}).status_code == 302
    row = Bead.objects.get(pk="gt-p1")
    assert row.status != "skipped" and row.close_reason == ""  # open, or dispatched at once
    assert Event.objects.filter(kind="bead.reopened", bead_id="gt-p1").exists()
