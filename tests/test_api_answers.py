"""Answers a client can act on: 401 with a challenge when it sent no credentials (a signed-in
browser without its CSRF token still gets 403), 400 when staging refused, a status from the
known set; and an address in a convoy's notify list matches its user whatever its case."""

import json

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client

from convoys.models import ACTIVE_WORK_STATUSES, SETTABLE_STATUSES, Bead, Convoy, Event
from convoys.services import beads, convoys, notify
from convoys.services.errors import ServiceError
from convoys.services.tokens import create_token

from .support.factories import bead, blocks, command, imported_blocks
from .support.users import signed_in

pytestmark = pytest.mark.django_db

WRITES = [
    ("post", "/api/stage", {"ids": ["gt-a"]}),
    ("patch", "/api/beads/gt-a", {"status": "closed"}),
    ("post", "/api/beads/gt-a/close", {}),
    ("post", "/api/launch", {"ids": ["gt-a"]}),
]


@pytest.fixture
def root_token(routes):
    bead("gt-a")
    bead("gt-b")
    root = User.objects.create_superuser("root", "root@localhost", None)
    return create_token(root, "answers")


@pytest.mark.parametrize(("method", "url", "body"), WRITES, ids=lambda v: str(v)[:20])
def test_an_anonymous_write_is_401_with_a_challenge_and_changes_nothing(
    root_token, method, url, body
):
    before = Event.objects.count()
    answer = getattr(Client(enforce_csrf_checks=True), method)(
        url, data=json.dumps(body), content_type="application/json"
    )
    assert answer.status_code == 401
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert answer.json() == {"detail": "Unauthorized"}
    assert Event.objects.count() == before


def test_a_signed_in_browser_without_its_csrf_token_is_still_refused(root_token):
    client = signed_in("editor", "view_convoy", "change_bead")
    client.handler.enforce_csrf_checks = True
    answer = client.patch(
        "/api/beads/gt-a", data=json.dumps({"priority": 1}), content_type="application/json"
    )
    assert answer.status_code == 403
    assert answer.json()["detail"] == "CSRF check Failed"
    assert Bead.objects.get(pk="gt-a").priority == 2


def test_a_refused_stage_is_400_with_the_plan_and_makes_no_convoy(root_token):
    blocks("gt-a", "gt-b")
    imported_blocks("gt-b", "gt-a")  # a cycle (imported: the services refuse one)
    answer = Client().post(
        "/api/stage",
        data=json.dumps({"ids": ["gt-a", "gt-b"]}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {root_token}",
    )
    assert answer.status_code == 400
    body = answer.json()
    assert body["detail"] == "convoy staging failed: 1 error(s) found"
    assert [e["category"] for e in body["errors"]] == ["cycle"]
    assert not Convoy.objects.exists()
    fine = Client().post(
        "/api/stage",
        data=json.dumps({"ids": ["gt-a"]}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {root_token}",
    )
    assert fine.status_code == 200 and "detail" not in fine.json()


@pytest.mark.parametrize("status", ["<x-st>", "Closed", "", "done", "x" * 300])
def test_a_status_outside_the_known_set_is_refused_everywhere(root_token, status):
    answer = Client().patch(
        "/api/beads/gt-a",
        data=json.dumps({"status": status}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {root_token}",
    )
    assert answer.status_code in (400, 422), answer.content
    with pytest.raises(ServiceError, match="status must be one of"):
        beads.update_bead("gt-a", status=status or "x")
    with pytest.raises(Exception, match="status must be one of"):
        command("beads", "update", "gt-a", "--status", status or "x")
    assert Bead.objects.get(pk="gt-a").status == "open"


def test_every_settable_status_is_accepted_and_an_imported_unknown_one_is_kept(root_token):
    for status in SETTABLE_STATUSES:
        worker = "gastown/polecats/nux" if status in ACTIVE_WORK_STATUSES else ""
        assert beads.update_bead("gt-a", status=status, assignee=worker).status == status
    Bead.objects.filter(pk="gt-b").update(status="review")  # as an import of a custom status
    assert beads.update_bead("gt-b", priority=1).status == "review"  # kept, not refused
    assert beads.update_bead("gt-b", status="review").status == "review"


def test_a_notify_address_in_other_case_is_its_user_and_follows_their_rights(
    routes, django_capture_on_commit_callbacks
):
    User.objects.create_user("mallory", "mallory@example.com")  # may not view convoys
    bead("gt-l1")
    bead("gt-l2")
    assert notify.address_recipients(["Mallory@Example.COM"]) == []
    with django_capture_on_commit_callbacks(execute=True):
        convoy = convoys.create("Secret", ["gt-l1"], notify="Mallory@Example.COM")
        beads.close_bead("gt-l1")
        convoys.check(convoy.pk)
    assert Convoy.objects.get(pk=convoy.pk).status == "closed"
    assert mail.outbox == []  # not sent the report as if to a stranger
    with django_capture_on_commit_callbacks(execute=True):  # the control: a real stranger
        other = convoys.create("Open", ["gt-l2"], notify="stranger@example.org")
        beads.close_bead("gt-l2")
        convoys.check(other.pk)
    assert [m.to for m in mail.outbox] == [["stranger@example.org"]]
