"""Login throttling (django-axes): ten wrong passwords for one username from one address lock
that pair for a cool-off, with a page that says when to try again; other pairs are unaffected."""

import os
import re
import signal
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from .support.paths import ROOT
from .support.processes import child_env, free_port, log_file, wait_port

PASSWORD = "right-horse-battery"


@pytest.fixture
def users(db, settings):
    # A fast hasher: these tests check ~50 passwords, not the hashing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    User.objects.create_user("ann", password=PASSWORD)
    User.objects.create_user("bob", password=PASSWORD)


def attempt(client, username, password):
    return client.post("/login/", {"username": username, "password": password, "next": "/"})


def test_eleven_wrong_passwords_lock_the_account_for_that_address(users, settings):
    client = Client(REMOTE_ADDR="203.0.113.7")
    started = timezone.now()
    for _ in range(9):
        response = attempt(client, "ann", "guess")
        assert response.status_code == 200
        assert "Wrong username or password." in response.text
    for _ in range(2):
        assert attempt(client, "ann", "guess").status_code == 429

    response = attempt(client, "ann", PASSWORD)

    assert response.status_code == 429
    assert "_auth_user_id" not in client.session
    text = re.sub(r"\s+", " ", response.text)
    assert "Too many failed logins" in text
    assert "locked after 10 wrong passwords" in text
    # When to retry: a time of day (the cool-off after the last failure) and how long until then.
    retry = re.search(
        r"Try again after <time datetime=\"([^\"]+)\">\d\d:\d\d UTC</time> \(in 1[45]", text
    )
    assert retry, text
    retry_at = datetime.fromisoformat(retry.group(1))
    assert (
        started + settings.AXES_COOLOFF_TIME
        <= retry_at
        <= timezone.now() + settings.AXES_COOLOFF_TIME
    )
    # The lockout page carries the same headers as every other page.
    assert "'unsafe-inline'" not in response["Content-Security-Policy"]


def test_other_users_and_other_addresses_are_not_locked(users):
    locked = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(11):
        attempt(locked, "ann", "guess")

    other_user = attempt(locked, "bob", PASSWORD)
    assert other_user.status_code == 302 and other_user["Location"] == "/"
    elsewhere = Client(REMOTE_ADDR="198.51.100.2")
    response = attempt(elsewhere, "ann", PASSWORD)
    assert response.status_code == 302 and response["Location"] == "/"


def test_the_lock_ends_after_the_cool_off(users, settings):
    from axes.models import AccessAttempt

    client = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(10):
        attempt(client, "ann", "guess")
    assert attempt(client, "ann", PASSWORD).status_code == 429
    AccessAttempt.objects.update(
        attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1)
    )

    response = attempt(client, "ann", PASSWORD)

    assert response.status_code == 302 and response["Location"] == "/"


def test_a_success_before_the_limit_resets_the_count(users):
    client = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(9):
        attempt(client, "ann", "guess")
    assert attempt(client, "ann", PASSWORD).status_code == 302
    client.post("/logout/")
    for _ in range(9):
        assert attempt(client, "ann", "guess").status_code == 200
    assert attempt(client, "ann", PASSWORD).status_code == 302


def test_the_admin_login_is_throttled_too(users):
    client = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(10):
        client.post("/admin/login/", {"username": "ann", "password": "guess"})
    response = client.post("/admin/login/", {"username": "ann", "password": PASSWORD})
    assert response.status_code == 429
    assert "Too many failed logins" in response.text


@pytest.mark.parametrize(
    "username",
    ["a" * 300, "ann%00", "ann%ED%A0%80", "ann%FF", "ann%27%20OR%201%3D1%20--", "%E2%80%AE" * 60],
)
def test_hostile_usernames_are_a_failed_login_not_an_error(users, username):
    client = Client(REMOTE_ADDR="203.0.113.7")
    body = f"username={username}&password=guess"
    for _ in range(11):
        response = client.post("/login/", body, content_type="application/x-www-form-urlencoded")
        assert response.status_code in (200, 429)
    assert attempt(client, "ann", PASSWORD).status_code == 302


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_forged_x_forwarded_for_does_not_escape_the_lock_on_a_real_server():
    """`manage.py serve` without a proxy configured: the address is the connection's, so a
    client naming a new X-Forwarded-For on every attempt is still one address."""
    import requests

    User.objects.create_user("ann", password=PASSWORD)
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(port)],
        cwd=ROOT,
        env=child_env(),
        stdout=log_file("serve"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_port(port, timeout=60)
        base = f"http://127.0.0.1:{port}"
        session = requests.Session()

        def login(password, forwarded):
            session.get(f"{base}/login/", timeout=30)
            return session.post(
                f"{base}/login/",
                data={
                    "username": "ann",
                    "password": password,
                    "csrfmiddlewaretoken": session.cookies["csrftoken"],
                },
                headers={"X-Forwarded-For": forwarded},
                allow_redirects=False,
                timeout=30,
            )

        for i in range(11):
            assert login("guess", f"198.51.100.{i}").status_code in (200, 429)
        refused = login(PASSWORD, "198.51.100.99")
        assert refused.status_code == 429 and "Too many failed logins" in refused.text
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
