"""In Chromium, by keyboard only: Ctrl-K opens the command palette, typing finds a bead by id
prefix, the arrow keys move, Enter lands on the bead's page; Escape closes it and the focus
is back where it was; a pick comes first the next time. And the dashboard's bulk controls:
tick convoys (shift-click a range), pause them with one confirmation and one summary naming
the one refused."""

import pytest

from convoys.models import Convoy
from convoys.services import beads, convoys

from .support.browser import login, shot, wait_js
from .support.factories import bead
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

OPTIONS = "document.querySelectorAll('#palette-list [role=option]')"
ACTIVE = (
    "document.getElementById(document.getElementById('palette-input')"
    ".getAttribute('aria-activedescendant'))"
)


def options(page):
    return page.evaluate(
        f"() => [...{OPTIONS}].map(o => o.querySelector('.palette-label').textContent)"
    )


def active(page):
    return page.evaluate(f"() => {ACTIVE}.querySelector('.palette-label').textContent")


def test_the_palette_by_keyboard_only(browser, server, routes):
    full_staff("alice")
    beads.create_bead("Lay the northern track", bead_id="gt-abc", actor="test")
    bead("gt-abd", "Paint the station")
    ctx, page = login(browser, server, "alice")
    page.goto(server + "/stranded/")
    page.focus("nav a[href='/stage/']")

    page.keyboard.press("Control+k")
    wait_js(page, "document.getElementById('palette').open")
    assert page.evaluate("() => document.activeElement.id") == "palette-input"
    roles = page.evaluate(
        "() => ['palette', 'palette-input', 'palette-list'].map(id =>"
        " document.getElementById(id).getAttribute('role') || document.getElementById(id).tagName)"
    )
    assert roles == ["DIALOG", "combobox", "listbox"]

    page.keyboard.type("gt-ab")
    wait_js(page, f"[...{OPTIONS}].some(o => o.textContent.includes('gt-abd'))")
    first, second = options(page)[:2]
    assert {first, second} == {"gt-abc", "gt-abd"}
    assert active(page) == first
    page.keyboard.press("ArrowDown")
    assert active(page) == second
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowUp")
    assert active(page) == second
    shot(page, "palette")
    page.keyboard.press("Enter")
    page.wait_for_url(server + f"/beads/{second}/")

    # Escape closes it and gives the focus back.
    page.focus("nav a[href='/inbox/']")
    page.keyboard.press("Control+k")
    wait_js(page, "document.getElementById('palette').open")
    # The pick comes first, before anything is typed.
    wait_js(page, f"{OPTIONS}.length > 0")
    assert options(page)[0] == second
    page.keyboard.press("Escape")
    wait_js(page, "!document.getElementById('palette').open")
    assert page.evaluate("() => document.activeElement.getAttribute('href')") == "/inbox/"

    # Typing "gt-ab" again: the remembered pick ranks first.
    page.keyboard.press("Control+k")
    page.keyboard.type("gt-ab")
    wait_js(page, f"[...{OPTIONS}].some(o => o.textContent.includes('Search for'))")
    assert options(page)[0] == second
    page.keyboard.press("Escape")
    ctx.close()


def test_the_palette_pauses_a_convoy(browser, server, routes):
    full_staff("alice")
    bead("gt-p1", "Pausable work")
    convoy = convoys.create("Pausable convoy", ["gt-p1"])
    ctx, page = login(browser, server, "alice")
    page.keyboard.press("Control+k")
    page.keyboard.type(f"pause {convoy.pk}")
    wait_js(page, f"[...{OPTIONS}].some(o => o.textContent.includes('pause {convoy.pk}'))")
    assert active(page) == f"pause {convoy.pk}"
    page.keyboard.press("Enter")
    page.wait_for_url(server + f"/convoys/{convoy.pk}/")
    assert "Paused" in page.inner_text(".messages")
    assert Convoy.objects.get(pk=convoy.pk).paused_by == "web:alice"

    # Paused, it is offered to be resumed (and no longer to be paused).
    page.keyboard.press("Control+k")
    page.keyboard.type(convoy.pk)
    wait_js(page, f"[...{OPTIONS}].some(o => o.textContent.includes('resume {convoy.pk}'))")
    assert f"pause {convoy.pk}" not in options(page)
    page.keyboard.press("ArrowDown")
    assert active(page) == f"resume {convoy.pk}"
    page.keyboard.press("Enter")
    page.wait_for_selector(".messages")
    assert "Resumed" in page.inner_text(".messages")
    assert Convoy.objects.get(pk=convoy.pk).paused_at is None

    # Open, it may be acknowledged; closed, it offers neither that nor a pause.
    page.keyboard.press("Control+k")
    page.keyboard.type(convoy.pk)
    wait_js(page, f"[...{OPTIONS}].some(o => o.textContent.includes('acknowledge {convoy.pk}'))")
    page.keyboard.press("Escape")
    convoys.close(convoy.pk, force=True, actor="test")
    page.keyboard.press("Control+k")
    page.keyboard.type(f"ack {convoy.pk}")
    wait_js(page, f"[...{OPTIONS}].length > 0")
    shown = options(page)
    assert not any(f"acknowledge {convoy.pk}" in o or f"pause {convoy.pk}" in o for o in shown)
    ctx.close()


def test_bulk_pause_and_resume_with_one_refusal(browser, server, routes):
    full_staff("alice")
    made = []
    for i in range(4):
        bead(f"gt-b{i}", f"Work {i}")
        made.append(convoys.create(f"Convoy {i}", [f"gt-b{i}"]).pk)
    convoys.close(made[1], force=True, actor="test")  # closed: a pause is refused
    ctx, page = login(browser, server, "alice")
    page.goto(server + "/?status=all&sort=id")
    boxes = [f"input[name=ids][value='{pk}']" for pk in sorted(made)]
    page.click(boxes[0])
    page.click(boxes[3], modifiers=["Shift"])  # the range: all four
    checked = page.evaluate(
        "() => [...document.querySelectorAll('#convoy-table input[name=ids]')]"
        ".filter(b => b.checked).map(b => b.value)"
    )
    assert sorted(checked) == sorted(made)
    assert "4 of" in page.inner_text("#selected-count")
    page.fill("#bulk-reason", "freeze for the release")
    page.click("button[name=action][value=pause]")
    page.wait_for_selector("#confirm-actions")
    assert "Pause 4 convoys?" in page.inner_text("h1")
    page.click("#confirm-actions")
    page.wait_for_selector(".messages")
    summary = page.inner_text(".messages")
    assert "Paused 3 convoys" in summary
    assert f"1 refused: convoy {made[1]} is closed: nothing to pause" in summary
    paused = {c.pk: c.pause_reason for c in Convoy.objects.filter(paused_at__isnull=False)}
    assert paused == dict.fromkeys(set(made) - {made[1]}, "freeze for the release")
    shot(page, "dashboard-bulk-paused")

    # Select all shown, resume: three resumed, the closed one was not paused.
    page.goto(server + "/?status=all&sort=id")
    page.click("#select-shown")
    page.click("button[name=action][value=resume]")
    page.click("#confirm-actions")
    page.wait_for_selector(".messages")
    summary = page.inner_text(".messages")
    assert "Resumed 3 convoys" in summary and "1 not paused" in summary
    assert not Convoy.objects.filter(paused_at__isnull=False).exists()
    ctx.close()
