"""Log lines an operator reads: a client error is one line, not a traceback."""

import logging

from django.contrib.auth.models import User
from django.test import Client

from .support.users import PASSWORD


def test_a_403_is_one_log_line_without_a_traceback(db, caplog):
    client = Client()
    client.force_login(User.objects.create_user("nobody", password=PASSWORD))
    with caplog.at_level(logging.WARNING, logger="django.request"):
        assert client.get("/").status_code == 403
    records = [r for r in caplog.records if r.name == "django.request"]
    assert [r.getMessage() for r in records] == ["Forbidden (Permission denied): /"]
    assert all(r.exc_info is None for r in records)
    assert "Traceback" not in caplog.text


def access_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "convoyweb.access"]


def test_access_lines_leave_out_heartbeats_and_live_fetches_unless_asked(routes, caplog, settings):
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "b@localhost", PASSWORD))
    with caplog.at_level(logging.INFO, logger="convoyweb.access"):
        assert client.get("/").status_code == 200
        assert client.get("/", headers={"X-Live": "1", "X-Live-Since": "0"}).status_code == 200
        ok = client.post("/api/heartbeat", {"worker": "gastown/polecats/nux"}, "application/json")
        bad = client.post("/api/heartbeat", {"worker": ""}, "application/json")
        assert client.get("/api/beads?status=hooked").status_code == 200  # a tool polling
        assert client.get("/api/beads/gt-nope").status_code == 404
        client.post("/api/beads/gt-nope/close", {}, "application/json")  # a write: logged
    assert ok.status_code == 200 and bad.status_code >= 400
    assert access_lines(caplog) == [
        "GET / 200",
        f"POST /api/heartbeat {bad.status_code}",
        "GET /api/beads/gt-nope 404",
        "POST /api/beads/gt-nope/close 404",
    ]
    caplog.clear()
    settings.LOG_ACCESS = True
    with caplog.at_level(logging.INFO, logger="convoyweb.access"):
        client.get("/", headers={"X-Live": "1", "X-Live-Since": "0"})
        client.post("/api/heartbeat", {"worker": "gastown/polecats/nux"}, "application/json")
    assert access_lines(caplog) == ["GET / 200", "POST /api/heartbeat 200"]


def test_a_404_for_a_very_long_path_logs_it_cut_short(db, caplog):
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "b@localhost", PASSWORD))
    with caplog.at_level(logging.WARNING, logger="django.request"):
        assert client.get("/nothing/" + "x" * 5000).status_code == 404
    [line] = [r.getMessage() for r in caplog.records if r.name == "django.request"]
    assert line.startswith("Not Found: /nothing/xxx") and line.endswith("…") and len(line) < 400
