"""Front end: the dashboard, a convoy page and a bead page carry no inline style= or
on*= attribute (progress bars are SVG rects with geometry attributes), and each page loads only
the scripts it uses: the DAG's pan and zoom (dag.js) and the time slider (history.js) on the
convoy page only; live.js, on every page, holds none of them."""

import json
import re

from django.urls import reverse

from convoys.core import formatting
from convoys.models import Bead, Convoy, status_symbol

from .support.pages import inline_code
from .support.paths import ROOT
from .support.users import logged_in

LIVE = "/static/convoys/live.js"
CONVOY_ONLY = ("/static/convoys/dag.js", "/static/convoys/history.js")


def scripts(parser):
    return [src.split("?")[0] for src in parser.script_src]


def three_pages():
    convoy = Convoy.objects.order_by("created_at").first()
    bead = Bead.objects.exclude(issue_type="epic").order_by("id").first()
    return {
        "dashboard": "/",
        "convoy": reverse("convoy", args=[convoy.pk]),
        "bead": reverse("bead", args=[bead.pk]),
    }


def test_three_pages_have_no_inline_style_or_handlers_and_their_own_scripts(demo):
    client = logged_in(demo)
    for name, url in three_pages().items():
        response = client.get(url)
        assert response.status_code == 200, url
        html = response.text
        parser = inline_code(html)
        assert parser.found == [], (name, parser.found)
        assert 'class="bar"' in html or name == "bead", name  # the bars are drawn, as SVG
        loaded = scripts(parser)
        assert LIVE in loaded, name
        for script in CONVOY_ONLY:
            assert (script in loaded) == (name == "convoy"), (name, script)


def test_live_js_carries_no_page_specific_drawing():
    """The DAG's pan/zoom and the slider live in their own files, loaded by the convoy page."""
    live = (ROOT / "static" / "convoys" / "live.js").read_text()
    for word in ("wheel", "pinch", "viewBox", "slider", "pointerdown"):
        assert word not in live, word


def test_the_scripts_take_their_words_and_icons_from_the_page(demo):
    """The relative-time words and the state icons the scripts use are the server's own, in
    one JSON block on every page; no script carries a copy of them."""
    html = logged_in(demo).get("/").text
    block = re.search(r'<script id="browser-rules" type="application/json">(.*?)</script>', html)
    rules = json.loads(block.group(1))
    assert rules["relative"] == formatting.RELATIVE_WORDS
    assert rules["icons"] == {
        "done": status_symbol("closed"),
        "skipped": status_symbol("skipped"),
        "submitted": status_symbol("submitted"),
        "active": status_symbol("in_progress"),
        "ready": status_symbol("ready"),
        "blocked": status_symbol("open"),
        "unknown": status_symbol("unknown"),
    }
    for name in ("live.js", "dag.js", "history.js", "actions.js"):
        script = (ROOT / "static" / "convoys" / name).read_text()
        for words in [*RELATIVE_COPIES, *rules["icons"].values()]:
            assert f'"{words}"' not in script, (name, words)


RELATIVE_COPIES = ("in under a minute", "just now", "<1m")
