"""A convoy above selectors.OVERVIEW_AT tracked beads is an overview whose size does not grow
with the convoy: the graph draws the frontier wave and the next beads of the critical path,
other waves on demand (?open=N), the focused bead's wave; the wave table is a window of bands
(?wpage=N), the bead table pages (?bpage=N); a live update still equals a reload."""

import re

import pytest
from django.utils import timezone

from convoys import bulk, selectors
from convoys.models import Bead, Convoy, Dependency, TrackedBead
from convoys.services import beads

from .factories import bead
from .test_web import as_of, assert_parts_of, live, logged_in

pytestmark = pytest.mark.django_db


def big_convoy(size=700, done=140, convoy_id="hq-cv-ov", prefix="gt-ov"):
    """An epic shaped like bench/browser.py's: bead i blocked by i-7, i-14 and i-21 (each
    when (i + k) % 2 == 0, so the chains are uneven); the first `done` beads closed."""
    now = timezone.now()
    seed = bead(prefix + "seed")  # made by the services: its rig is the route's
    ids = [f"{prefix}{i:05d}" for i in range(size)]
    bulk.insert(
        Bead,
        [
            {
                "id": bead_id,
                "title": f"Overview {i}",
                "status": "closed" if i < done else "open",
                "issue_type": "task",
                "priority": 2,
                "created_at": now,
                "updated_at": now,
                "closed_at": now if i < done else None,
                "rig_id": seed.rig_id,
            }
            for i, bead_id in enumerate(ids)
        ],
    )
    bulk.insert(
        Dependency,
        [
            {"issue_id": ids[i], "depends_on_id": ids[i - 7 * k], "type": "blocks"}
            for i in range(size)
            for k in (1, 2, 3)
            if i - 7 * k >= 0 and (i + k) % 2 == 0
        ],
    )
    Convoy.objects.create(
        id=convoy_id, title="Overview", status="open", created_at=now, updated_at=now
    )
    bulk.insert(
        TrackedBead,
        [{"convoy_id": convoy_id, "bead_id": b, "position": n} for n, b in enumerate(ids)],
    )
    return convoy_id, ids


def drawn_ids(html):
    start = html.index('<svg class="dag"')
    svg = html[start : html.index("</svg>", start)]
    return set(re.findall(r'<g class="node [^"]*" data-id="([^"]+)"', svg))


def test_a_big_convoy_page_is_an_overview_of_bounded_size(routes, admin_user):
    convoy_id, ids = big_convoy()
    client = logged_in(admin_user)
    html = client.get(f"/convoys/{convoy_id}/").content.decode()
    page = selectors.convoy_page(Convoy.objects.get(pk=convoy_id), {}, admin_user, timezone.now())
    assert page.overview and len(page.waves) > selectors.BAND_PAGE
    drawn = drawn_ids(html)
    frontier = page.waves[page.frontier - 1]
    assert {b["id"] for b in frontier["beads"]} == set()  # no chips in an overview
    assert 0 < len(drawn) <= selectors.WAVE_DRAWN + selectors.CRITICAL_DRAWN
    assert {c for c, _ in page.critical[: selectors.CRITICAL_DRAWN]} <= drawn
    assert "Overview of" in html and 'data-open-wave="' in html
    # the wave table: a window of bands around the frontier, with a pager
    rows = re.findall(r'<tr data-wave="(\d+)"', html)
    assert len(rows) == selectors.BAND_PAGE and str(page.frontier) in rows
    assert 'id="wave-pager"' in html
    # the bead table: one page of unfinished beads, the rest a click away
    assert html.count('id="bead-row-') == selectors.ROWS_PAGE
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
    page = selectors.convoy_page(Convoy.objects.get(pk=convoy_id), {}, admin_user, timezone.now())
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
    assert f"n-{drawn[-1]}" in data["fragments"]
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
    assert len(re.findall(r'<tr data-wave="', html)) == selectors.BAND_PAGE
    assert 'class="chip' not in html and 'id="wave-pager"' in html


def test_a_reload_from_the_kept_snapshot_equals_one_read_afresh(routes, admin_user, settings):
    """CONVOY_RELOAD_FROM_KEPT: a full render carries forward the snapshot the process keeps
    (over the events since), and draws what a render that reads everything draws."""
    from convoys import snapshots

    from .test_web import same_markup

    convoy_id, ids = big_convoy()
    client = logged_in(admin_user)
    settings.CONVOY_RELOAD_FROM_KEPT = True
    client.get(f"/convoys/{convoy_id}/")
    beads.update_bead(ids[150], status="in_progress", assignee="ann", actor="test")
    beads.close_bead(ids[151], actor="test", force=True)
    loads = []
    real_load = snapshots.load

    def counting(*args):
        loads.append(args)
        return real_load(*args)

    snapshots.load = counting
    try:
        carried = client.get(f"/convoys/{convoy_id}/").content.decode()
        assert loads == []  # carried forward, not read afresh
        settings.CONVOY_RELOAD_FROM_KEPT = False
        fresh = client.get(f"/convoys/{convoy_id}/").content.decode()
        assert len(loads) == 1
    finally:
        snapshots.load = real_load
    strip = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00")  # the moment drawn
    assert strip.sub("", same_markup(carried)) == strip.sub("", same_markup(fresh))


def test_a_quiet_reload_keeps_the_page_and_a_hard_reload_reads_afresh(
    routes, admin_user, settings, monkeypatch
):
    """With the kept snapshot, a reload with no event since derives nothing again (the
    summary and stranded verdict are the kept ones) and draws what a fresh read draws; a hard
    reload (Cache-Control: no-cache) reads everything afresh."""
    from convoys import selectors, snapshots

    from .test_web import same_markup

    convoy_id, _ = big_convoy()
    client = logged_in(admin_user)
    settings.CONVOY_RELOAD_FROM_KEPT = True
    url = f"/convoys/{convoy_id}/"
    client.get(url)
    loads, verdicts = [], []
    real_load, real_classify = snapshots.load, selectors.stranding.classify
    monkeypatch.setattr(snapshots, "load", lambda *a: loads.append(a) or real_load(*a))
    monkeypatch.setattr(
        selectors.stranding,
        "classify",
        lambda *a, **k: verdicts.append(a) or real_classify(*a, **k),
    )
    kept = client.get(url).content.decode()
    assert loads == [] and verdicts == []  # carried, and the summary kept
    hard = client.get(url, headers={"Cache-Control": "no-cache"}).content.decode()
    assert len(loads) == 1 and len(verdicts) == 1
    strip = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00")  # the moment drawn
    assert strip.sub("", same_markup(kept)) == strip.sub("", same_markup(hard))
