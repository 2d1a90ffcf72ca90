"""Pages and the JSON API through the test client: login, permissions, CSRF, actions, queries."""

import json
import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from convoys.models import Bead, Convoy, Event, Notification, Subscription
from convoys.services import beads, convoys, staging
from convoys.services.tokens import create_token

from .support.factories import bead, blocks, child
from .support.pages import as_of, assert_parts_of, live
from .support.users import PASSWORD, logged_in, user_with


@pytest.fixture
def viewer(db):
    return user_with("viewer", "view_convoy", "view_bead")


@pytest.fixture
def editor(db):
    return user_with(
        "boss", "view_convoy", "view_bead", "change_convoy", "add_convoy", "change_bead"
    )


@pytest.fixture
def world(routes):
    bead("gt-root", "Root", type="epic")
    for bead_id in ("gt-a", "gt-b", "gt-c"):
        bead(bead_id)
        child("gt-root", bead_id)
    blocks("gt-a", "gt-b")
    plan = staging.stage(["gt-root"], actor="test")
    return plan.convoy_id


def test_every_page_needs_login(world):
    client = Client()
    for url in [
        "/",
        f"/convoys/{world}/",
        "/stage/",
        "/stranded/",
        "/beads/gt-a/",
        "/inbox/",
        "/subscriptions/",
    ]:
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"], url


def test_pages_render_for_a_viewer(world, viewer):
    client = logged_in(viewer)
    for url in [
        "/",
        f"/convoys/{world}/",
        "/stage/?epic=gt-root",
        "/stranded/",
        "/beads/gt-a/",
        "/inbox/",
        "/subscriptions/",
        "/?status=closed&sort=activity&q=root",
    ]:
        assert client.get(url).status_code == 200, url
    page = client.get(f"/convoys/{world}/").content.decode()
    assert '<svg class="dag"' in page and 'data-id="gt-b"' in page
    assert "3 beads across 2 waves (max parallelism: 2 in wave 1)" in page


def test_missing_permission_gets_a_clear_403(world, db):
    nobody = User.objects.create_user("nobody", password=PASSWORD)
    response = logged_in(nobody).get("/")
    assert response.status_code == 403 and b"you may not do that" in response.content


def test_actions_need_change_permission_and_csrf(world, viewer, editor):
    response = logged_in(viewer).post(f"/convoys/{world}/launch/", {"force": "1"})
    assert response.status_code == 403
    assert Convoy.objects.get(pk=world).status == "staged_warnings"
    csrf_client = logged_in(editor, csrf=True)
    assert csrf_client.post(f"/convoys/{world}/launch/", {"force": "1"}).status_code == 403
    response = logged_in(editor).post(f"/convoys/{world}/launch/", {"force": "1"})
    assert response.status_code == 302
    assert Convoy.objects.get(pk=world).status == "open"
    assert Bead.objects.get(pk="gt-a").status == "hooked"


def test_convoy_actions(world, editor):
    client = logged_in(editor)
    client.post(f"/convoys/{world}/launch/", {"force": "1"})
    client.post(f"/convoys/{world}/subscribe/", {"email": "1"})
    assert Subscription.objects.get(user=editor).email
    client.post(f"/convoys/{world}/close/", {"force": "1", "reason": "stop"})
    convoy = Convoy.objects.get(pk=world)
    assert convoy.status == "closed" and convoy.close_reason == "stop"
    bead("gt-d")
    client.post(f"/convoys/{world}/add/", {"ids": "gt-d"})
    assert Convoy.objects.get(pk=world).status == "open"


def test_after_a_post_the_way_back_stays_on_this_site(world, editor):
    """`next` may name a page of this site; another host (a protocol-relative //host too)
    falls back to the page the button was on."""
    client = logged_in(editor)
    page = f"/convoys/{world}/"
    for target in ("//evil.example/", "https://evil.example/", "///evil.example", ""):
        got = client.post(f"/convoys/{world}/subscribe/", {"next": target})
        assert (got.status_code, got["Location"]) == (302, page), target
        got = client.post("/beads/gt-c/reopen/", {"next": target})
        assert (got.status_code, got["Location"]) == (302, "/beads/gt-c/"), target
    got = client.post(f"/convoys/{world}/unsubscribe/", {"next": "/subscriptions/"})
    assert got["Location"] == "/subscriptions/"


