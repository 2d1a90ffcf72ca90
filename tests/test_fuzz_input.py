"""No 500 from input: generated query strings, form bodies, live-request headers and JSON
bodies for every page and every API operation, on the demo data and a convoy big enough to be
an overview, are all answered below 500. Each parameter meets each sharp value (Unicode
digits such as `²`, numbers too long for int(), NUL, 100,000 characters, `after ²` in an
epic's children) in an otherwise valid request, so the value reaches the code that reads it;
generated examples mix everything else (invalid percent-escapes, repeated names, any text).
A JSON body nested 100,000 deep goes to every page and API write. The API's schema-driven run
is tests/test_api_schema.py. Examples are bounded and derandomized: every run sends the same
requests."""

from io import StringIO
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convoys.models import Bead, Convoy, Event
from convoys.services.tokens import create_token

from .support.factories import big_convoy
from .support.users import PASSWORD

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

DEEP = "[" * 100_000 + "]" * 100_000  # a JSON document nested 100,000 lists deep
# Each parameter of each route gets each of these, the rest of the request valid.
SHARP = [
    "²",  # str.isdigit() says yes, int() says no
    "٣",  # an Arabic-Indic digit: int() reads 3
    "𝟗",
    "9" * 19,  # past a bigint
    "9" * 5000,  # past int()'s 4,300 digits
    "-1",
    "1e309",
    "\x00",
    "x" * 100_000,
    "Child | after ²",
    "Child | after " + "9" * 5000,
    "[" * 5000,
]
# What the generated examples draw from besides any text.
HOSTILE = [
    *SHARP,
    "0",
    "1",
    "2",
    " 3 ",
    "+4",
    "1.5",
    "nan",
    "½",
    "Ⅻ",
    "a\x00b",
    "☃",
    "",
    "<script>",
    "//elsewhere.invalid/",
    "A\nB | after 1\nC | after ³",
    "1,²,3",
]
# Raw query-string pieces a browser or a tool may send: not UTF-8, bad escapes.
RAW = ["%ff", "%", "%zz", "%00", "%ED%A0%80", "+", "=", "&&"]

value = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12), st.integers().map(str))


def encode(fields):
    return "&".join(f"{quote(name)}={quote(text, safe='')}" for name, text in fields)


def generated(base, names):
    """A query string or form body: the valid one with some values replaced or repeated,
    other names added, now and then a raw piece."""
    pair = st.tuples(st.sampled_from([*names, "x"]), value).map(lambda kv: encode([kv]))
    extra = st.lists(st.one_of(pair, st.sampled_from(RAW)), max_size=4)
    return extra.map(lambda pieces: "&".join(p for p in [encode(base.items()), *pieces] if p))


def each_sharp_value(base, names):
    """The valid request with one parameter set to one sharp value, for every pair."""
    for name in names:
        for sharp in SHARP:
            yield encode({**base, name: sharp}.items())


