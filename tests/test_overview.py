"""A convoy above sizes.OVERVIEW_AT tracked beads is an overview whose size does not grow
with the convoy: the graph draws the frontier wave and the next beads of the critical path,
other waves on demand (?open=N), the focused bead's wave; the wave table is a window of bands
(?wpage=N), the bead table pages (?bpage=N); a live update still equals a reload."""

import re

import pytest
from django.utils import timezone

from convoys.models import Convoy
from convoys.read import convoy_page, overview, projection, sizes, snapshots
from convoys.services import beads

from .support.factories import big_convoy, drawn_ids
from .support.pages import as_of, assert_parts_of, live
from .support.users import logged_in

pytestmark = pytest.mark.django_db


def test_a_big_convoy_page_is_an_overview_of_bounded_size(routes, admin_user):
    convoy_id, ids = big_convoy()
    client = logged_in(admin_user)
    html = client.get(f"/convoys/{convoy_id}/").content.decode()
    page = convoy_page.convoy_page(Convoy.objects.get(pk=convoy_id), {}, admin_user, timezone.now())
    assert page.overview and len(page.waves) > sizes.BAND_PAGE
    drawn = drawn_ids(html)
    frontier = page.waves[page.frontier - 1]
    assert {b["id"] for b in frontier["beads"]} == set()  # no chips in an overview
    assert 0 < len(drawn) <= sizes.WAVE_DRAWN + sizes.CRITICAL_DRAWN
    assert {c for c, _ in page.critical[: sizes.CRITICAL_DRAWN]} <= drawn
    assert "Overview of" in html and 'data-open-wave="' in html
    # the wave table: a window of bands around the frontier, with a pager
    rows = re.findall(r'<tr data-wave="(\d+)"', html)
    assert len(rows) == sizes.BAND_PAGE and str(page.frontier) in rows
    assert 'id="wave-pager"' in html
    # the bead table: one page of unfinished beads, the rest a click away
    assert html.count('id="bead-row-') == sizes.ROWS_PAGE
    assert "page 1 of" in html and "140 done beads not listed" in html
    second = client.get(f"/convoys/{convoy_id}/?bpage=2").content.decode()
    assert "page 2 of" in second and 'id="bead-row-' + ids[140] + '"' not in second
    # the critical path is linked up to a cap and counted
    assert f"({page.critical_length} in all)" in html or page.critical_length <= 40
    # hostile page numbers and waves are clamped or ignored, never an error
    for query in ("?bpage=x", "?bpage=-1", "?bpage=99999999999", "?wpage=0", "?open=x,0,99999"):
        response = client.get(f"/convoys/{convoy_id}/{query}")
        assert response.status_code == 200, query
    assert drawn_ids(client.get(f"/convoys/{convoy_id}/?open=x,0,99999").content.decode()) == drawn
    # ?all=1 is the page drawn in full
    assert len(drawn_ids(client.get(f"/convoys/{convoy_id}/?all=1").content.decode())) > 500


def test_a_wave_opens_on_demand_and_as_a_fragment(routes, admin_user):
    convoy_id, ids = big_convoy()
    client = logged_in(admin_user)
    page = convoy_page.convoy_page(Convoy.objects.get(pk=convoy_id), {}, admin_user, timezone.now())
    last = page.waves[-1]
    assert last["number"] != page.frontier
    wave_ids = set(page.graph.nodes) & {i for i in ids if page.wave_of.get(i) == last["number"]}
    before = drawn_ids(client.get(f"/convoys/{convoy_id}/").content.decode())
    assert not wave_ids <= before
    url = f"/convoys/{convoy_id}/?open={last['number']}"
    html = client.get(url).content.decode()
    assert wave_ids <= drawn_ids(html) and before <= drawn_ids(html)
    fragments = live(client, url + "&fragments=dag-card,wave-card")["fragments"]
    assert set(fragments) == {"dag-card", "wave-card"}
    assert wave_ids <= drawn_ids(fragments["dag-card"])
    assert_parts_of(html, fragments)


def test_focus_on_a_bead_of_a_wave_not_drawn_draws_it(routes, admin_user):
    convoy_id, ids = big_convoy()
    client = logged_in(admin_user)
    target = ids[-1]
    assert target not in drawn_ids(client.get(f"/convoys/{convoy_id}/").content.decode())
    html = client.get(f"/convoys/{convoy_id}/?focus={target}").content.decode()
    assert target in drawn_ids(html) and f'data-focus="{target}"' in html
    assert "focus-missing" not in html