def test_bead_close_and_reopen_from_the_bead_page(world, editor):
    client = logged_in(editor)
    client.post("/beads/gt-c/close/", {"reason": "done"})
    assert Bead.objects.get(pk="gt-c").status == "closed"
    client.post("/beads/gt-c/reopen/")
    assert Bead.objects.get(pk="gt-c").status == "open"
    assert Event.objects.filter(bead_id="gt-c", kind="bead.reopened").exists()


def test_stage_page_previews_without_writing_then_stages(routes, editor):
    bead("gt-root", type="epic")
    bead("gt-a")
    child("gt-root", "gt-a")
    client = logged_in(editor)
    page = client.get("/stage/?epic=gt-root").content.decode()
    assert "gt-root [epic]" in page and "staged_warnings" in page and "[orphan]" in page
    assert Convoy.objects.count() == 0
    response = client.post("/stage/", {"epic": "gt-root", "do": "stage"})
    assert response.status_code == 302 and Convoy.objects.count() == 1


def test_stage_page_shows_errors(routes, editor):
    bead("zz-a")
    page = logged_in(editor).get("/stage/?ids=zz-a").content.decode()
    assert "no valid rig" in page and Convoy.objects.count() == 0


def test_inbox_marks_read(world, editor):
    Subscription.objects.create(user=editor)
    beads.close_bead("gt-a")
    beads.close_bead("gt-b")
    beads.close_bead("gt-c")
    convoy = Convoy.objects.get(pk=world)
    convoys.set_status(convoy, "open")
    convoys.close_if_complete(convoy)
    note = Notification.objects.get(user=editor)
    assert note.subject == "🚚 Convoy landed: Root"
    client = logged_in(editor)
    inbox = client.get("/inbox/").content.decode()
    assert "Convoy landed: Root" in inbox and "Convoy: Root" not in inbox
    client.post("/inbox/")
    assert Notification.objects.get(pk=note.pk).read_at is not None


def _queries(client, url):
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


def test_dashboard_query_count_does_not_grow(routes, viewer):
    client = logged_in(viewer)

    def add_convoys(n, start):
        for i in range(start, start + n):
            ids = [bead(f"gt-q{i}x{j}").id for j in range(3)]
            convoys.create(f"Convoy {i}", ids)

    add_convoys(2, 0)
    small = _queries(client, "/")
    add_convoys(8, 2)
    assert _queries(client, "/") == small


def test_convoy_page_query_count_does_not_grow(routes, viewer):
    client = logged_in(viewer)
    small_ids = [bead(f"gt-s{i}").id for i in range(3)]
    large_ids = [bead(f"gt-l{i}").id for i in range(30)]
    for ids in (small_ids, large_ids):
        for a, b in zip(ids, ids[1:], strict=False):
            blocks(a, b)
    small = convoys.create("Small", small_ids)
    large = convoys.create("Large", large_ids)
    assert _queries(client, f"/convoys/{small.pk}/") == _queries(client, f"/convoys/{large.pk}/")