FUZZ = settings(
    max_examples=10,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI is not a lottery
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def town(db):
    """The demo town, a convoy big enough to be an overview, a superuser with a session and a
    token. Each test fuzzes all its routes on it (writes included: it closes, launches,
    acknowledges as it goes)."""
    call_command("demo", stdout=StringIO())
    big_id, _ = big_convoy(size=560, done=100)
    boss = User.objects.create_superuser("fuzz", "fuzz@example.com", PASSWORD)
    convoy = Convoy.objects.exclude(pk=big_id).order_by("created_at").first()
    staged = Convoy.objects.filter(status__startswith="staged").first() or convoy
    session = Client()
    session.force_login(boss)
    return {
        "convoy": convoy.pk,
        "staged": staged.pk,
        "big": big_id,
        "bead": Bead.objects.exclude(issue_type="epic").order_by("id").first().pk,
        "epic": Bead.objects.filter(issue_type="epic").order_by("id").first().pk,
        "rig": "gastown",
        "session": session,
        "api": Client(headers={"Authorization": f"Bearer {create_token(boss, 'fuzz')}"}),
    }


# (path, a valid request's parameters, every other parameter the view reads)
CONVOY = ["open", "all", "bpage", "focus", "wpage", "expand", "twave", "moved", "fragments"]
HISTORY = ["step", "wpage"]
ADMIN = ["q", "o", "p"]  # the admin reads the rest itself (its own 400s and ?e=1)
PAGES = [
    ("/", {}, ["status", "rig", "owner", "q", "sort", "fragments"]),
    ("/convoys/{convoy}/", {}, CONVOY),
    ("/convoys/{big}/", {}, CONVOY),
    ("/convoys/{convoy}/history/", {"step": "1"}, HISTORY),
    ("/convoys/{big}/history/", {"step": "1"}, HISTORY),
    ("/stage/", {"epic": "{epic}"}, ["ids", "epic", "fragments"]),
    ("/stage/", {"ids": "{bead}"}, ["ids"]),
    ("/create/", {}, []),
    ("/stranded/", {}, ["fragments"]),
    ("/beads/{bead}/", {}, ["deps", "fragments"]),
    ("/beads/{epic}/", {}, ["deps"]),
    ("/beads/{bead}/dependencies/add/", {}, []),
    ("/inbox/", {}, ["fragments"]),
    ("/subscriptions/", {}, ["fragments"]),
    ("/login/", {}, ["next"]),
    ("/api/docs", {}, []),
    ("/admin/convoys/bead/", {}, ADMIN),
    ("/admin/convoys/convoy/", {}, [*ADMIN, "status__exact"]),
    ("/admin/convoys/event/", {}, []),
    ("/admin/convoys/dispatch/", {}, []),
]
EPIC = {
    "kind": "epic",
    "prefix": "gt-",
    "title": "Fuzzed",
    "issue_type": "task",
    "priority": "2",
    "description": "",
    "children": "A\nB | after 1",
}
FORMS = [
    ("/convoys/{convoy}/pause/", {"reason": "fuzz"}, ["reason", "next"]),
    ("/convoys/{convoy}/resume/", {}, ["next"]),
    ("/convoys/{convoy}/ack/", {"next": "/inbox/"}, ["next"]),
    ("/convoys/{convoy}/visit/", {"seq": "1"}, ["seq"]),
    ("/convoys/{big}/visit/", {"seq": "1"}, ["seq"]),
    ("/convoys/{staged}/staging/recheck/", {}, ["x"]),
    ("/convoys/{convoy}/add/", {"ids": "{bead}"}, ["ids", "next"]),
    ("/convoys/{convoy}/check/", {}, ["next"]),
    ("/convoys/{convoy}/subscribe/", {"email": "1"}, ["email", "next"]),
    ("/convoys/{convoy}/nonsense/", {}, ["x"]),
    ("/convoys/{staged}/launch/", {}, ["force"]),
    ("/convoys/{convoy}/close/", {"reason": "fuzz"}, ["reason", "force"]),
    ("/stage/", {"do": "stage", "epic": "{epic}"}, ["ids", "epic", "title", "do", "force"]),
    ("/stage/", {"do": "launch", "ids": "{bead}"}, ["ids", "title", "force"]),
    ("/create/", EPIC, list(EPIC)),
    ("/create/", {**EPIC, "kind": "bead", "children": ""}, ["title", "priority", "issue_type"]),
    ("/beads/{bead}/dependencies/add/", {"target": "{epic}"}, ["target", "type"]),
    ("/beads/{bead}/retry/", {}, ["next"]),
    ("/beads/{bead}/close/", {"reason": "fuzz"}, ["reason", "next"]),
    ("/beads/{bead}/reopen/", {}, ["next"]),
    ("/rigs/{rig}/restore/", {}, ["next"]),
    ("/inbox/", {"id": "1"}, ["id"]),
    ("/subscriptions/", {"convoy": "{convoy}"}, ["convoy", "do", "email"]),
    ("/subscriptions/", {"do": "preferences"}, ["action_needed", "receipts"]),
    ("/login/", {"username": "nobody", "password": "x"}, ["username", "password", "next"]),
]
API_READS = [
    ("/api/convoys", {}, ["status", "limit"]),
    ("/api/convoys/{convoy}", {}, []),
    ("/api/convoys/{big}", {}, []),
    ("/api/beads", {}, ["status", "rig", "assignee", "q", "ready", "limit"]),
    ("/api/beads/{bead}", {}, []),
    ("/api/stranded", {}, []),
    ("/api/openapi.json", {}, []),
]
# (method, path, a valid body)
API_WRITES = [
    ("patch", "/api/beads/{bead}", {"assignee": "fuzz"}),
    ("post", "/api/beads/{bead}/close", {"reason": "fuzz"}),
    ("post", "/api/heartbeat", {"worker": "fuzz"}),
    ("post", "/api/stage", {"ids": ["{epic}"]}),
    ("post", "/api/launch", {"ids": ["{bead}"]}),
    ("post", "/api/convoys/{convoy}/pause", {"reason": "fuzz"}),
    ("post", "/api/convoys/{convoy}/resume", {}),
    ("post", "/api/convoys/{convoy}/ack", {}),
    ("post", "/api/beads/{bead}/retry", {}),
]


def filled(template, town):
    """A route's path or parameters with the town's ids put in."""
    if isinstance(template, str):
        return template.format(**{k: v for k, v in town.items() if isinstance(v, str)})
    if isinstance(template, dict):
        return {k: filled(v, town) for k, v in template.items()}
    if isinstance(template, list):
        return [filled(v, town) for v in template]
    return template


def answered(response, what):
    assert response.status_code < 500, (what, response.status_code, response.content[:2000])
    return response


def test_pages_answer_any_query_string_below_500(town):
    get = town["session"].get
    for path, base, names in PAGES:
        url, base = filled(path, town), filled(base, town)
        for query in each_sharp_value(base, names):
            answered(get(f"{url}?{query}"), (url, query[:300]))

        @FUZZ
        @given(query=generated(base, names), since=st.sampled_from([None, "", "1", "²", "9" * 30]))
        def run(query, since):
            headers = {} if since is None else {"X-Live": "1", "X-Live-Since": since}
            answered(get(f"{url}?{query}", headers=headers), (url, query, since))  # noqa: B023 (run at once)

        run()


def test_forms_answer_any_body_below_500(town):
    post = town["session"].post
    form = "application/x-www-form-urlencoded"
    for path, base, names in FORMS:
        url, base = filled(path, town), filled(base, town)
        for body in each_sharp_value(base, names):
            answered(post(url, body, content_type=form), (url, body[:300]))

        @FUZZ
        @given(body=generated(base, names))
        def run(body):
            answered(post(url, body, content_type=form), (url, body))  # noqa: B023 (run at once)

        run()
        answered(post(url, DEEP, content_type="application/json"), (url, "deep JSON"))


def test_api_reads_answer_any_query_string_below_500(town):
    get = town["api"].get
    for path, base, names in API_READS:
        url = filled(path, town)
        for query in each_sharp_value(base, names):
            answered(get(f"{url}?{query}"), (url, query[:300]))

        @FUZZ
        @given(query=generated(base, names))
        def run(query):
            answered(get(f"{url}?{query}"), (url, query))  # noqa: B023 (run at once)

        run()


json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(HOSTILE), st.text()),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
API_FIELDS = ["ids", "title", "force", "reason", "worker", "status", "assignee", "priority"]


