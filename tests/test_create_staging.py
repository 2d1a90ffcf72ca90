"""Staging refusals everywhere (page, API, CLI) and re-staging in place after a rig changes."""

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management.base import CommandError
from django.test import Client

from convoys.models import Convoy, Event
from convoys.services import staging
from convoys.services.tokens import create_token

from .support.factories import bead, blocks, child, epic_of, staged_on_parked_rig
from .support.factories import command as cli
from .support.users import PASSWORD

ALL_CLOSED = "nothing to stage: all 2 tasks are closed"


@pytest.fixture
def manager(db):
    user = User.objects.create_user("manager", password=PASSWORD)
    user.user_permissions.add(
        *Permission.objects.filter(
            codename__in=("view_convoy", "view_bead", "add_convoy", "change_convoy")
        )
    )
    return user


@pytest.fixture
def closed_epic(routes):
    bead("gt-done", "Shipped epic", type="epic")
    for bead_id in ("gt-d1", "gt-d2"):
        bead(bead_id, status="closed")
        child("gt-done", bead_id)
    blocks("gt-d1", "gt-d2")
    return "gt-done"


def convoy_writes():
    return Convoy.objects.count(), Event.objects.filter(kind__startswith="convoy.").count()


@pytest.mark.parametrize(
    "args",
    [
        ("convoy", "stage", "gt-done"),
        ("convoy", "stage", "gt-done", "--launch"),
        ("convoy", "launch", "gt-done"),
        ("convoy", "launch", "gt-done", "--force"),
        ("convoy", "stage", "gt-d1", "gt-d2"),
    ],
)
def test_cli_refuses_all_closed_input_and_writes_nothing(closed_epic, args):
    with pytest.raises(CommandError) as exc:
        cli(*args)
    assert ALL_CLOSED in str(exc.value)
    assert convoy_writes() == (0, 0)


def test_api_refuses_all_closed_input_and_writes_nothing(closed_epic, manager):
    token = create_token(manager, "tool")
    web = Client()
    for url, body in (
        ("/api/stage", {"ids": ["gt-done"]}),
        ("/api/launch", {"ids": ["gt-done"], "force": True}),
    ):
        response = web.post(
            url, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
        )
        assert response.status_code == 400
        assert response.json() == {"detail": ALL_CLOSED}
    assert convoy_writes() == (0, 0)


def test_stage_page_refuses_all_closed_input_and_offers_no_launch(closed_epic, manager):
    web = Client()
    web.force_login(manager)
    page = web.get("/stage/", {"epic": "gt-done"}).content.decode()
    assert ALL_CLOSED in page
    assert 'value="launch"' not in page and 'value="stage"' not in page
    for action in ("stage", "launch"):
        page = web.post("/stage/", {"epic": "gt-done", "do": action, "force": "1"})
        assert ALL_CLOSED in page.content.decode()
    assert convoy_writes() == (0, 0)


def test_a_staged_convoy_whose_tasks_all_closed_is_refused_on_launch(routes):
    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b")
    plan = staging.stage(["gt-a", "gt-b"], actor="test")
    for bead_id in ("gt-a", "gt-b"):
        cli("beads", "close", bead_id)
    with pytest.raises(CommandError, match=ALL_CLOSED):
        cli("convoy", "launch", plan.convoy_id)
    assert Convoy.objects.get(pk=plan.convoy_id).status == "staged_ready"


@pytest.fixture
def parked_plan(routes):
    plan = staged_on_parked_rig()
    assert plan.status == "staged_warnings"
    assert [w.category for w in plan.warnings] == ["blocked-rig"]
    return plan


def test_unparking_the_rig_rechecks_its_staged_convoys(parked_plan):
    before = Event.objects.latest("seq").seq
    assert cli("rigs", "unpark", "gastown").strip() == "Rig gastown is active"
    convoy = Convoy.objects.get(pk=parked_plan.convoy_id)
    assert convoy.status == "staged_ready"
    restaged = Event.objects.get(seq__gt=before, kind="convoy.restaged")
    assert restaged.convoy_id == convoy.pk and restaged.data["old_status"] == "staged_warnings"
    assert convoy.extra["plan"]["warnings"] == []
    cli("rigs", "park", "gastown")  # parking moves it back
    assert Convoy.objects.get(pk=convoy.pk).status == "staged_warnings"


def test_recheck_keeps_the_epic_warnings_and_the_gates(routes):
    epic_of("gt-epic", ["gt-x", "gt-y", "gt-lone"])
    bead("gt-go", "Go?", type="decision")
    child("gt-epic", "gt-go")
    blocks("gt-x", "gt-y")
    blocks("gt-go", "gt-y")
    first = staging.stage(["gt-epic"], actor="test")
    categories = sorted(w.category for w in first.warnings)
    assert categories == ["gated", "orphan"]
    for _ in range(2):  # a re-check remembers what the convoy was staged from
        again = staging.recheck(first.convoy_id, actor="test")
        assert again.restaged and sorted(w.category for w in again.warnings) == categories
        assert [g.id for g in again.gated] == ["gt-y"] and again.gated[0].gated_by == ["gt-go"]
    assert Convoy.objects.get(pk=first.convoy_id).status == "staged_warnings"


def test_recheck_refuses_a_launched_convoy(routes):
    bead("gt-a")
    plan = staging.stage(["gt-a"], actor="test")
    cli("convoy", "launch", plan.convoy_id)
    with pytest.raises(Exception, match="only a staged convoy is re-checked"):
        staging.recheck(plan.convoy_id, actor="test")
