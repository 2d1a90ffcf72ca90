"""LOG_FORMAT=json: `serve` and every process under it (web, task cluster) and a command write
one JSON object a line, with the process, the request's id and the ids of the work involved."""

import json
import signal
import urllib.request
from pathlib import Path

import pytest

from .support.factories import bead, blocks
from .support.processes import FAST, _answers, manage, output, start, start_cluster, stop
from .support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

JSON = {**FAST, "LOG_FORMAT": "json"}


def lines_of(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_serve_and_its_children_log_one_json_object_a_line(routes):
    from .support.processes import child_env, free_port

    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b")
    port = free_port()
    serve = start("serve", "--port", str(port), env=JSON)
    try:
        assert wait_for(lambda: _answers(port), timeout=60, step=0.2), output(serve)
        asked = urllib.request.Request(
            f"http://127.0.0.1:{port}/login/", headers={"X-Request-ID": "probe-7"}
        )
        with urllib.request.urlopen(asked, timeout=10) as answer:
            assert answer.headers["X-Request-ID"] == "probe-7"
        closed = manage("beads", "close", "gt-a", env=child_env(**JSON))
        assert closed.returncode == 0, closed.stderr
        fed = lambda: '"bead": "gt-a"' in output(serve)  # noqa: E731
        assert wait_for(fed, timeout=30), output(serve)
    finally:
        text = stop(serve)
    records = lines_of(text)  # every line parses: nothing is left as text
    assert {"time", "level", "process", "pid", "logger", "message"} <= set(records[0])
    assert {"serve", "web", "tasks"} <= {r["process"] for r in records}
    access = [r for r in records if r.get("request") == "probe-7"]
    assert [(r["process"], r["message"], r["status"]) for r in access] == [
        ("web", "GET /login/ 200", 200)
    ]
    feeding = [r for r in records if r.get("bead") == "gt-a" and r["process"] == "tasks"]
    assert feeding and feeding[0]["message"].startswith("close ")


def test_a_hostile_request_id_is_replaced_not_echoed(client):
    answer = client.get("/healthz", headers={"X-Request-ID": 'x" onload=1'})
    given = answer.headers["X-Request-ID"]
    assert given != 'x" onload=1' and len(given) == 32 and given.isalnum()
    assert (
        client.get("/healthz", headers={"X-Request-ID": "a" * 65}).headers["X-Request-ID"]
        != "a" * 65
    )


def test_a_cluster_and_a_web_process_started_alone_log_json_too(routes):
    """As the compose file and the systemd units start them, without serve to wrap their
    lines: every line parses, named by its process."""
    from .support.processes import child_env, free_port, spawn, wait_port

    port = free_port()
    web = spawn("web", child_env(**JSON), port)
    cluster = start_cluster(LOG_FORMAT="json")
    try:
        wait_port(port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=10) as answer:
            assert answer.status == 200
        assert wait_for(lambda: "ticker started" in output(cluster), timeout=60), output(cluster)
    finally:
        clustered = stop(cluster, signal.SIGINT)
        web.terminate()
        web.wait(20)
    records = lines_of(clustered)
    assert {r["process"] for r in records} == {"cluster"}
    said = [r["message"] for r in records if r["logger"] == "convoys.cluster"]
    assert said[1] == "ticker started" and said[-1].endswith("has stopped"), said
    served = lines_of(Path(web.log_path).read_text())
    assert ("web", "GET /login/ 200") in {(r["process"], r["message"]) for r in served}
