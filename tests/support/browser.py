"""Chromium through Playwright, and a web process and task cluster for it to talk to."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .paths import IN_CI, ROOT
from .processes import child_env, free_port, spawn, wait_port
from .users import PASSWORD

CHROMIUM = "/usr/bin/chromium"


SHOTS = ROOT / "artifacts" / "screenshots"


FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser():
    """Chromium through Playwright's sync API. That API keeps an event loop running in this
    thread, so Django takes the tests' own ORM calls (plain sync code) for calls from async
    code: DJANGO_ALLOW_ASYNC_UNSAFE is set here, only while the browser is open, and never
    reaches the processes the tests start (conftest.child_env drops it)."""
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing (apt-get install chromium; ./test.sh does it as root)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as mp, sync_playwright() as pw:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        instance = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield instance
        instance.close()


@pytest.fixture
def server(transactional_db):
    port = free_port()
    env = child_env(CONVOY_FEED_INTERVAL="1", CONVOY_STRANDED_INTERVAL="2", DEBUG="1")
    web = spawn("web", env, port)
    cluster = spawn("cluster", env)
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        for proc in (web, cluster):
            proc.send_signal(signal.SIGTERM)
        for proc in (web, cluster):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for proc in (web, cluster):  # DJANGO_ALLOW_ASYNC_UNSAFE never reaches them: nothing hidden
        assert "SynchronousOnlyOperation" not in Path(proc.log_path).read_text(errors="replace")


def login(browser, base, name):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    sign_in(page, base, name)
    return context, page


def sign_in(page, base, name):
    """Log `name` in through the login form, in a page of a context the caller set up."""
    page.goto(base + "/login/")
    page.fill("#id_username", name)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")


def wait_js(page, expression, timeout=10000):
    """Wait until a JavaScript expression is true in the page. Playwright's wait_for_function
    evaluates its string with eval(), which the pages' CSP (no 'unsafe-eval') refuses."""
    ends = time.monotonic() + timeout / 1000
    while not page.evaluate(f"() => Boolean({expression})"):
        assert time.monotonic() < ends, f"not true within {timeout} ms: {expression}"
        page.wait_for_timeout(50)


def wait_live(page):
    wait_js(
        page,
        "window.convoyLive && window.convoyLive.socket"
        " && window.convoyLive.socket.readyState === 1",
    )


def shot(page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
