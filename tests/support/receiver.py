"""A local HTTP receiver for outbound webhooks and chat: a thread serving `http.server` on
127.0.0.1 (port 0), recording every request and answering as its plan says."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class Receiver:
    """`plan`: what to answer, request by request (then 200): a status code, "timeout" (wait
    `slow` seconds, longer than the client waits, then 200) or ("redirect", URL) (a 302)."""

    def __init__(self, slow=2.0):
        self.requests = []  # (method, path, {header: value} lower-cased, body bytes, time)
        self.plan = []
        self.slow = slow
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver.lock:
                    receiver.requests.append(("POST", self.path, headers, body, time.time()))
                    step = receiver.plan.pop(0) if receiver.plan else 200
                if step == "timeout":
                    time.sleep(receiver.slow)
                    step = 200
                if isinstance(step, tuple):
                    self.send_response(302)
                    self.send_header("Location", step[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                payload = b'{"ok": true}' if step < 300 else b'{"error": "no"}'
                try:
                    self.send_response(step)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the client gave up (a timeout)
                    pass

            do_PUT = do_POST

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self):
        return [json.loads(body) for _, _, _, body, _ in self.requests]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    got = Receiver()
    yield got
    got.close()


@pytest.fixture
def second_receiver():
    got = Receiver()
    yield got
    got.close()
