"""Every page a user reaches, on a phone: a 390 x 844 viewport (the viewport meta honoured,
as a phone does) lays each page out without sideways scrolling (only a horizontally
scrollable container, such as a wide table's, may hold what is wider than the screen), and no
visible text is drawn smaller than 11 CSS px, the graph's labels included (it opens on a
window of the graph at its natural size, to pan, rather than the whole graph shrunk).
Screenshots: artifacts/screenshots/phone-*.png."""

import pytest
from django.db import transaction

from convoys.models import Convoy
from convoys.services import notify
from convoys.services.launch import launch_staged

from .support.browser import SHOTS, sign_in
from .support.factories import bead, big_convoy, blocks, child, stage
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WIDTH, HEIGHT, SMALLEST = 390, 844, 11

# Elements whose box passes the viewport's right edge, outside any container that scrolls
# or clips sideways (such a container is itself checked, and its content may be wider).
OVERFLOW = """() => {
  const width = window.innerWidth;
  const name = (el) => {
    let s = el.tagName.toLowerCase();
    if (el.id) s += "#" + el.id;
    else if (el.classList && el.classList.length) s += "." + [...el.classList].join(".");
    return s;
  };
  const path = (el) => {
    const parts = [];
    for (let e = el; e && e.nodeType === 1 && parts.length < 4; e = e.parentElement) parts.unshift(name(e));
    return parts.join(" > ");
  };
  const contained = (el) => {
    for (let e = el.parentElement; e && e !== document.body; e = e.parentElement) {
      if (["auto", "scroll", "hidden", "clip"].includes(getComputedStyle(e).overflowX)) return true;
      if (e.tagName.toLowerCase() === "svg") return true;  // drawn inside its svg's box
    }
    return false;
  };
  const out = [];
  for (const el of document.body.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (!r.width || !r.height || r.right <= width + 0.5 || contained(el)) continue;
    if (getComputedStyle(el).position === "fixed" && r.left >= width) continue;
    out.push(`${path(el)} (right ${Math.round(r.right)})`);
  }
  return { scroll: document.documentElement.scrollWidth, inner: width, out: out.slice(0, 15) };
}"""

# Visible elements with a non-empty text node of their own drawn under `min` CSS px: HTML by
# its computed font size, SVG text by its font size times the scale of its screen CTM.
TINY = """(min) => {
  const out = [];
  const seen = (el) => el.checkVisibility({ checkOpacity: true, checkVisibilityCSS: true });
  for (const el of document.body.querySelectorAll("*")) {
    const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!own || ["SCRIPT", "STYLE", "TITLE", "title"].includes(el.tagName)) continue;
    const r = el.getBoundingClientRect();
    if (!r.width || !r.height || !seen(el)) continue;
    let size = parseFloat(getComputedStyle(el).fontSize);
    if (el instanceof SVGElement) {
      const m = el.getScreenCTM();
      if (m) size *= Math.hypot(m.a, m.b);
    }
    if (size < min - 0.01) out.push(`${el.tagName.toLowerCase()}${el.className && el.className.baseVal !== undefined ? "." + el.className.baseVal : el.className ? "." + el.className : ""} "${el.textContent.trim().slice(0, 30)}" ${size.toFixed(1)}px`);
  }
  return out.slice(0, 15);
}"""

# Each id on the dashboard sits on one line (an id broken mid-word reads as two ids).
BROKEN_IDS = """() => [...document.querySelectorAll("#convoy-table code")]
  .filter((c) => c.getClientRects().length > 1
    || c.getBoundingClientRect().height > 1.6 * (parseFloat(getComputedStyle(c).lineHeight) || 20))
  .map((c) => c.textContent)"""


# The graph's window shows a working or ready bead (where the work is), whole.
IN_WINDOW = """() => {
  const frame = document.getElementById("dag").getBoundingClientRect();
  return [...document.querySelectorAll("#dag .nodes g.node.st-active, #dag .nodes g.node.st-ready")]
    .some((g) => { const r = g.getBoundingClientRect();
      return r.left >= frame.left && r.right <= frame.right && r.top >= frame.top && r.bottom <= frame.bottom; });
}"""


def check(page, name, problems):
    """Note what does not fit on this page in `problems` (every page is seen before the test
    fails, so one run names everything that is wrong)."""
    page.wait_for_load_state("load")
    page.wait_for_timeout(200)  # the scripts have laid the page out (the graph fitted)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"phone-{name}.png"), full_page=True)
    width = page.evaluate(OVERFLOW)
    assert width["inner"] == WIDTH  # without the viewport meta a phone lays out 980 px
    if width["scroll"] > WIDTH or width["out"]:
        problems.append((name, "wider than the screen", width))
    tiny = page.evaluate(TINY, SMALLEST)
    if tiny:
        problems.append((name, f"text under {SMALLEST} px", tiny))


