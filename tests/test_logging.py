"""Log lines an operator reads: a client error is one line, not a traceback."""

import logging

from django.contrib.auth.models import User
from django.test import Client


def test_a_403_is_one_log_line_without_a_traceback(db, caplog):
    client = Client()
    client.force_login(User.objects.create_user("nobody", password="pw-pw-pw-123"))
    with caplog.at_level(logging.WARNING, logger="django.request"):
        assert client.get("/").status_code == 403
    records = [r for r in caplog.records if r.name == "django.request"]
    assert [r.getMessage() for r in records] == ["Forbidden (Permission denied): /"]
    assert all(r.exc_info is None for r in records)
    assert "Traceback" not in caplog.text
