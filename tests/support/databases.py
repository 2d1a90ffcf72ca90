"""Which database the tests run on, and the Redis the PostgreSQL pass needs: a test that needs
one skips with a clear message where it is absent, and fails in CI."""

import os

import pytest
from django.db import connection

from .paths import IN_CI


def is_postgres():
    return connection.vendor == "postgresql"


def require_postgres():
    if not is_postgres():
        pytest.skip("runs in the PostgreSQL pass (DATABASE_URL=postgres://…; .ci/run does both)")


def redis_url():
    url = os.environ.get("REDIS_URL", "")
    if not url:
        if IN_CI and is_postgres():
            pytest.fail("REDIS_URL must be set in the CI PostgreSQL pass")
        pytest.skip("needs Redis (REDIS_URL=redis://…; .ci/run sets it in the PostgreSQL pass)")
    return url


def database_url():
    """A DATABASE_URL that points child processes at the test database."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    user = s.get("USER") or ""
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    return f"postgres://{auth}{host}:{port}/{s['NAME']}"
