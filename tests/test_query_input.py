"""Hostile query strings and path ids on the pages and the admin: a 100,000-character search
(SQLite refuses LIKE patterns over 50 kB) and NUL characters (PostgreSQL refuses them in a
query) answer like any other search or a missing id, never 500."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from .factories import bead

LONG = "x" * 100_000


@pytest.fixture
def boss(routes):
    bead("gt-q1", "Findable title")
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw-pw-pw-123"))
    return client


@pytest.mark.parametrize(
    "query",
    [{"q": LONG}, {"q": "a\x00b"}, {"owner": "\x00"}, {"rig": "\x00"}, {"status": "\x00"}],
)
def test_dashboard_filters_take_any_text(boss, query):
    response = boss.get("/", query)
    assert response.status_code == 200


@pytest.mark.parametrize("model", ["bead", "convoy", "event", "dispatch"])
def test_admin_search_takes_any_text(boss, model):
    for term in (LONG, "a\x00b"):
        response = boss.get(f"/admin/convoys/{model}/", {"q": term})
        assert response.status_code == 200, (model, response.status_code)


@pytest.mark.parametrize(
    "method,url",
    [
        ("get", "/convoys/%00/"),
        ("get", "/beads/gt-q1%00/"),
        ("post", "/rigs/%00/restore/"),
        ("post", "/convoys/hq-cv-%00/subscribe/"),
    ],
)
def test_nul_in_a_path_id_is_not_found(boss, method, url):
    assert getattr(boss, method)(url).status_code == 404
