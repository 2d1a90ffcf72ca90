"""Several convoys at once: pause, resume or acknowledge the dashboard's selection
(`POST /actions/convoys/`, one confirmation then one summary) and `POST /api/convoys/actions`,
each convoy in its own transaction through its own service: a refusal of one leaves the others
done and itself unchanged. Bad bodies are refused by field, nothing done."""

import pytest

from convoys.models import Convoy, Escalation, Event
from convoys.services import batch, convoys, escalation

from .support.factories import STUCK, bead, blocks, started
from .support.users import logged_in, signed_in, user_with, viewer

pytestmark = pytest.mark.django_db

URL = "/api/convoys/actions"


@pytest.fixture
def three(routes):
    made = []
    for i in range(3):
        bead(f"gt-m{i}", f"Work {i}")
        made.append(convoys.create(f"Convoy {i}", [f"gt-m{i}"]).pk)
    convoys.close(made[2], force=True, actor="test")
    return made


def editor():
    return signed_in("ed", "change_convoy", "view_convoy")


def post(client, body):
    return client.post(URL, body, content_type="application/json")


def paused():
    return set(Convoy.objects.filter(paused_at__isnull=False).values_list("pk", flat=True))


def test_the_service_reports_each_and_refuses_one(three):
    done = batch.run("pause", [*three, "hq-cv-nope", three[0]], actor="t", reason=" a  b ")
    assert [(o.id, o.result) for o in done.outcomes] == [
        (three[0], "done"),
        (three[1], "done"),
        (three[2], "refused"),
        ("hq-cv-nope", "refused"),
    ]
    assert paused() == set(three[:2])
    assert Convoy.objects.get(pk=three[0]).pause_reason == "a b"
    assert done.summary.startswith(f"Paused 2 convoys ({three[0]}, {three[1]}); 2 refused: ")
    assert f"convoy {three[2]} is closed: nothing to pause" in done.summary
    assert Event.objects.filter(kind="convoy.paused").count() == 2
    again = batch.run("pause", three[:2], actor="t")
    assert again.ids("unchanged") == three[:2] and "2 already paused" in again.summary


def test_the_api_pauses_and_resumes(three):
    client = editor()
    answer = post(client, {"action": "pause", "ids": three, "reason": "freeze"})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["done"], body["unchanged"], body["refused"]) == (2, 0, 1)
    assert body["results"][2] == {
        "id": three[2],
        "result": "refused",
        "detail": f"convoy {three[2]} is closed: nothing to pause",
    }
    assert paused() == set(three[:2])
    body = post(client, {"action": "resume", "ids": three}).json()
    assert (body["done"], body["unchanged"], body["refused"]) == (2, 1, 0)
    assert paused() == set()
    assert Event.objects.filter(kind="convoy.resumed", actor="api:ed").count() == 2


def test_acknowledge_several(routes):
    bead("gt-gate", "Pick a database", type="decision")
    stuck = []
    for i in range(2):
        bead(f"gt-w{i}", "Migrate")
        blocks("gt-gate", f"gt-w{i}")
        stuck.append(convoys.create(f"Stuck {i}", [f"gt-w{i}"]))
    bead("gt-calm", "Fine")
    calm = convoys.create("Calm", ["gt-calm"])
    escalation.escalate_stuck(now=max(started(c) for c in stuck) + STUCK)
    client = logged_in(viewer("v"))  # whoever is told may acknowledge
    body = post(client, {"action": "acknowledge", "ids": [c.pk for c in [*stuck, calm]]}).json()
    assert (body["done"], body["refused"]) == (2, 1)
    assert "is not escalated" in body["results"][2]["detail"]
    assert set(Escalation.objects.values_list("acknowledged_by", flat=True)) == {"api:v"}
    assert post(client, {"action": "pause", "ids": [calm.pk]}).status_code == 403


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "explode", "ids": ["x"]}, "action"),
        ({"action": "pause", "ids": []}, "ids"),
        ({"action": "pause", "ids": "hq-cv-1"}, "ids"),
        ({"action": "pause", "ids": [7]}, "ids"),
        ({"action": "pause", "ids": ["a\x00b"]}, "ids"),
        ({"action": "pause", "ids": ["x" * 65]}, "ids"),
        ({"action": "pause", "ids": ["x"] * 501}, "ids"),
        ({"action": "pause", "ids": ["x"], "reason": "z" * 501}, "reason"),
        ({"action": "pause", "ids": ["x"], "force": True}, "force"),
        ({"ids": ["x"]}, "action"),
        ([], "body"),
    ],
)
def test_a_bad_body_is_refused_by_field(three, body, field):
    answer = post(editor(), body)
    assert answer.status_code == 422, answer.content
    assert field in str(answer.json()["detail"])
    assert paused() == set()


def test_the_dashboard_asks_once_then_says_what_happened(three):
    client = logged_in(user_with("ed", "change_convoy", "view_convoy"))
    page = client.get("/").content.decode()
    assert f'name="ids" value="{three[0]}" form="convoy-actions"' in page
    assert 'value="pause">Pause selected' in page
    form = {"action": "pause", "ids": three, "reason": "release", "next": "/?status=all"}
    confirm = client.post("/actions/convoys/", form)
    assert confirm.status_code == 200 and b"Pause 3 convoys?" in confirm.content
    assert paused() == set()  # nothing done before the confirmation
    done = client.post("/actions/convoys/", form | {"confirmed": "1"}, follow=True)
    assert done.redirect_chain[-1][0] == "/?status=all"
    text = done.content.decode()
    assert "Paused 2 convoys" in text and f"1 refused: convoy {three[2]} is closed" in text
    assert paused() == set(three[:2])


def test_the_dashboard_refuses_an_empty_or_odd_selection(three):
    client = logged_in(user_with("ed", "change_convoy", "view_convoy"))
    answer = client.post("/actions/convoys/", {"action": "pause"}, follow=True)
    assert b"select at least one convoy" in answer.content
    answer = client.post("/actions/convoys/", {"action": "melt", "ids": three}, follow=True)
    assert b"action: one of pause, resume, acknowledge" in answer.content
    odd = ["a\x00b", "x" * 300]
    answer = client.post(
        "/actions/convoys/", {"action": "pause", "ids": odd, "confirmed": "1"}, follow=True
    )
    assert answer.status_code == 200 and b"2 refused" in answer.content
    assert paused() == set()


def test_a_viewer_may_not_pause_from_the_dashboard(three):
    client = logged_in(viewer("v"))
    assert b"Pause selected" not in client.get("/").content
    answer = client.post("/actions/convoys/", {"action": "pause", "ids": three, "confirmed": "1"})
    assert answer.status_code == 403 and paused() == set()
