"""Property: anything the entries accept (convoys/core/ids.py) passes every exit.

Ids, titles and assignees are generated from the whole accepted alphabet (Unicode letters,
marks and digits, the punctuation the rule allows, up to the maximum lengths), rig names and
route prefixes from theirs (ASCII letters, digits and '-._'), then
driven through import, the command line, the API and the services. Every page and API
endpoint answers 200 or 404, the JSON carries the values unchanged, export -> import ->
export is byte-identical, and the command dispatcher receives each value as one literal
argument. A websocket client keeps receiving events after events on such beads."""

import io
import itertools
import json
import sys
import time
import unicodedata
from urllib.parse import quote

import hypothesis
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.admin.utils import quote as admin_quote
from django.core.management import call_command
from django.db import transaction
from django.urls import reverse
from hypothesis import HealthCheck, assume, given
from hypothesis import strategies as st

from convoys.core import ids
from convoys.models import Bead, Convoy
from convoys.services import beads, convoys, sling
from convoys.services.tokens import create_token

from .support.live import communicator, has, receive_until
from .support.users import PASSWORD, session_cookie, viewer

PROPERTY = hypothesis.settings(
    max_examples=6,  # each example is ~20 requests: the test stays well under a minute
    deadline=None,
    derandomize=True,  # the same examples on every run
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
NOT_IN_NAMES = sorted(ids.FORBIDDEN_IN_NAMES)
VIEWERS = itertools.count()
SAFE_NAMES = st.from_regex(r"[a-zA-Z0-9][a-zA-Z0-9._-]{0,99}", fullmatch=True)
PREFIX_HEADS = st.from_regex(r"[a-zA-Z0-9][a-zA-Z0-9._]{0,12}", fullmatch=True)

id_char = st.characters(categories=["L", "M", "Nd"], include_characters=ids.ID_PUNCTUATION)
name_char = st.characters(exclude_categories=NOT_IN_NAMES)
text = st.text(st.characters(exclude_characters="\x00"), max_size=500)


def _nfc(value):
    return unicodedata.normalize("NFC", value)


@st.composite
def ids_with_prefix(draw, head, max_length=ids.BEAD_ID_MAX):
    """`<head>-<tail>`: the route prefix is `<head>-`. Sometimes exactly the maximum length."""
    tail = draw(st.text(id_char, min_size=1, max_size=max_length - len(head) - 1))
    value = _nfc(f"{head}-{tail}")[:max_length]
    if draw(st.booleans()):
        value = value.ljust(max_length, "x")
    assume(ids.id_problem(value, max_length) is None)
    return value


@st.composite
def worlds(draw):
    head = draw(PREFIX_HEADS)
    assume(ids.route_prefix_problem(f"{head}-") is None)
    bead_ids = draw(st.lists(ids_with_prefix(head), min_size=3, max_size=3, unique=True))
    convoy_id = draw(ids_with_prefix(head, ids.CONVOY_ID_MAX))
    assume(convoy_id not in bead_ids)
    rig = draw(SAFE_NAMES)
    assume(ids.rig_name_problem(rig) is None)
    assignee = draw(st.text(name_char, max_size=ids.NAME_MAX))
    assume(ids.name_problem(assignee) is None)
    titles = draw(st.lists(text.filter(str.strip), min_size=4, max_size=4))
    outside = draw(st.text(name_char.filter(lambda c: c != ":"), min_size=1, max_size=40))
    unknown = draw(st.text(name_char, min_size=1, max_size=200).filter(str.strip))
    assume(ids.target_problem(f"external:{outside}:{unknown}") is None)
    return {
        "prefix": f"{head}-",
        "a": bead_ids[0],
        "b": bead_ids[1],
        "d": bead_ids[2],
        "convoy": convoy_id,
        "rig": rig,
        "assignee": assignee,
        "titles": titles,
        "external": f"external:{outside}:{unknown}",
        "unknown": unknown,
    }


def bump_priority(bead_id):
    """A change (and so an event) whatever the priority is now."""
    bead = Bead.objects.get(pk=bead_id)
    beads.update_bead(bead_id, priority=(bead.priority + 1) % 5)


async def events_until(comm, done, seconds=60):
    """Events received until one satisfies `done` (a generous deadline: the machine may be
    busy); fails if none does in time."""
    received = []
    deadline = time.monotonic() + seconds
    while not (received and done(received[-1])):
        message = await comm.receive_json_from(timeout=max(deadline - time.monotonic(), 0.01))
        if message.get("type") == "event":
            received.append(message)
    return received


def run(*args):
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def write_files(tmp_path, w):
    routes = tmp_path / "routes.jsonl"
    routes.write_text(json.dumps({"prefix": w["prefix"], "path": f"{w['rig']}/mayor/rig"}) + "\n")
    records = [
        {
            "id": w["a"],
            "title": w["titles"][0],
            "assignee": w["assignee"],
            "status": "in_progress" if w["assignee"] else "open",
            "priority": 4,
            "dependencies": [
                {"issue_id": w["a"], "depends_on_id": w["b"], "type": "blocks"},
                {"issue_id": w["a"], "depends_on_id": w["external"], "type": "blocks"},
            ],
        },
        {"id": w["b"], "title": w["titles"][1], "priority": 0, "labels": [w["titles"][2]]},
        {
            "id": w["convoy"],
            "title": w["titles"][2],
            "issue_type": "convoy",
            "dependencies": [
                {"issue_id": w["convoy"], "depends_on_id": target, "type": "tracks"}
                for target in (w["a"], w["b"], w["external"])
            ],
        },
    ]
    issues = tmp_path / "issues.jsonl"
    issues.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return issues, routes


def page_status(client, path):
    status = client.get(path).status_code
    assert status in (200, 404), (path, status)
    return status


@pytest.fixture
def api_auth(django_user_model):
    admin = django_user_model.objects.create_superuser("prop", "prop@localhost", PASSWORD)
    return admin, {"Authorization": f"Bearer {create_token(admin, 'property')}"}


@pytest.mark.slow
@PROPERTY
@given(w=worlds())
def test_anything_accepted_passes_every_exit(w, api_auth, client, tmp_path_factory, settings):
    admin, auth = api_auth
    client.force_login(admin)
    tmp = tmp_path_factory.mktemp("world")
    argv_file = tmp / "argv.json"
    script = "import json, sys; json.dump(sys.argv[2:], open(sys.argv[1], 'w'))"
    settings.CONVOY_DISPATCHER = "command"
    settings.CONVOY_DISPATCH_COMMAND = (
        f'{sys.executable} -c "{script}" {argv_file} {{bead}} {{rig}} {{convoy}} {{worker}}'
    )
    with transaction.atomic():  # each example starts from an empty database
        # import
        issues, routes = write_files(tmp, w)
        run("beads", "import", str(issues), "--routes", str(routes))
        assert Bead.objects.get(pk=w["a"]).rig_id == w["rig"]
        # command line
        run("beads", "create", f"--id={w['d']}", "--priority=1", "--", w["titles"][3])
        run("beads", "dep", "add", w["d"], w["external"])
        # API
        bead_path = f"/api/beads/{quote(w['b'])}"
        body = json.dumps({"title": w["titles"][3], "assignee": w["assignee"]})
        response = client.patch(bead_path, body, "application/json", headers=auth)
        assert response.status_code == 200, response.content
        assert response.json()["title"] == w["titles"][3]
        assert response.json()["assignee"] == w["assignee"]
        response = client.post(
            "/api/heartbeat", {"worker": w["assignee"] or "w"}, "application/json", headers=auth
        )
        assert response.status_code == 200, response.content
        # services, and the dispatcher: each value arrives as one literal argument
        created = convoys.create(f"Work {w['titles'][0]}", [w["d"], w["external"]])
        _, rig, results = sling.sling([w["d"]])
        assert results[0]["ok"], results
        worker = Bead.objects.get(pk=w["d"]).assignee
        assert json.loads(argv_file.read_text()) == [w["d"], w["rig"], created.pk, worker]
        beads.close_bead(w["b"], reason=w["titles"][1])

        # every page and API endpoint: 200 or 404, never a server error
        for path in ("/", "/stranded/", "/inbox/", "/stage/"):
            assert page_status(client, path) == 200
        for bead_id in (w["a"], w["b"], w["d"]):
            assert page_status(client, reverse("bead", args=[bead_id])) == 200
            response = client.get(f"/api/beads/{quote(bead_id)}", headers=auth)
            assert response.status_code == 200 and response.json()["id"] == bead_id
        assert page_status(client, reverse("bead", args=[w["unknown"]])) in (200, 404)
        for convoy_id in (w["convoy"], created.pk):
            assert page_status(client, reverse("convoy", args=[convoy_id])) == 200
            response = client.get(f"/api/convoys/{quote(convoy_id)}", headers=auth)
            assert response.status_code == 200 and response.json()["id"] == convoy_id
        for path in (
            "/api/convoys?status=all",
            "/api/beads",
            f"/api/beads?assignee={quote(w['assignee'])}",
            f"/api/beads?q={quote(w['titles'][0][:50])}",
            "/api/stranded",
        ):
            response = client.get(path, headers=auth)
            assert response.status_code == 200, (path, response.content)
        for model, key in (("bead", w["a"]), ("convoy", w["convoy"])):
            admin_url = reverse(f"admin:convoys_{model}_change", args=[admin_quote(key)])
            assert page_status(client, admin_url) == 200

        # export -> import -> export: byte-identical
        first, second = tmp / "first.jsonl", tmp / "second.jsonl"
        run("beads", "export", "-o", str(first))
        Bead.objects.all().delete()
        Convoy.objects.all().delete()
        run("beads", "import", str(first))
        run("beads", "export", "-o", str(second))
        assert first.read_bytes() == second.read_bytes()
        transaction.set_rollback(True)


@pytest.mark.django_db(transaction=True)
@hypothesis.settings(PROPERTY, max_examples=3)
@given(w=worlds())
def test_live_updates_continue_after_events_on_any_accepted_id(w, routes):
    """The relay sent every event to a group named after the raw id: one id it could not use
    stopped live updates for everyone. Events on accepted ids of every shape come and go, and
    a subscriber of another bead is still served."""
    assume(not Bead.objects.filter(pk__in=[w["a"], w["b"]]).exists())
    if not Bead.objects.filter(pk="gt-watched").exists():
        beads.create_bead("Watched", bead_id="gt-watched")
    cookie = session_cookie(viewer(f"viewer-{next(VIEWERS)}"))

    async def go():
        comm = communicator("/ws/live/?topics=bead:gt-watched,dashboard", cookie)
        assert (await comm.connect())[0]
        await receive_until(comm, has("hello"))
        for key, title in ((w["a"], w["titles"][0]), (w["b"], w["titles"][1])):
            await sync_to_async(beads.create_bead)(title, bead_id=key, assignee=w["assignee"])
            await sync_to_async(beads.close_bead)(key, reason=title)
        await sync_to_async(bump_priority)("gt-watched")
        # Every one arrives (the dashboard's and the watched bead's), in whichever order the
        # groups deliver them; one that never does fails the deadline.
        wanted, seen = {w["a"], w["b"], "gt-watched"}, set()

        def all_seen(event):
            seen.add(event["bead_id"])
            return wanted <= seen

        received = await events_until(comm, all_seen)
        assert wanted <= {e["bead_id"] for e in received}
        await comm.disconnect()

    async_to_sync(go)()