def test_an_overview_live_update_equals_a_reload(routes, admin_user):
    convoy_id, ids = big_convoy()
    client = logged_in(admin_user)
    url = f"/convoys/{convoy_id}/?open=3"
    html = client.get(url).content.decode()
    layout_key = re.search(r'data-layout="([0-9a-f]+)"', html).group(1)
    drawn = sorted(drawn_ids(html) & set(ids))
    beads.update_bead(drawn[-1], status="in_progress", assignee="ann", actor="test")
    data = live(client, url, since=as_of(html), x_live_layout=layout_key)
    assert f'data-id="{drawn[-1]}"' in data["fragments"]["dag-card"]  # a window: drawn whole
    assert_parts_of(client.get(url).content.decode(), data["fragments"])
    # a close moves the bead table's pages: the table is sent whole, equal to a reload
    open_row = re.search(r'id="bead-row-([^"]+)"', html).group(1)
    seq = as_of(client.get(url).content.decode())
    beads.close_bead(open_row, actor="test", force=True)
    data = live(client, url, since=seq, x_live_layout=layout_key)
    assert "bead-table" in data["fragments"]
    assert_parts_of(client.get(url).content.decode(), data["fragments"])


def test_a_slider_step_of_an_overview_lists_the_same_window_of_waves(routes, admin_user):
    convoy_id, ids = big_convoy()
    beads.close_bead(
        ids[140], actor="test", force=True
    )  # the convoy's stream has an event to step to
    client = logged_in(admin_user)
    response = client.get(f"/convoys/{convoy_id}/history/?step=1")
    assert response.status_code == 200, response.content
    html = response.json()["fragments"]["wave-card"]
    assert len(re.findall(r'<tr data-wave="', html)) == sizes.BAND_PAGE
    assert 'class="chip' not in html and 'id="wave-pager"' in html


def page_of(convoy_id, params=None):
    convoy = Convoy.objects.get(pk=convoy_id)
    facts = overview.applies(convoy, params or {})
    assert facts is not None
    return overview.page(convoy, facts, params or {}, None, timezone.now())[0]


def test_an_overview_reads_its_window_never_the_whole_convoy(routes, admin_user, monkeypatch):
    """Whatever the convoy's size, an overview runs the same queries over the same number of
    beads: the kept facts and a window read by id (no snapshot of the convoy is loaded)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    small, _ = big_convoy()
    large, _ = big_convoy(size=2100, done=420, convoy_id="hq-cv-ov2", prefix="gt-ow")
    monkeypatch.setattr(snapshots, "load", lambda *a: pytest.fail("a whole convoy was loaded"))
    client = logged_in(admin_user)
    counts, windows = [], []
    for convoy_id in (small, large):
        client.get(f"/convoys/{convoy_id}/")  # the layout, once
        for headers in ({"Cache-Control": "no-cache"}, {"X-Live": "1", "X-Live-Since": "1"}):
            with CaptureQueriesContext(connection) as ctx:
                response = client.get(f"/convoys/{convoy_id}/", headers=headers)
            assert response.status_code == 200
            counts.append(len(ctx.captured_queries))
        convoy = Convoy.objects.get(pk=convoy_id)
        facts = overview.applies(convoy, {})
        assert facts is not None
        _, window = overview.page(convoy, facts, {}, None, timezone.now())
        windows.append(len(window.beads))
    assert counts[:2] == counts[2:], counts
    assert windows[1] <= windows[0] + sizes.CRITICAL_DRAWN, windows


def test_the_kept_overview_equals_the_convoy_read_in_full(routes, admin_user):
    """The waves' counts and causes, the critical path and the counts by cause an overview
    reads from the read model are what reading every bead gives (`?all=1`)."""
    convoy_id, ids = big_convoy()
    beads.update_bead(ids[141], status="in_progress", assignee="ann", actor="test")
    beads.close_bead(ids[142], actor="test", force=True)
    beads.update_bead(ids[300], status="deferred", actor="test")
    kept = page_of(convoy_id)
    full = convoy_page.convoy_page(
        Convoy.objects.get(pk=convoy_id), {"all": "1"}, admin_user, timezone.now()
    )
    assert not full.overview and kept.overview
    assert [(w["counts"], w["total"], w["causes"]) for w in kept.waves] == [
        (w["counts"], w["total"], w["causes"]) for w in full.waves
    ]
    assert kept.critical_length == len(full.critical) > 0
    assert [c for c, _ in kept.critical] == [c for c, _ in full.critical][: len(kept.critical)]
    assert kept.causes == full.causes and kept.frontier == full.frontier
    assert kept.summary_line == full.summary_line


def test_an_overview_kept_event_by_event_equals_one_rebuilt(routes, admin_user):
    from .support.pages import same_markup

    convoy_id, ids = big_convoy()
    client = logged_in(admin_user)
    for bead_id in ids[140:147]:
        beads.close_bead(bead_id, actor="test", force=True)
    beads.update_bead(ids[160], status="in_progress", assignee="ann", actor="test")
    url = f"/convoys/{convoy_id}/?open=2"
    kept = client.get(url).content.decode()
    projection.rebuild()
    rebuilt = client.get(url).content.decode()
    strip = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00")  # the moment drawn
    assert strip.sub("", same_markup(kept)) == strip.sub("", same_markup(rebuilt))
