"""Hostile query strings and path ids on the pages and the admin: a 100,000-character search
(SQLite refuses LIKE patterns over 50 kB) and NUL characters (PostgreSQL refuses them in a
query) answer like any other search or a missing id, never 500."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from .support.factories import bead
from .support.users import PASSWORD

LONG = "x" * 100_000


@pytest.fixture
def boss(routes):
    bead("gt-q1", "Findable title")
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", PASSWORD))
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


def test_a_bead_with_many_dependencies_is_paged(boss):
    from convoys.models import Dependency

    Dependency.objects.bulk_create(
        Dependency(issue_id="gt-q1", depends_on_id=f"gt-up{i:04d}", type="blocks")
        for i in range(450)
    )
    first = boss.get("/beads/gt-q1/").content.decode()
    assert first.count('href="/beads/gt-up') == 200
    assert "(450, page 1 of 3)" in first and 'href="?deps=2"' in first
    last = boss.get("/beads/gt-q1/", {"deps": "3"}).content.decode()
    assert last.count('href="/beads/gt-up') == 50 and "gt-up0449" in last
    for hostile in ("²", "9" * 5000, "0", "-1", "99999"):
        assert boss.get("/beads/gt-q1/", {"deps": hostile}).status_code == 200