def test_api_writes_answer_any_body_below_500(town):
    """The valid body with a field set to any JSON value, any JSON at all, and bodies nested
    100,000 deep (refused by name, changing nothing)."""
    for method, path, base in API_WRITES:
        url, base = filled(path, town), filled(base, town)
        send = getattr(town["api"], method)
        for field in API_FIELDS:
            for sharp in [*SHARP, 10**5000 // 10**4000, -(2**70), 1e308, [[[[[["x"]]]]]]]:
                payload = {**base, field: sharp}
                answered(send(url, payload, content_type="application/json"), (url, field))
        body = st.one_of(
            st.dictionaries(st.sampled_from(API_FIELDS), json_value, max_size=3).map(
                lambda fields, base=base: {**base, **fields}
            ),
            json_value,
        )

        @FUZZ
        @given(payload=body)
        def run(payload):
            answered(send(url, payload, content_type="application/json"), (url, payload))  # noqa: B023 (run at once)

        run()
        before = Event.objects.count()
        huge = '{"priority": ' + "9" * 5000 + "}"
        answered(send(url, huge, content_type="application/json"), (url, "5,000 digits"))
        for deep in (DEEP, '{"ids": ' + DEEP + "}", '{"reason": ' + DEEP + "}"):
            response = answered(send(url, deep, content_type="application/json"), (url, "deep"))
            assert response.status_code in (400, 422), (url, response.content[:500])
            assert "nested deeper than" in str(response.json()["detail"]), response.json()
        assert Event.objects.count() == before, url
