"""Front end: the dashboard, a convoy page and a bead page carry no inline style= or
on*= attribute (progress bars are SVG rects with geometry attributes), and each page loads only
the scripts it uses: the DAG's pan and zoom (dag.js) and the time slider (history.js) on the
convoy page only; live.js, on every page, holds none of them."""

from django.urls import reverse

from convoys.models import Bead, Convoy

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


def test_three_pages_have_no_inline_style_or_handlers_and_their_own_scripts(demo):  # noqa: F811
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
