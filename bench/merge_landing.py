"""From a forge's merge delivery to the landing notice in a subscriber's browser, beside the
same landing brought by a bead's close.

One daphne process and one task cluster serve a throw-away SQLite database; Chromium (the
tests' flags) has the subscriber's inbox open, live. Each round lands two one-bead convoys:
- "merge": a convoy merging by mr whose bead is closed already; a signed GitHub
  `pull_request` delivery (merged) is posted to /hooks/github over HTTP;
- "close": a direct convoy; its bead is closed through the JSON API.
Each is timed from the moment its request is sent to the moment the landing toast is in the
page (the browser's clock, in the same process's time line). Median and p90 of --rounds, and
their ratio: a merge should land as fast as a close.

    .venv/bin/python bench/merge_landing.py [--rounds 10]
"""

import argparse
import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, median, percentile, setup  # noqa: E402
from browser import CHROMIUM, FLAGS, free_port  # noqa: E402

SECRET = "bench-merge-secret"
TOASTED = """(title) => [...document.querySelectorAll('.toast')]
    .some(t => t.textContent.includes(title))"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    url = setup()
    session, token = _town()
    port = free_port()
    env = dict(
        os.environ,
        DATABASE_URL=url,
        DEBUG="0",
        PYTHONUNBUFFERED="1",
        CONVOY_GITHUB_SECRET=SECRET,
        CONVOY_FEED_INTERVAL="1",
    )
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    logs = Path(url.removeprefix("sqlite:///")).with_suffix(".log")
    log = open(logs, "w")  # noqa: SIM115
    daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    children = [
        subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        for command in (
            daphne + ["convoyweb.asgi:application"],
            [sys.executable, str(ROOT / "manage.py"), "cluster"],
        )
    ]
    try:
        found = run(f"http://127.0.0.1:{port}", session, token, args.rounds)
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    print(f"\nlanding notice in the browser, {args.rounds} rounds (SQLite, daphne + cluster)")
    print(f"{'brought by':<24} {'p50':>8} {'p90':>8}")
    for label, times in found.items():
        print(f"{label:<24} {median(times):>6.0f}ms {percentile(times, 90):>6.0f}ms")
    ratio = median(found["a merge delivery"]) / median(found["a bead's close"])
    print(f"merge / close: {ratio:.2f}x (goal: about 1x, a merge lands as a close does)")


def _town():
    """The subscriber's session and an API token; rigs for the beads."""
    from django.contrib.auth.models import User
    from django.test import Client

    from convoys.services import rigs, tokens

    rigs.upsert_route("gt-", "gastown")
    alice = User.objects.create_superuser("alice", "alice@localhost", "pw-pw-pw-123")
    client = Client()
    client.force_login(alice)
    return client.cookies["sessionid"].value, tokens.create_token(alice, "bench")


def _convoy(n, kind):
    """A one-bead convoy of alice's, launched; for a merge, its bead closed already."""
    from django.contrib.auth.models import User

    from convoys.services import beads, convoys, notify

    bead_id = f"gt-{kind}{n:03d}"
    beads.create_bead(f"{kind} {n}", bead_id=bead_id, actor="bench")
    convoy = convoys.create(
        f"Landing {kind} {n}", [bead_id], owner="alice", merge="mr" if kind == "m" else "direct"
    )
    notify.subscribe(User.objects.get(username="alice"), convoy)
    if kind == "m":
        beads.update_bead(bead_id, status="closed", reason="Implemented", actor="bench")
    return convoy.title, bead_id


def _post(url, body, headers):
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - our own server
        answer.read()


def _merge_delivery(base, n, bead_id):
    body = json.dumps(
        {
            "action": "closed",
            "number": n,
            "pull_request": {
                "number": n,
                "title": f"Work for {bead_id}",
                "body": "",
                "html_url": f"https://forge.example/pr/{n}",
                "merged": True,
                "merge_commit_sha": f"{n:07x}",
                "head": {"ref": f"polecat/nux/{bead_id}"},
                "base": {"ref": "main"},
            },
        }
    ).encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-Hub-Signature-256": signature,
        "X-GitHub-Event": "pull_request",
        "X-GitHub-Delivery": f"bench-{n}",
    }
    _post(base + "/hooks/github", body, headers)


def _close(base, token, bead_id):
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    _post(base + f"/api/beads/{bead_id}/close", json.dumps({"reason": "done"}).encode(), headers)


def run(base, session, token, rounds):
    from playwright.sync_api import sync_playwright

    for _ in range(300):
        try:
            urllib.request.urlopen(base + "/healthz", timeout=1).read()  # noqa: S310
            break
        except OSError:
            time.sleep(0.1)
    found = {"a merge delivery": [], "a bead's close": []}
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"  # the bench's writes beside Playwright's loop
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        context = browser.new_context()
        context.add_cookies([{"name": "sessionid", "value": session, "url": base}])
        page = context.new_page()
        page.goto(base + "/inbox/")
        page.wait_for_function(
            "() => window.convoyLive && window.convoyLive.socket"
            " && window.convoyLive.socket.readyState === 1"
        )
        for n in range(1, rounds + 1):
            for label, kind in (("a merge delivery", "m"), ("a bead's close", "c")):
                title, bead_id = _convoy(n, kind)
                started = page.evaluate("() => performance.now()")
                if kind == "m":
                    _merge_delivery(base, n, bead_id)
                else:
                    _close(base, token, bead_id)
                page.wait_for_function(TOASTED, arg=title, timeout=30_000, polling="raf")
                found[label].append(page.evaluate("() => performance.now()") - started)
        browser.close()
    return found


if __name__ == "__main__":
    main()
