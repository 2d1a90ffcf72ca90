"""Pages as a user receives them: fragments compared with a reload, the demo town, the URLs of
every page, and the inline code a strict CSP would block."""

import html
import re
import time
from html.parser import HTMLParser
from io import StringIO

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.core.management import call_command
from django.urls import reverse

from convoys.models import Bead, Convoy
from convoys.services import convoys, notify

from .users import PASSWORD

# Characters whose default presentation is an emoji (Unicode Emoji_Presentation, BMP part):
# without an emoji font they are blank boxes. Everything at U+1F000 and above is refused too.
EMOJI_BMP = set(
    "⌚⌛⏩⏪⏫⏬⏰⏳◽◾☔☕♈♉♊♋♌♍♎♏♐♑♒♓♿⚓⚡⚪⚫⚽⚾⛄⛅⛎⛔⛪⛲⛳⛵⛺⛽✅✊✋✨❌❎❓❔❕❗➕➖➗➰➿⬛⬜⭐⭕"
)


def needs_emoji_font(text):
    return sorted({c for c in text if c in EMOJI_BMP or ord(c) >= 0x1F000})


def page_urls():
    """Every page a signed-in staff user sees, on whatever data is loaded (the demo)."""
    convoy = Convoy.objects.order_by("created_at").first()
    bead = Bead.objects.exclude(issue_type="epic").order_by("id").first()
    epic = Bead.objects.filter(issue_type="epic").order_by("id").first()
    return [
        "/",
        reverse("convoy", args=[convoy.pk]),
        reverse("bead", args=[bead.pk]),
        "/stranded/",
        "/inbox/",
        "/stage/",
        f"/stage/?epic={epic.pk}",
        "/subscriptions/",
        "/admin/",
        "/admin/convoys/convoy/",
        reverse("admin:convoys_convoy_change", args=[quote(convoy.pk)]),
        reverse("admin:convoys_bead_change", args=[quote(bead.pk)]),
        reverse("admin:convoys_bead_add"),
        "/api/docs",
    ]


@pytest.fixture
def demo(db):
    call_command("demo", stdout=StringIO())
    root = User.objects.create_superuser("root", password=PASSWORD)
    # Something in the inbox: a landing report and a close notice (their mail subjects carry
    # the original's truck emoji; the page must not need it).
    convoy = Convoy.objects.order_by("created_at").first()
    notify.subscribe(root, convoy)
    convoys.notify_landing(convoy)
    notify.notify_closed(convoy, "root")
    return root


class InlineCode(HTMLParser):
    """Collects what a CSP without 'unsafe-inline' blocks: <script> without src (data blocks
    such as type="application/json" are not scripts), <style>, style= and on*= attributes."""

    def __init__(self):
        super().__init__()
        self.found = []
        self.script_src = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            if attrs.get("src"):
                self.script_src.append(attrs["src"])
            elif attrs.get("type", "text/javascript") in ("text/javascript", "module"):
                self.found.append("<script> without src")
        if tag == "style":
            self.found.append("<style>")
        for name in attrs:
            if name == "style" or name.startswith("on"):
                self.found.append(f"<{tag} {name}=…>")


def inline_code(html):
    parser = InlineCode()
    parser.feed(html)
    return parser


# The page's main content, and the same of a fresh render of its URL, normalised alike: times
# are relative to the moment of rendering, CSRF tokens are masked afresh, dag.js sizes the
# drawing to the window, and history.js's slider and visit marks and actions.js's preview are
# the viewer's own.
COMPARE = """async () => {
  const normal = (main) => {
    const root = main.cloneNode(true);
    root.querySelectorAll("time").forEach((t) => { t.textContent = ""; t.removeAttribute("datetime"); t.removeAttribute("title"); });
    root.querySelectorAll("input[name=csrfmiddlewaretoken]").forEach((i) => i.removeAttribute("value"));
    root.querySelectorAll("svg.dag").forEach((s) => ["width", "height", "viewBox"].forEach((a) => s.removeAttribute(a)));
    root.querySelectorAll("[data-pan-zoom]").forEach((e) => e.removeAttribute("data-pan-zoom"));
    root.querySelectorAll(".messages").forEach((e) => e.remove());
    // Chromium may leave an empty style attribute on form fields; it changes nothing drawn.
    root.querySelectorAll("[style='']").forEach((e) => e.removeAttribute("style"));
    // Per viewer, not the page's state: the time slider and "since your last visit" marks.
    root.querySelectorAll("#history-card").forEach((e) => e.remove());
    root.querySelectorAll(".since-visit").forEach((e) => e.classList.remove("since-visit"));
    // The viewer's own bead action: its preview or summary, and the causes actions.js lists.
    root.querySelectorAll("#action-result, #pick-cause, #action-picked").forEach((e) => e.replaceChildren());
    return root.innerHTML;
  };
  const response = await fetch(location.href, { credentials: "same-origin", cache: "no-store" });
  const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
  return [normal(document.getElementById("main")), normal(fresh.getElementById("main"))];
}"""


def first_difference(live, fresh):
    at = next(
        (i for i, (a, b) in enumerate(zip(live, fresh, strict=False)) if a != b),
        min(len(live), len(fresh)),
    )
    return f"live: …{live[max(0, at - 200) : at + 200]}…\nfresh: …{fresh[max(0, at - 200) : at + 200]}…"


def assert_live_equals_reload(pages, step, deadline=45):
    """Each page's live DOM equals a fresh render of its URL, once the page has caught up."""
    for name, page in pages.items():
        ends = time.monotonic() + deadline
        while True:
            live, fresh = page.evaluate(COMPARE)
            if live == fresh:
                break
            if time.monotonic() > ends:
                pytest.fail(
                    f"after {step}, {name} differs from a reload\n" + first_difference(live, fresh)
                )
            page.wait_for_timeout(250)


def text_of(fragment):
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


def dashboard_badges(client):
    """{convoy id: badge words or None} from the dashboard's rows."""
    page = client.get("/?status=all").content.decode()
    badges = {}
    for convoy_id, row in re.findall(r'<tr data-convoy="([^"]+)"(.*?)</tr>', page, re.S):
        badge = re.search(r'class="[^"]*stranded-badge[^"]*"[^>]*>(.*?)</span>', row, re.S)
        badges[convoy_id] = text_of(badge.group(1)) if badge else None
    return badges


# --- pages made of fragments: live answers are the page's own parts ---------------------------
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="[^"]*"')


TIME = re.compile(r"<time [^>]*>[^<]*</time>")


def live(client, url, since=None, **headers):
    extra = {"HTTP_X_LIVE": "1"}
    if since is not None:
        extra["HTTP_X_LIVE_SINCE"] = str(since)
    extra.update({f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()})
    response = client.get(url, **extra)
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert "X-Live" in response["Vary"]
    return response.json()


def as_of(page):
    return int(re.search(r'data-as-of="(\d+)"', page).group(1))


def same_markup(html):
    """Markup without what differs between two renders of the same state: CSRF tokens (masked
    afresh each time) and times (relative to the moment of rendering)."""
    return TIME.sub("<time>", CSRF.sub("", html))


def assert_parts_of(page, fragments):
    """Every fragment is, character for character, the element with its id in the page."""
    for fragment_id, markup in fragments.items():
        if markup == "":  # the element left the page
            assert f'id="{fragment_id}"' not in page, fragment_id
            continue
        assert f'id="{fragment_id}"' in markup, fragment_id
        assert same_markup(markup) in same_markup(page), fragment_id
