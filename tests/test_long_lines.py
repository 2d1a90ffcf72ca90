"""A request line or a header over 16 KB is answered, not dropped: a real web process (daphne,
as `serve` starts it) says 414 or 431 in the API's JSON and closes the connection; a long line
under the limit still reaches the app."""

import json
import socket

import pytest

from .support.processes import child_env, free_port, spawn, wait_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def raw_request(port, head):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(head)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.split(b"\r\n\r\n", 1)[-1]


def test_over_long_lines_get_414_and_431_and_shorter_ones_the_app():
    port = free_port()
    web = spawn("web", child_env(), port)
    try:
        wait_port(port)
        status, body = raw_request(
            port, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n"
        )
        assert status == 414 and json.loads(body) == {"detail": "request line over 16384 bytes"}
        status, body = raw_request(
            port,
            b"GET /login/ HTTP/1.1\r\nHost: localhost\r\nCookie: " + b"c" * 20000 + b"\r\n\r\n",
        )
        assert status == 431 and json.loads(body)["detail"].startswith("a header over")
        status, _ = raw_request(
            port,
            b"GET /api/"
            + b"b" * 9000
            + b" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )
        assert status in (401, 404)  # the app's own answer
    finally:
        web.terminate()
        web.wait(10)
