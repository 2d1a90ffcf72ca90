"""The bead actions through the API and the command line: lists of ids, a dry run that
changes nothing, hostile input refused with one line naming the field."""

import json

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError
from django.test import Client

from convoys.models import Bead, Event
from convoys.services import convoys
from convoys.services.tokens import create_token

from .support.factories import bead, blocks, command
from .support.users import signed_in

pytestmark = pytest.mark.django_db
URL = "/api/beads/actions"


@pytest.fixture
def town(routes, settings):
    settings.CONVOY_RETRY_COOLDOWN = 0
    for bead_id in ("gt-a", "gt-b", "gt-c", "gt-d"):
        bead(bead_id)
    blocks("gt-a", "gt-d")
    blocks("gt-b", "gt-d")
    Bead.objects.filter(pk="gt-c").update(status="closed")
    return convoys.create("Entries", ["gt-a", "gt-b", "gt-c", "gt-d"])


@pytest.fixture
def token(town):
    root = User.objects.create_superuser("root", "root@localhost", None)
    return create_token(root, "actions")


def snapshot():
    return Event.objects.count(), list(
        Bead.objects.order_by("id").values_list("id", "status", "assignee", "rig")
    )


def post(token, body):
    raw = body if isinstance(body, str) else json.dumps(body)
    response = Client().post(
        URL, data=raw, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    return response.status_code, response.json()


def test_api_previews_then_applies_a_list(token, town):
    before = snapshot()
    code, preview = post(
        token, {"action": "skip", "ids": ["gt-a", "gt-c", "gt-b"], "dry_run": True}
    )
    assert code == 200 and snapshot() == before
    assert (preview["done"], preview["refused"], preview["dry_run"]) == (2, 1, True)
    assert preview["summary"] == "2 would be skipped, 1 refused (gt-c: gt-c is closed)"
    assert [o["ok"] for o in preview["outcomes"]] == [True, False, True]
    assert preview["outcomes"][2]["ready"] == ["gt-d"]
    code, done = post(token, {"action": "skip", "ids": ["gt-a", "gt-c", "gt-b"], "reason": "moot"})
    assert code == 200 and done["summary"] == "2 skipped, 1 refused (gt-c: gt-c is closed)"
    assert [o["words"] for o in done["outcomes"]] == [o["words"] for o in preview["outcomes"]]
    assert done["fed"] == ["gt-d"]
    event = Event.objects.get(kind="bead.skipped", bead_id="gt-a")
    assert (event.actor, event.data["reason"]) == ("api:root", "moot")
    shown = Client().get(f"/api/convoys/{town.pk}", HTTP_AUTHORIZATION=f"Bearer {token}")
    progress = shown.json()["progress"]
    assert (progress["done"], progress["skipped"]) == (1, 2)


def test_api_reassign_takes_a_rig(token):
    code, done = post(token, {"action": "reassign", "ids": ["gt-d"], "rig": "beads"})
    assert code == 200 and done["done"] == 1 and Bead.objects.get(pk="gt-d").rig_id == "beads"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "explode", "ids": ["gt-a"]}, "action"),
        ({"action": "skip", "ids": "gt-a"}, "ids"),
        ({"action": "skip", "ids": [1, 2]}, "ids"),
        ({"action": "skip", "ids": []}, "ids"),
        ({"action": "skip", "ids": ["gt-a"] * 501}, "ids"),
        ({"action": "skip", "ids": ["x" * 300]}, "ids"),
        ({"action": "skip", "ids": ["gt-a"], "dry_run": "yes"}, "dry_run"),
        ({"action": "skip", "ids": ["gt-a"], "reason": "x" * 501}, "reason"),
        ({"action": "skip", "ids": ["gt-a"], "bogus": 1}, "bogus"),
        ({"action": "skip", "ids": ["gt-a\u0000"]}, "ids"),
    ],
)
def test_api_refuses_hostile_bodies_naming_the_field(token, body, field):
    before = snapshot()
    code, answer = post(token, body)
    assert code == 422, answer
    assert field in answer["detail"][0]["loc"]
    assert snapshot() == before


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"action": "reassign", "ids": ["gt-a"]}, "reassign: give a rig or a worker (one of them)"),
        (
            {"action": "skip", "ids": ["gt-a"], "rig": "beads"},
            "rig and worker go with reassign, not skip",
        ),
        ('["skip"]', None),
        ("not json", None),
    ],
)
def test_api_refuses_bad_requests_whole(token, body, detail):
    before = snapshot()
    code, answer = post(token, body)
    assert code in (400, 422)
    if detail:
        assert answer["detail"] == detail
    assert snapshot() == before


def test_api_odd_ids_are_refused_per_bead(token):
    code, done = post(token, {"action": "skip", "ids": ["gt-a", "-rf", "../x", "gt-nope"]})
    assert code == 200
    assert [(o["id"], o["ok"]) for o in done["outcomes"]] == [
        ("gt-a", True),
        ("-rf", False),
        ("../x", False),
        ("gt-nope", False),
    ]


def test_api_needs_the_change_bead_permission(town):
    viewer = signed_in("viewer", "view_bead")
    response = viewer.post(
        URL, {"action": "skip", "ids": ["gt-a"]}, content_type="application/json"
    )
    assert response.status_code == 403
    assert Bead.objects.get(pk="gt-a").status == "open"


def test_cli_several_ids_with_dry_run_then_for_real(town):
    before = snapshot()
    with pytest.raises(
        CommandError, match=r"2 would be skipped, 1 refused \(gt-c: gt-c is closed\)"
    ):
        command("beads", "skip", "gt-a", "gt-c", "gt-b", "--dry-run")
    assert snapshot() == before
    out = command("beads", "skip", "gt-a", "gt-b", "--reason", "not needed")
    assert "⤼ gt-a: closes it as skipped (not done)" in out
    assert "⤼ gt-b: closes it as skipped (not done); makes gt-d ready" in out
    assert out.rstrip().endswith("2 skipped")
    assert Event.objects.get(kind="bead.skipped", bead_id="gt-b").data["reason"] == "not needed"
    assert "⤼ 2 skipped" in command("convoy", "status", town.pk)
    data = json.loads(command("beads", "reopen", "gt-a", "--json"))
    assert data["done"] == 1 and data["outcomes"][0]["words"].startswith("opens it again")


def test_cli_refusals_are_one_line_and_change_nothing(town, settings):
    before = snapshot()
    with pytest.raises(CommandError, match="gt-a is not held by a worker"):
        command("beads", "release", "gt-a")
    settings.CONVOY_ACTION_MAX_BEADS = 3
    with pytest.raises(CommandError, match=r"^ids: at most 3 beads in one action \(4 given\)$"):
        command("beads", "skip", "gt-a", "gt-b", "gt-c", "gt-d")
    with pytest.raises(CommandError, match="reassign: give a rig or a worker"):
        command("beads", "reassign", "gt-a")
    assert snapshot() == before