@pytest.fixture
def convoys_to_see(routes):
    bead("gt-epic", "Phone checks: a title long enough to wrap on a narrow screen", type="epic")
    for bead_id in ("gt-pa", "gt-pb", "gt-pc", "gt-pd"):
        bead(bead_id, f"Step {bead_id[-1]} of the phone checks with a longer title")
        child("gt-epic", bead_id)
    for a, b in (("gt-pa", "gt-pb"), ("gt-pb", "gt-pc"), ("gt-pa", "gt-pd")):
        blocks(a, b)
    small = stage(["gt-epic"])
    launch_staged(small, force=True, actor="test")
    big, _ = big_convoy(size=300, done=60)
    return small, big


def test_every_page_fits_a_phone(browser, server, convoys_to_see):
    small, big = convoys_to_see
    user = full_staff("phone")
    convoy = Convoy.objects.get(pk=small)
    notify.subscribe(user, convoy)  # the subscriptions page lists it, the inbox has a note
    with transaction.atomic():  # as its callers do: the note's live event with it
        notify.notify_action_needed(convoy, "gt-pb parked: its rig is docked", "Body " * 40)
    context = browser.new_context(
        viewport={"width": WIDTH, "height": HEIGHT},
        is_mobile=True,
        has_touch=True,
        device_scale_factor=2,
    )
    page = context.new_page()
    page.goto(server + "/login/")
    problems: list = []
    check(page, "login", problems)
    sign_in(page, server, "phone")
    check(page, "dashboard", problems)
    if broken := page.evaluate(BROKEN_IDS):
        problems.append(("dashboard", "ids broken across lines", broken))
    # each convoy is a card: its id, title, bar and status all within the screen
    row = page.locator(f'#convoy-table tr[data-convoy="{small}"]')
    for part in ("code", "svg.bar", ".status"):
        box = row.locator(part).first.bounding_box()
        if not box or box["x"] < 0 or box["x"] + box["width"] > WIDTH:
            problems.append(("dashboard", f"a convoy's {part} is cut", box))
    for name, path in (
        ("convoy-small", f"/convoys/{small}/"),
        ("convoy-big", f"/convoys/{big}/"),
        ("convoy-big-all", f"/convoys/{big}/?all=1"),
    ):
        page.goto(server + path)
        page.wait_for_selector("#dag svg g.node")
        check(page, name, problems)
        if not page.evaluate(IN_WINDOW):
            problems.append((name, "the graph opens on no bead", ""))
        for card in ("#dag-card", "#wave-card", "#bead-table"):
            page.locator(card).screenshot(path=str(SHOTS / f"phone-{name}-{card[1:]}.png"))
        # the tables scroll inside their cards, their first column kept in sight
        for table in ("#wave-table", "#bead-table table"):
            scroller = page.locator(table).locator("xpath=ancestor::div[@class='scroll'][1]")
            assert scroller.evaluate("(e) => getComputedStyle(e).overflowX") == "auto"
            scroller.evaluate("(e) => { e.scrollLeft = e.scrollWidth; }")
            first = page.locator(f"{table} tbody tr > :first-child").first
            kept = first.evaluate(
                "(e) => Math.abs(e.getBoundingClientRect().left"
                " - e.closest('.scroll').getBoundingClientRect().left) < 1"
            )
            scrolled = scroller.evaluate("(e) => e.scrollLeft")
            if scrolled and not kept:
                problems.append((name, f"{table}'s first column scrolls away", scrolled))
        page.locator("#bead-table").screenshot(path=str(SHOTS / f"phone-{name}-scrolled.png"))
    page.goto(server + f"/convoys/{small}/")
    page.wait_for_selector("#dag svg g.node")
    # the time slider moved back: the page as it was still fits
    page.locator("#history-slider:not([disabled])").fill("1")
    page.wait_for_selector("body.history-past")
    check(page, "convoy-past", problems)
    for name, path in (
        ("bead", "/beads/gt-pb/"),
        ("stage", "/stage/?epic=gt-epic"),
        ("create", "/create/"),
        ("stranded", "/stranded/"),
        ("inbox", "/inbox/"),
        ("subscriptions", "/subscriptions/"),
    ):
        page.goto(server + path)
        check(page, name, problems)
    context.close()
    assert not problems, "\n".join(map(str, problems))
