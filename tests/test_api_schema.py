"""The JSON API against its own OpenAPI document (schemathesis): for generated requests to
every operation, valid and invalid, the server never answers 5xx, every status code and
body is the one the document declares, and a refused write changes nothing."""

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import negative_data_rejection, positive_data_acceptance
from schemathesis.core.parameters import ParameterLocation

from convoys.api import api
from convoys.models import Bead, Event
from convoys.services.tokens import create_token

from .support.factories import bead, blocks
from .support.users import PASSWORD

# The document is served to signed-in users only: load it from the API object, test the app.
schema = schemathesis.openapi.from_dict(api.get_openapi_schema())
schema.app = WSGIHandler()


@pytest.fixture
def keep_connection():
    """Like Django's test client: requests must not close the test transaction's connection."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def token(routes, django_user_model, keep_connection):
    """A small world (two beads, one blocking the other, in a convoy) and an admin's token."""
    from convoys.services import convoys

    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b")
    convoys.create("Schema", ["gt-a", "gt-b"])
    admin = django_user_model.objects.create_superuser("api", "api@localhost", PASSWORD)
    return create_token(admin, "schemathesis")


@pytest.mark.slow
@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI is not a lottery
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_api_conforms_to_its_schema(case, token):
    before = (Event.objects.count(), list(Bead.objects.values_list("id", "status", "priority")))
    # A well-formed request that a business rule refuses (close a closed bead, stage a cycle)
    # is answered 400 with the reason, by design: that check alone does not apply.
    excluded = [positive_data_acceptance]
    headers = case.meta.components.get(ParameterLocation.HEADER) if case.meta else None
    if headers is not None and headers.mode.is_negative:
        # The invalid header generated here is the Authorization header, which this test
        # replaces with a valid token: the request is no longer invalid.
        excluded.append(negative_data_rejection)
    response = case.call_and_validate(
        headers={"Authorization": f"Bearer {token}"}, excluded_checks=excluded
    )
    if response.status_code >= 400:
        after = (Event.objects.count(), list(Bead.objects.values_list("id", "status", "priority")))
        assert after == before, f"{case.method} {case.path} -> {response.status_code} changed data"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "method,path,body",
    [
        ("post", "/api/launch", {"ids": ["gt-\u0000a"]}),
        ("post", "/api/stage", {"ids": ["gt-a"], "title": "nul \u0000 title"}),
        ("patch", "/api/beads/gt-a", {"title": "nul \u0000 title"}),
        ("get", "/api/beads/gt-%00a", None),
    ],
)
def test_nul_bytes_are_refused_not_a_server_error(token, client, method, path, body):
    """PostgreSQL cannot store NUL in text (SQLite can): either way, never a 500."""
    before = (Event.objects.count(), list(Bead.objects.values_list("id", "title")))
    response = getattr(client, method)(
        path,
        data=body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code < 500, response.content
    if response.status_code >= 400:
        assert "detail" in response.json()
        assert (Event.objects.count(), list(Bead.objects.values_list("id", "title"))) == before