# --- JSON API -------------------------------------------------------------------------------
def api(client, method, url, body=None, token=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    response = getattr(client, method)(
        url,
        data=json.dumps(body) if body is not None else None,
        content_type="application/json",
        **headers,
    )
    return response.status_code, response.json()


def test_api_token_auth_and_errors(world, editor):
    token = create_token(editor, "tool")
    client = Client()
    assert api(client, "get", "/api/convoys")[0] == 401
    assert api(client, "get", "/api/convoys", token="cvw_wrong")[0] == 401
    status, data = api(client, "get", "/api/convoys", token=token)
    assert status == 200 and data[0]["id"] == world and data[0]["progress"]["total"] == 3
    status, data = api(client, "get", f"/api/convoys/{world}", token=token)
    assert [[t["id"] for t in w["tasks"]] for w in data["waves"]] == [["gt-a", "gt-c"], ["gt-b"]]
    assert api(client, "get", "/api/convoys/hq-cv-nope0", token=token) == (
        404,
        {"detail": "convoy 'hq-cv-nope0' not found"},
    )
    status, data = api(client, "patch", "/api/beads/gt-a", {"priority": "high"}, token=token)
    assert status == 422 and Bead.objects.get(pk="gt-a").priority == 2
    status, data = api(client, "patch", "/api/beads/gt-a", {"priority": 9}, token=token)
    assert status == 422 and data["detail"][0]["loc"][-1] == "priority"
    status, data = api(client, "patch", "/api/beads/gt-a", {"status": "closed"}, token=token)
    assert status == 200 and data["status"] == "closed"
    status, data = api(client, "patch", "/api/beads/gt-a", {}, token=token)
    assert status == 400 and "nothing to update" in data["detail"]


def test_api_close_heartbeat_launch(world, editor):
    token = create_token(editor, "worker")
    client = Client()
    status, data = api(client, "post", "/api/launch", {"ids": [world], "force": True}, token=token)
    assert status == 200 and [d["id"] for d in data["dispatched"]] == ["gt-a", "gt-c"]
    worker = Bead.objects.get(pk="gt-a").assignee
    assert api(client, "post", "/api/heartbeat", {"worker": worker}, token=token)[0] == 200
    status, data = api(client, "post", "/api/beads/gt-a/close", {"reason": "done"}, token=token)
    assert status == 200 and data["status"] == "closed"
    assert api(client, "post", "/api/beads/gt-a/close", {}, token=token)[0] == 400
    assert api(client, "get", "/api/stranded", token=token)[0] == 200


def test_api_permissions_and_session_csrf(world, viewer):
    token = create_token(viewer, "ro")
    assert api(Client(), "post", "/api/beads/gt-a/close", {}, token=token)[0] == 403
    browser = logged_in(viewer, csrf=True)
    assert api(browser, "get", "/api/beads?status=open")[0] == 200
    assert api(browser, "post", "/api/beads/gt-a/close", {})[0] in (401, 403)
    assert Bead.objects.get(pk="gt-a").status == "open"


def test_openapi_schema_lists_the_endpoints(viewer):
    schema = logged_in(viewer).get("/api/openapi.json").json()
    paths = set(schema["paths"])
    assert {
        "/api/convoys",
        "/api/convoys/{convoy_id}",
        "/api/beads",
        "/api/beads/{bead_id}",
        "/api/beads/{bead_id}/close",
        "/api/heartbeat",
        "/api/stranded",
        "/api/stage",
        "/api/launch",
    } <= paths


def test_admin_bulk_close_goes_through_services(world, db):
    admin = User.objects.create_superuser("root", "root@localhost", PASSWORD)
    client = logged_in(admin)
    response = client.post(
        "/admin/convoys/bead/", {"action": "close_selected", "_selected_action": ["gt-a", "gt-c"]}
    )
    assert response.status_code == 302
    assert Event.objects.filter(kind="bead.closed", bead_id__in=["gt-a", "gt-c"]).count() == 2
    assert client.get("/admin/convoys/bead/gt-a/change/").status_code == 200


def test_admin_convoy_status_obeys_transition_table(world, db):
    admin = User.objects.create_superuser("root", "root@localhost", PASSWORD)
    client = logged_in(admin)
    convoys.close(world, force=True)
    page = client.get(f"/admin/convoys/convoy/{world}/change/")
    assert page.status_code == 200
    form = {
        "title": "T",
        "status": "staged_ready",
        "owner": "",
        "notify": "",
        "merge_strategy": "",
        "base_branch": "",
        "molecule": "",
        "max_in_flight": "",
        "description": "",
        "close_reason": "",
        "tracked-TOTAL_FORMS": "0",
        "tracked-INITIAL_FORMS": "0",
        "tracked-MIN_NUM_FORMS": "0",
        "tracked-MAX_NUM_FORMS": "1000",
    }
    response = client.post(f"/admin/convoys/convoy/{world}/change/", form)
    assert (
        response.status_code == 200
        and b"A convoy that is closed can only become open here." in (response.content)
    )
    assert Convoy.objects.get(pk=world).status == "closed"


def test_every_page_is_its_fragments_and_says_when_it_was_drawn(world, editor):
    client = logged_in(editor)
    client.post(f"/convoys/{world}/launch/", {"force": "1"})
    client.post("/subscriptions/", {"do": "add"})
    for url in [
        "/",
        f"/convoys/{world}/",
        "/beads/gt-a/",
        "/stranded/",
        "/inbox/",
        "/stage/?epic=gt-root",
        "/subscriptions/",
    ]:
        page = client.get(url).content.decode()
        assert as_of(page) == Event.objects.order_by("-seq").first().seq, url
        data = live(client, url)
        assert data["seq"] == as_of(page), url
        assert "unread" in data["fragments"] and len(data["fragments"]) >= 2, url
        assert_parts_of(page, data["fragments"])
    named = live(client, f"/convoys/{world}/?fragments=convoy-head,timeline")
    assert set(named["fragments"]) == {"convoy-head", "timeline"}


def test_dashboard_answers_only_the_rows_that_changed(world, editor):
    bead("gt-other")
    other = convoys.create("Other", ["gt-other"])
    client = logged_in(editor)
    client.post(f"/convoys/{world}/launch/", {"force": "1"})
    seq = as_of(client.get("/").content.decode())
    # The feeding banner turns on and off with time, not events: every answer carries it.
    assert set(live(client, "/", since=seq)["fragments"]) == {"unread", "feeding-stopped"}
    beads.close_bead("gt-a")
    data = live(client, "/", since=seq)
    # the row of the convoy whose bead closed, and the town capacity panel (one fewer in flight)
    assert set(data["fragments"]) == {
        f"convoy-{world}",
        "capacity-panel",
        "unread",
        "feeding-stopped",
    }
    assert data["seq"] > seq and other.pk not in "".join(data["fragments"])
    assert_parts_of(client.get("/").content.decode(), data["fragments"])
    # a convoy landing or a new convoy changes the list itself: the whole table
    convoys.create("Third", ["gt-other"])
    assert "convoy-table" in live(client, "/", since=data["seq"])["fragments"]


def test_convoy_page_answers_changed_nodes_rows_and_state(world, editor):
    client = logged_in(editor)
    client.post(f"/convoys/{world}/launch/", {"force": "1"})
    page = client.get(f"/convoys/{world}/").content.decode()
    layout_key = re.search(r'data-layout="([0-9a-f]+)"', page).group(1)
    beads.close_bead("gt-a")
    data = live(client, f"/convoys/{world}/", since=as_of(page), x_live_layout=layout_key)
    fragments = data["fragments"]
    # gt-a closed and gt-b, which it blocks, became ready: their nodes and rows; gt-c untouched
    assert {"n-gt-a", "n-gt-b", "bead-row-gt-a", "bead-row-gt-b"} <= set(fragments)
    assert "n-gt-c" not in fragments and "dag-card" not in fragments
    assert {"convoy-head", "convoy-actions", "critical", "dag-overlay", "timeline"} <= set(
        fragments
    )
    assert "st-done" in fragments["n-gt-a"] and "✓" in fragments["n-gt-a"]
    fresh = client.get(f"/convoys/{world}/").content.decode()
    assert_parts_of(fresh, fragments)
    # a page drawn with another layout gets the whole drawing
    other = live(client, f"/convoys/{world}/", since=as_of(page), x_live_layout="stale")
    assert "dag-card" in other["fragments"]


def test_closed_convoy_and_bead_pages_drop_their_actions(world, editor):
    client = logged_in(editor)
    client.post(f"/convoys/{world}/launch/", {"force": "1"})
    for bead_id in ("gt-a", "gt-c", "gt-b"):
        beads.close_bead(bead_id)
    convoys.close_if_complete(Convoy.objects.get(pk=world))
    fragments = live(client, f"/convoys/{world}/")["fragments"]
    assert (
        ">Check<" not in fragments["convoy-actions"]
        and ">Close<" not in fragments["convoy-actions"]
    )
    assert "Estimated landing" not in fragments["critical"]
    icons = re.findall(r'<text class="icon"[^>]*>(.)</text>', fragments["dag-card"])
    assert icons == ["✓", "✓", "✓"]
    bead_parts = live(client, "/beads/gt-a/")["fragments"]
    assert "Reopen" in bead_parts["bead-actions"] and "close-bead" not in bead_parts["bead-actions"]


def test_words_and_times_for_people(world, editor):
    convoy = Convoy.objects.get(pk=world)
    Convoy.objects.filter(pk=world).update(owner="api:boss")
    client = logged_in(editor)
    page = client.get("/").content.decode()
    assert '<span class="status staged_warnings">staged with warnings</span>' in page
    assert ">boss<" in page and "api:boss" not in page
    assert "Convoy: Root" not in page and convoy.title == "Convoy: Root"
    detail = client.get(f"/convoys/{world}/").content.decode()
    stamp = re.search(
        r'<time datetime="([^"]+)" title="([^"]+)" data-relative>([^<]+)</time>', detail
    )
    assert stamp and stamp.group(2).endswith(" UTC") and stamp.group(3) == "just now"
    assert "convoy staged" in detail and "by test" in detail
    beads.close_bead("gt-a")
    bead_page = client.get("/beads/gt-a/").content.decode()
    assert "bead closed" in bead_page and "bead.closed" not in bead_page


def test_a_big_convoy_page_drops_a_closed_bead_from_its_list(routes, editor):
    ids = [bead(f"gt-big{i:03d}").id for i in range(160)]  # more than the page lists in full
    convoy = convoys.create("Big", ids)
    client = logged_in(editor)
    page = client.get(f"/convoys/{convoy.pk}/").content.decode()
    layout_key = re.search(r'data-layout="([0-9a-f]+)"', page).group(1)
    beads.close_bead(ids[0])
    beads.update_bead(ids[1], priority=0)
    data = live(client, f"/convoys/{convoy.pk}/", since=as_of(page), x_live_layout=layout_key)
    fragments = data["fragments"]
    assert fragments[f"bead-row-{ids[0]}"] == ""
    assert f"bead-row-{ids[1]}" in fragments and "bead-table" not in fragments
    assert "1 more bead, mostly done, is not listed" in fragments["bead-table-more"]
    assert "wave-1" in fragments and "wave-card" not in fragments
    assert_parts_of(client.get(f"/convoys/{convoy.pk}/").content.decode(), fragments)


def test_live_requests_refuse_nothing_and_break_nothing(world, editor):
    client = logged_in(editor)
    url = f"/convoys/{world}/"
    for since in ("abc", "-5", "9" * 30, "", "1e3", "²"):
        assert "convoy-head" in live(client, url, x_live_since=since)["fragments"], since
    assert live(client, url + "?fragments=<script>,../x")["fragments"] == {}
    assert live(client, "/", x_live_layout="<svg>")["fragments"]
    assert client.get(url, HTTP_X_LIVE="0")["Content-Type"].startswith("text/html")
    page = client.get("/", HTTP_X_LIVE_SINCE="1").content.decode()  # since alone: the page
    assert 'id="convoy-table"' in page


def test_relative_times_read_naturally():
    from datetime import datetime, timedelta

    from convoys.core.formatting import relative

    now = datetime(2026, 12, 1, 12, 0)
    assert relative(now + timedelta(seconds=20), now) == "in under a minute"  # an ETA
    assert relative(now - timedelta(seconds=20), now) == "just now"
    assert relative(now + timedelta(minutes=5), now) == "in 5m"
    assert relative(now - timedelta(hours=2, minutes=5), now) == "2h 5m ago"


def test_a_timeline_draws_what_events_carry_as_text(routes, editor):
    """Event data comes from anyone with a token (and from imports): the timeline, drawn by a
    tag, escapes every value it prints, and prints odd types as text."""
    from convoys.log.events import record

    bead("gt-tl1")
    convoy = convoys.create("Timeline", ["gt-tl1"])
    record(
        "bead.status",
        bead_id="gt-tl1",
        actor="api:<i>mallory</i>",
        data={"status": "<b>odd</b>", "assignee": "<script>x</script>", "error": 42},
    )
    record("rig.state", convoy_id=convoy.pk, data={"rig": "<r>", "state": ["parked"]})
    for url in (f"/convoys/{convoy.pk}/", "/beads/gt-tl1/"):
        page = logged_in(editor).get(url).content.decode()
        timeline = page[page.index('id="timeline"') :]
        timeline = timeline[: timeline.index("</ol>")]
        assert "<script>" not in timeline and "<i>" not in timeline and "<b>" not in timeline
        assert ", assigned to &lt;script&gt;x&lt;/script&gt;" in timeline
        assert "by &lt;i&gt;mallory&lt;/i&gt;" in timeline
        assert "✗ 42" in timeline
    assert (
        "&lt;r&gt;: [&#x27;parked&#x27;]"
        in logged_in(editor).get(f"/convoys/{convoy.pk}/").content.decode()
    )


def test_a_closed_bead_outside_the_convoy_is_drawn_done(routes, viewer):
    """A blocker the convoy does not track is drawn as a ghost in its own state: done when
    closed, also after it closes while the page is open."""
    bead("gt-out")
    bead("gt-in")
    blocks("gt-out", "gt-in")
    convoy = convoys.create("Outside", ["gt-in"], actor="test")
    client = logged_in(viewer)
    url = f"/convoys/{convoy.pk}/"
    node = r'<g class="node ghost outside (st-\w+)" data-id="gt-out"'
    page = client.get(url).content.decode()
    assert re.search(node, page).group(1) == "st-blocked"
    seq = re.search(r'data-as-of="(\d+)"', page).group(1)
    beads.close_bead("gt-out", actor="worker")
    live = client.get(url, headers={"X-Live": "1", "X-Live-Since": seq}).json()["fragments"]
    assert re.search(node, live["dag-card"]).group(1) == "st-done"
    assert re.search(node, client.get(url).content.decode()).group(1) == "st-done"
