"""Hostile request bodies through the JSON API: a body of the wrong
shape or type, a NUL byte, a lone surrogate or a 10 MB body is refused with a 4xx JSON answer
naming what is wrong, and nothing is written."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from convoys.models import Bead, Event
from convoys.services.tokens import create_token

from .support.factories import bead


@pytest.fixture
def token(routes):
    bead("gt-a", "Original title")
    bead("gt-b")
    root = User.objects.create_superuser("root", "root@localhost", None)  # no hashing
    return create_token(root, "hostile")


def snapshot():
    return (
        Event.objects.count(),
        list(Bead.objects.order_by("id").values_list("id", "title", "status", "priority")),
    )


CLIENT = Client()  # one for all: each new client loads the middleware again


def send(token, method, url, raw):
    """`raw` is the exact body text, so non-objects and escapes reach the server as written."""
    response = getattr(CLIENT, method)(
        url, data=raw, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    return response.status_code, response.json()


def refused(token, method, url, raw, status=422):
    before = snapshot()
    code, data = send(token, method, url, raw)
    assert code == status, data
    assert snapshot() == before, f"{method} {url} {raw[:60]!r} changed data"
    return data["detail"]


@pytest.mark.parametrize(
    "method,url,raw",
    [
        ("patch", "/api/beads/gt-a", '"hello world"'),  # set the title to "Hello World"
        ("post", "/api/beads/gt-a/close", '"string"'),  # closed the bead
        ("patch", "/api/beads/gt-a", "[1, 2]"),
        ("patch", "/api/beads/gt-a", "null"),
        ("post", "/api/stage", '"gt-a"'),
        ("post", "/api/launch", '["gt-a"]'),
        ("post", "/api/heartbeat", "42"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_refused(token, method, url, raw):
    (error,) = refused(token, method, url, raw)
    assert (error["loc"], error["msg"]) == (["body"], "Value error, the body must be a JSON object")


NUL = "Value error, must not contain a NUL character"
NOT_UNICODE = "nicode"  # a lone surrogate: "…not Unicode text" (pydantic: "…unicode string")


@pytest.mark.parametrize(
    "method,url,raw,field,message",
    [
        # wrong types, no coercion
        ("patch", "/api/beads/gt-a", '{"priority": true}', "priority", "integer"),  # stored 1
        ("patch", "/api/beads/gt-a", '{"priority": 1.0}', "priority", "integer"),
        ("patch", "/api/beads/gt-a", '{"priority": "1"}', "priority", "integer"),
        ("patch", "/api/beads/gt-a", '{"title": 5}', "title", "string"),
        ("patch", "/api/beads/gt-a", '{"assignee": ["x"]}', "assignee", "string"),
        ("patch", "/api/beads/gt-a", '{"titel": "typo"}', "titel", "Extra inputs"),
        ("post", "/api/beads/gt-a/close", '{"reason": 7}', "reason", "string"),
        ("post", "/api/launch", '{"ids": ["gt-a"], "force": "yes"}', "force", "boolean"),
        ("post", "/api/launch", '{"ids": ["gt-a"], "force": 1}', "force", "boolean"),
        ("post", "/api/stage", '{"ids": "gt-a"}', "ids", "list"),
        ("post", "/api/stage", '{"ids": ["gt-a", 3]}', 1, "string"),
        ("post", "/api/heartbeat", '{"worker": 5}', "worker", "string"),
        # lone surrogates (two of these were 500s)
        ("post", "/api/stage", '{"ids": ["\\ud800"]}', 0, NOT_UNICODE),
        ("post", "/api/launch", '{"ids": ["gt-a\\udfff"]}', 0, NOT_UNICODE),
        ("post", "/api/beads/gt-a/close", '{"reason": "\\ud800"}', "reason", NOT_UNICODE),
        ("post", "/api/stage", '{"ids": ["gt-a"], "title": "x\\ud800"}', "title", NOT_UNICODE),
        ("patch", "/api/beads/gt-a", '{"title": "\\ud800"}', "title", NOT_UNICODE),
        ("patch", "/api/beads/gt-a", '{"assignee": "w\\udc00"}', "assignee", NOT_UNICODE),
        ("post", "/api/heartbeat", '{"worker": "w\\ud800"}', "worker", NOT_UNICODE),
        # NUL bytes (SQLite stored them; the next export could not be imported)
        ("patch", "/api/beads/gt-a", '{"title": "a\\u0000b"}', "title", NUL),
        ("patch", "/api/beads/gt-a", '{"assignee": "\\u0000"}', "assignee", NUL),
        ("patch", "/api/beads/gt-a", '{"status": "open\\u0000"}', "status", NUL),
        ("post", "/api/beads/gt-a/close", '{"reason": "done\\u0000"}', "reason", NUL),
        ("post", "/api/heartbeat", '{"worker": "w\\u0000"}', "worker", NUL),
        ("post", "/api/stage", '{"ids": ["gt-a"], "title": "\\u0000"}', "title", NUL),
        ("post", "/api/launch", '{"ids": ["gt-\\u0000a"]}', 0, NUL),
    ],
)
def test_a_bad_field_is_refused_by_name(token, method, url, raw, field, message):
    (error,) = refused(token, method, url, raw)
    assert error["loc"][-1] == field and message in error["msg"], error
    assert error["loc"][:2] == ["body", field if isinstance(field, str) else "ids"]


@pytest.mark.parametrize(
    "url,field",
    [
        ("/api/beads/gt-%00a", "bead_id"),
        ("/api/convoys/hq-%00", "convoy_id"),
        ("/api/beads?q=%00", "q"),
        ("/api/beads?assignee=w%00", "assignee"),
        ("/api/convoys?status=open%00", "status"),
    ],
)
def test_a_nul_byte_in_a_path_or_query_is_refused_by_name(token, url, field):
    """Answered alike on every database (PostgreSQL cannot even compare text with NUL)."""
    (error,) = refused(token, "get", url, None)
    assert error["loc"][-1] == field and error["msg"] == NUL


@pytest.mark.parametrize(
    "url,field",
    [
        ("/api/beads?q=" + "x" * 100_000, "q"),  # was a 500 (SQLite: LIKE pattern too complex)
        ("/api/beads?assignee=" + "w" * 100_000, "assignee"),
        ("/api/beads?rig=" + "r" * 101, "rig"),
        ("/api/beads?status=" + "s" * 51, "status"),
        ("/api/convoys?status=" + "s" * 51, "status"),
    ],
)
def test_an_overlong_query_string_is_refused_by_name(token, url, field):
    (error,) = refused(token, "get", url, None)
    assert error["loc"] == ["query", field] and error["type"] == "string_too_long"


def test_a_ten_megabyte_body_is_a_json_413(token):
    raw = '{"title": "' + "x" * 10_000_000 + '"}'
    detail = refused(token, "patch", "/api/beads/gt-a", raw, status=413)
    assert detail.startswith("request body too large")


def test_malformed_json_is_a_json_400(token):
    assert refused(token, "post", "/api/beads/gt-a/close", "{not json", status=400)


def test_well_typed_bodies_still_work(token):
    code, data = send(token, "patch", "/api/beads/gt-a", '{"title": "Ünïcode ✓", "priority": 0}')
    assert code == 200 and (data["title"], data["priority"]) == ("Ünïcode ✓", 0)
    code, data = send(token, "post", "/api/beads/gt-b/close", "{}")
    assert code == 200 and data["status"] == "closed"
    code, data = send(token, "post", "/api/stage", '{"ids": ["gt-a"], "title": null}')
    assert code == 200 and data["convoy_id"]


def test_an_unknown_api_path_is_a_json_404(db):
    from django.test import Client

    # With CSRF checks on, as for a real client: a POST to no operation is a JSON 404 too,
    # not the CSRF failure page (nothing is written there).
    paths = (
        ("patch", "/api/beads/"),
        ("patch", "/api/beads/a%2Fb"),
        ("post", "/api/convoys/a%2Fb/pause"),
        ("get", "/api/x"),
    )
    for method, url in paths:
        response = getattr(Client(enforce_csrf_checks=True), method)(url)
        assert response.status_code == 404
        assert response["Content-Type"] == "application/json"
        assert response.json()["detail"].startswith("no API operation at /api/")


def test_an_unknown_status_filter_is_a_422_naming_the_allowed_ones(routes):
    from .support.users import signed_in

    client = signed_in("viewer-filter", "view_convoy", "view_bead")
    answer = client.get("/api/convoys", {"status": "bogus"})
    assert answer.status_code == 422
    [error] = answer.json()["detail"]
    assert error["loc"] == ["query", "status"]
    assert error["msg"] == (
        "unknown status filter 'bogus': use one of active, staged, all, open, closed, "
        "staged_ready, staged_warnings"
    )
    assert client.get("/api/convoys", {"status": "closed"}).status_code == 200
    page = client.get("/", {"status": "<b>bogus</b>"})
    assert page.status_code == 422
    text = page.content.decode()
    assert "Unknown status filter" in text and "use one of active" in text
    assert "<b>bogus</b>" not in text  # escaped
    assert client.get("/", {"status": "staged"}).status_code == 200


@pytest.mark.parametrize(
    ("method", "url", "allowed"),
    [
        ("get", "/api/beads/actions", "POST"),
        ("delete", "/api/convoys/actions", "POST"),
        ("put", "/api/beads/gt-a/log", "GET, POST"),
    ],
)
def test_a_wrong_method_is_a_json_405_naming_the_right_ones(token, method, url, allowed):
    before = snapshot()
    response = getattr(CLIENT, method)(url, HTTP_AUTHORIZATION=f"Bearer {token}")
    shown = response["Allow"]  # in no fixed order
    assert response.status_code == 405 and sorted(shown.split(", ")) == allowed.split(", ")
    assert response.json() == {"detail": f"{method.upper()} is not allowed on {url}; use {shown}"}
    assert snapshot() == before
