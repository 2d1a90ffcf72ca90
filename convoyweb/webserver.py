"""daphne, answering what its HTTP parser (twisted's) would drop without a word: a request
line or a header line over 16 KB is closed silently there; here the client reads a 414 (the
request line: usually a URL too long) or a 431 (a header), in the API's JSON, and then the
connection closes. Run as daphne is: `python -m convoyweb.webserver [daphne's options] APP`
(what `manage.py serve` starts). Its access lines are the request middleware's
(`convoyweb.logs.RequestIds`): daphne's own go to /dev/null unless `--access-log` says."""

import json
import os
import sys
from typing import Any

from daphne.cli import CommandLineInterface
from twisted.web import http


def refusal(status: int, reason: str, detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class Channel(http.HTTPChannel):
    def lineLengthExceeded(self, line: bytes) -> None:  # noqa: N802 - twisted's name
        limit = self.MAX_LENGTH
        if line.split(b" ", 1)[0].endswith(b":"):  # "Name: value…": a header line
            answer = refusal(431, "Request Header Fields Too Large", f"a header over {limit} bytes")
        else:
            answer = refusal(414, "URI Too Long", f"request line over {limit} bytes")
        transport: Any = self.transport  # set once connected; twisted's interfaces are untyped
        transport.write(answer)
        self.loseConnection()  # type: ignore[no-untyped-call]


def main() -> None:
    # twisted builds each connection's channel from this module-level name.
    http.HTTPChannel = Channel  # type: ignore[misc]
    if not any(a.startswith("--access-log") for a in sys.argv[1:]):
        # The access line is the request middleware's (convoyweb/logs.py, LOG_ACCESS).
        sys.argv[1:1] = ["--access-log", os.devnull]
    os.environ.setdefault("CONVOY_PROCESS", "web")  # its log lines' process (serve sets it too)
    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
