"""Every answer about a big convoy or epic has a bounded size: the stage preview shows the first
lines and waves of a big plan, a deep tree nests a bounded number of levels, ?all=1 is honoured
up to CONVOY_SHOW_ALL_MAX beads and the API's convoy detail lists a window of beads."""

import pytest

from convoys.core import formatting
from convoys.web import stage_views

from .support.factories import bead, big_convoy, blocks, child, drawn_ids
from .support.users import logged_in

pytestmark = pytest.mark.django_db


def chain_epic(depth):
    """An epic whose tasks nest `depth` levels deep (each the parent of the next)."""
    bead("gt-deep", "Deep", type="epic")
    parent = "gt-deep"
    for level in range(depth):
        bead_id = f"gt-d{level:03d}"
        bead(bead_id)
        child(parent, bead_id)
        parent = bead_id


def test_a_deep_tree_nests_a_bounded_number_of_levels(routes, admin_user):
    depth = formatting.MAX_INDENT + 8
    chain_epic(depth)
    client = logged_in(admin_user)
    response = client.post("/api/stage", {"ids": ["gt-deep"]}, content_type="application/json")
    assert response.status_code == 200, response.content[:300]
    node, levels = response.json()["tree"][0], 0
    while "children" in node and "depth" not in node["children"][0]:
        node, levels = node["children"][0], levels + 1
    assert levels == formatting.MAX_INDENT
    flat = node["children"]  # the rest, listed under the last nested level with their depth
    assert [item["depth"] for item in flat] == list(range(levels + 1, depth + 1))
    assert [item["id"] for item in flat] == [f"gt-d{i:03d}" for i in range(levels, depth)]
    text = client.get("/stage/?epic=gt-deep").content.decode()
    lines = [line for line in text.split("\n") if "gt-d0" in line and "──" in line]
    assert len(lines) == depth
    assert "… 8 levels deeper" in lines[-1]
    assert len(lines[-1]) < len(lines[formatting.MAX_INDENT - 1]) + 40  # stopped growing


def test_a_big_stage_preview_shows_its_first_lines_and_waves(routes, admin_user, monkeypatch):
    bead("gt-deep", "Deep", type="epic")  # 12 tasks, each blocking the next: 12 waves
    for level in range(12):
        bead(f"gt-d{level:03d}")
        child("gt-deep", f"gt-d{level:03d}")
        if level:
            blocks(f"gt-d{level - 1:03d}", f"gt-d{level:03d}")
    monkeypatch.setattr(stage_views, "PREVIEW_LINES", 5)
    monkeypatch.setattr(stage_views, "PREVIEW_WAVES", 4)
    html = logged_in(admin_user).get("/stage/?epic=gt-deep").content.decode()
    assert "… and 8 more lines of this tree" in html  # the epic, 12 tasks: 13 lines
    assert html.count('<tr><th scope="row">') == 4
    assert "… and 8 more waves, not listed here." in html


def test_show_all_is_honoured_up_to_its_limit(routes, admin_user, settings):
    convoy_id, _ = big_convoy()  # 700 beads
    client = logged_in(admin_user)
    settings.CONVOY_SHOW_ALL_MAX = 699
    html = client.get(f"/convoys/{convoy_id}/?all=1").content.decode()
    assert len(drawn_ids(html)) < 100 and "drawn in parts only" in html
    assert 'href="?all=1"' not in html
    settings.CONVOY_SHOW_ALL_MAX = 700
    html = client.get(f"/convoys/{convoy_id}/?all=1").content.decode()
    assert len(drawn_ids(html)) > 500
    assert 'href="?all=1"' in client.get(f"/convoys/{convoy_id}/").content.decode()


def test_the_api_lists_a_window_of_a_convoys_beads(routes, admin_user):
    convoy_id, ids = big_convoy(size=700, done=140)
    client = logged_in(admin_user)
    first = client.get(f"/api/convoys/{convoy_id}").json()
    assert [t["id"] for t in first["tracked"]] == ids[:500]
    assert first["window"] == {"offset": 0, "limit": 500, "total": 700, "next": 500}
    listed = {t["id"] for w in first["waves"] for t in w["tasks"]}
    assert listed <= set(ids[:500]) and listed
    last = client.get(f"/api/convoys/{convoy_id}?offset=690&limit=50").json()
    assert [t["id"] for t in last["tracked"]] == ids[690:]
    assert last["window"]["next"] is None
    assert {t["id"] for w in last["waves"] for t in w["tasks"]} <= set(ids[690:])
    for query in ("limit=1001", "limit=0", "offset=-1", "offset=x", "limit=²"):
        response = client.get(f"/api/convoys/{convoy_id}?{query}")
        assert response.status_code in (400, 422), query
