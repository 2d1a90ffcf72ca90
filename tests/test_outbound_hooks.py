"""Outbound webhooks and chat: a local receiver (tests/support/receiver.py) checks every
signature with the Standard Webhooks library, sees retries with growing gaps, gets only the
kinds it asked for; private addresses are refused; redirects are not followed; Apprise's
json:// and ntfy:// reach the same stand-in. Then `manage.py hooks`."""

import io
import json
import socket
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from standardwebhooks import Webhook

from convoys.infra import outbound
from convoys.models import WebhookDelivery, WebhookTarget
from convoys.services import hooks, merges, notify
from convoys.services.errors import ServiceError

from .support.factories import bead, command, launched
from .support.users import user_with

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _hook_settings(settings):
    settings.CONVOY_WEBHOOK_ALLOW_PRIVATE = True  # the receiver listens on 127.0.0.1
    settings.CONVOY_WEBHOOK_RETRY_BASE = 10.0
    settings.CONVOY_WEBHOOK_TIMEOUT = 0.5
    return settings


def verified(receiver, secret):
    """Every request's body, after its signature checked out."""
    bodies = []
    for _, _, headers, body, _ in receiver.requests:
        bodies.append(Webhook(secret).verify(body, headers))
    return bodies


@pytest.fixture
def landing(routes, closing, django_capture_on_commit_callbacks):
    """Launch a one-bead convoy and close its bead: it lands (and its webhooks go out)."""

    def land(bead_id="gt-a"):
        bead(bead_id)
        with django_capture_on_commit_callbacks(execute=True):
            convoy = launched([bead_id])
        closing(bead_id)
        return convoy

    return land


def action_needed(convoy, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        notify.notify_action_needed(convoy, "Bead parked", "gt-a failed three times")


# --- delivery -------------------------------------------------------------------------------------
def test_a_landing_reaches_a_town_target_signed_as_standard_webhooks_says(receiver, landing):
    added = hooks.add_target(receiver.url + "/in?x=1", town=True)
    assert added.secret.startswith("whsec_")
    convoy = landing()
    (body,) = verified(receiver, added.secret)
    _, path, headers, _, _ = receiver.requests[0]
    assert path == "/in?x=1"
    assert headers["webhook-id"].startswith("msg_")
    assert body["type"] == "convoy.landed"
    assert body["data"]["convoy"]["id"] == convoy.pk
    assert body["data"]["convoy"]["done"] == body["data"]["convoy"]["total"] == 1
    assert body["data"]["convoy"]["url"].endswith(f"/convoys/{convoy.pk}/")
    row = WebhookDelivery.objects.get()
    assert (row.attempts, row.status_code, row.state) == (1, 200, "delivered")
    assert row.latency_ms is not None and row.event_id == headers["webhook-id"]


def test_a_given_secret_signs_and_a_wrong_one_does_not_verify(receiver, landing):
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    added = hooks.add_target(receiver.url, town=True, secret=secret)
    assert added.secret == ""  # nothing generated, nothing to print
    landing()
    assert verified(receiver, secret)[0]["type"] == "convoy.landed"
    _, _, headers, body, _ = receiver.requests[0]
    with pytest.raises(Exception, match="signature"):
        Webhook("whsec_" + "A" * 32).verify(body, headers)


def test_500s_and_timeouts_are_retried_with_growing_gaps_then_delivered(
    receiver, routes, django_capture_on_commit_callbacks
):
    bead("gt-a")
    convoy = launched(["gt-a"])
    added = hooks.add_target(receiver.url, convoy_id=convoy.pk)
    receiver.plan = [500, "timeout", 503]
    action_needed(convoy, django_capture_on_commit_callbacks)
    row = WebhookDelivery.objects.get()
    assert (row.attempts, row.status_code, row.error) == (1, 500, "HTTP 500")
    first = row.next_attempt_at - row.last_attempt_at
    assert first == timedelta(seconds=10)

    assert hooks.deliver_due(row.next_attempt_at - timedelta(seconds=1)) == 0
    assert len(receiver.requests) == 1  # not due yet: nothing sent

    hooks.deliver_due(row.next_attempt_at)
    row.refresh_from_db()
    assert row.attempts == 2 and row.status_code is None and "timed out" in row.error
    second = row.next_attempt_at - row.last_attempt_at
    hooks.deliver_due(row.next_attempt_at)
    row.refresh_from_db()
    assert row.status_code == 503
    third = row.next_attempt_at - row.last_attempt_at
    assert (first, second, third) == tuple(timedelta(seconds=s) for s in (10, 20, 40))

    hooks.deliver_due(row.next_attempt_at)
    row.refresh_from_db()
    assert (row.attempts, row.status_code, row.state) == (4, 200, "delivered")
    assert row.next_attempt_at is None
    ids = {headers["webhook-id"] for _, _, headers, _, _ in receiver.requests}
    assert len(receiver.requests) == 4 and ids == {row.event_id}  # one id for every retry
    assert {b["type"] for b in verified(receiver, added.secret)} == {"convoy.action_needed"}
    assert hooks.deliver_due(row.created_at + timedelta(days=1)) == 0  # nothing is sent twice


def test_retries_stop_after_24_hours(
    receiver, routes, django_capture_on_commit_callbacks, settings
):
    settings.CONVOY_WEBHOOK_RETRY_BASE = 3600.0
    bead("gt-a")
    convoy = launched(["gt-a"])
    hooks.add_target(receiver.url, town=True)
    receiver.plan = [500] * 20
    action_needed(convoy, django_capture_on_commit_callbacks)
    row = WebhookDelivery.objects.get()
    while row.next_attempt_at is not None:
        hooks.deliver_due(row.next_attempt_at)
        row.refresh_from_db()
    # tries at 0, 1 h, 3 h, 7 h and 15 h; the next (31 h) would fall past the day
    assert row.attempts == 5 and row.state == "gave up" and len(receiver.requests) == 5
    assert timedelta(hours=15) <= row.gave_up_at - row.created_at < timedelta(hours=15, seconds=5)


def test_a_target_gets_nothing_for_kinds_it_did_not_ask_for(receiver, second_receiver, landing):
    hooks.add_target(receiver.url, town=True, kinds="merged,at-risk")
    wanted = hooks.add_target(second_receiver.url, town=True, kinds="landed")
    landing()
    assert receiver.requests == []
    assert [b["type"] for b in verified(second_receiver, wanted.secret)] == ["convoy.landed"]
    assert WebhookDelivery.objects.count() == 1


def test_dispatched_is_off_by_default_and_sent_when_asked(receiver, second_receiver, routes):
    hooks.add_target(receiver.url, town=True)
    asked = hooks.add_target(second_receiver.url, town=True, kinds="dispatched")
    bead("gt-a", "Paint the fence")
    convoy = launched(["gt-a"])
    assert receiver.requests == []
    hooks.deliver_due()  # the ticker's pass (the test's transaction never commits)
    (body,) = verified(second_receiver, asked.secret)
    assert body["type"] == "bead.dispatched"
    assert (
        body["data"]["bead"]["id"] == "gt-a" and body["data"]["bead"]["title"] == "Paint the fence"
    )
    assert body["data"]["convoys"] == [convoy.pk]
    assert receiver.requests == []


def test_a_recorded_merge_is_sent_as_merged(receiver, routes, django_capture_on_commit_callbacks):
    added = hooks.add_target(receiver.url, town=True, kinds="merged")
    bead("gt-a")
    convoy = launched(["gt-a"])
    with django_capture_on_commit_callbacks(execute=True):
        merges.record("gt-a", merges.Change(state="merged", source="cli", ref="abc123"))
    (body,) = verified(receiver, added.secret)
    assert body["type"] == "bead.merged"
    assert body["data"]["bead"]["ref"] == "abc123"
    assert body["data"]["convoy"]["id"] == convoy.pk


def test_a_users_own_target_hears_what_reaches_that_user(receiver, second_receiver, landing):
    alice = user_with("alice", "view_convoy")
    bob = user_with("bob", "view_convoy")
    notify.subscribe(alice)
    mine = hooks.add_target(receiver.url, user=alice)
    hooks.add_target(second_receiver.url, user=bob)  # not subscribed: hears nothing
    landing()
    assert [b["type"] for b in verified(receiver, mine.secret)] == ["convoy.landed"]
    assert second_receiver.requests == []


def test_one_delivery_per_target_per_event(receiver, landing):
    alice = user_with("alice", "view_convoy")
    notify.subscribe(alice)
    hooks.add_target(receiver.url, user=alice)
    convoy = hooks.add_target(receiver.url, town=True)
    landing()
    assert WebhookDelivery.objects.count() == 2  # two targets
    assert len({r.event_id for r in WebhookDelivery.objects.all()}) == 1
    assert convoy.target.deliveries.count() == 1


# --- what a target may reach --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url, word",
    [
        ("http://127.0.0.1:9/hook", "loopback"),
        ("http://localhost/hook", "loopback"),
        ("https://10.1.2.3/hook", "private"),
        ("http://192.168.0.10/", "private"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://[::1]:8080/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://0.0.0.0/", "unspecified"),
        ("json://127.0.0.1:9/", "loopback"),
        ("ntfy://10.0.0.5/topic", "private"),
    ],
)
def test_a_private_address_is_refused_unless_allowed(settings, url, word):
    settings.CONVOY_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(ServiceError, match=word):
        hooks.add_target(url, town=True)
    assert not WebhookTarget.objects.exists()


def test_a_target_that_became_private_is_not_sent_to(
    receiver, routes, settings, django_capture_on_commit_callbacks
):
    hooks.add_target(receiver.url, town=True)
    settings.CONVOY_WEBHOOK_ALLOW_PRIVATE = False
    bead("gt-a")
    action_needed(launched(["gt-a"]), django_capture_on_commit_callbacks)
    row = WebhookDelivery.objects.get()
    assert receiver.requests == []
    assert "loopback" in row.error and row.state == "retrying"


def test_redirects_are_not_followed(receiver, second_receiver, routes, landing):
    hooks.add_target(receiver.url, town=True)
    receiver.plan = [("redirect", second_receiver.url + "/elsewhere")]
    landing()
    row = WebhookDelivery.objects.get()
    assert (row.status_code, row.state) == (302, "retrying")
    assert len(receiver.requests) == 1 and second_receiver.requests == []


@pytest.mark.parametrize(
    "url, problem",
    [
        ("not a url", "no spaces"),
        ("example.com/hook", "is not a URL"),
        ("http:///nohost", "names no host"),
        ("http://user:pw@example.com/", "user name or password"),
        ("nosuchscheme://x/y", "no chat URL Apprise knows"),
        ("http://nonexistent.invalid/", "cannot resolve"),
    ],
)
def test_a_bad_url_is_refused(url, problem):
    with pytest.raises(ServiceError, match=problem):
        hooks.add_target(url, town=True)
    assert not WebhookTarget.objects.exists()


# --- chat through Apprise --------------------------------------------------------------------------
def test_chat_through_apprise_json(receiver, landing):
    hooks.add_target(f"json://127.0.0.1:{receiver.port}/", town=True)
    convoy = landing()
    ((_, path, headers, body, _),) = receiver.requests
    message = json.loads(body)
    assert "webhook-signature" not in headers  # a chat message, not a webhook
    assert message["title"].startswith("🚚 Convoy landed: ")
    assert convoy.title in message["title"]
    assert "1/1 done" in message["message"]
    assert f"/convoys/{convoy.pk}/" in message["message"]
    assert WebhookDelivery.objects.get().state == "delivered"


def test_chat_through_apprise_ntfy(receiver, routes, django_capture_on_commit_callbacks):
    hooks.add_target(f"ntfy://127.0.0.1:{receiver.port}/convoys", town=True)
    bead("gt-a")
    convoy = launched(["gt-a"])
    action_needed(convoy, django_capture_on_commit_callbacks)
    ((_, _, _, body, _),) = receiver.requests
    message = json.loads(body)
    assert message["topic"] == "convoys"
    assert message["title"].startswith("🚚 Action needed: ")
    assert "Bead parked" in message["message"] and "0/1 done" in message["message"]


def test_a_failing_chat_is_retried_like_a_webhook(
    receiver, routes, django_capture_on_commit_callbacks
):
    hooks.add_target(f"json://127.0.0.1:{receiver.port}/", town=True)
    receiver.plan = [500]
    bead("gt-a")
    action_needed(launched(["gt-a"]), django_capture_on_commit_callbacks)
    row = WebhookDelivery.objects.get()
    assert (row.status_code, row.state) == (500, "retrying")
    hooks.deliver_due(row.next_attempt_at)
    row.refresh_from_db()
    assert row.state == "delivered" and len(receiver.requests) == 2


def rebinding(monkeypatch, names):
    """A resolver that answers each of `names` ({host: [addresses, ...]}) with its next
    answer (the last one from then on), and records what it was asked."""
    real = outbound._lookup
    asked = []

    def lookup(host, port, *args, **kwargs):
        asked.append(host)
        if host in names:
            answers = names[host]
            address = answers.pop(0) if len(answers) > 1 else answers[0]
            return real(address, port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(outbound, "_lookup", lookup)
    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    return asked


def test_chat_goes_to_the_address_checked_not_a_second_lookup(
    receiver, routes, monkeypatch, django_capture_on_commit_callbacks
):
    # Checked when added and when sent; a third lookup (Apprise's own) would be answered
    # with an address that is not the one checked.
    asked = rebinding(monkeypatch, {"chat.example": ["127.0.0.1", "127.0.0.1", "192.0.2.1"]})
    hooks.add_target(f"json://chat.example:{receiver.port}/", town=True)
    bead("gt-a")
    action_needed(launched(["gt-a"]), django_capture_on_commit_callbacks)
    assert WebhookDelivery.objects.get().state == "delivered"
    assert len(receiver.requests) == 1
    assert asked.count("chat.example") == 2


def test_a_vendor_chat_host_resolving_to_a_private_address_is_refused(
    routes, settings, monkeypatch, django_capture_on_commit_callbacks
):
    hooks.add_target("ntfy://convoys-topic", town=True)  # the vendor's public ntfy service
    settings.CONVOY_WEBHOOK_ALLOW_PRIVATE = False
    rebinding(monkeypatch, {"ntfy.sh": ["10.9.8.7"]})
    bead("gt-a")
    action_needed(launched(["gt-a"]), django_capture_on_commit_callbacks)
    row = WebhookDelivery.objects.get()
    assert row.state == "retrying"
    assert "10.9.8.7 is a private address" in row.error


def test_chat_follows_no_redirect(
    receiver, second_receiver, routes, django_capture_on_commit_callbacks
):
    hooks.add_target(f"json://127.0.0.1:{receiver.port}/", town=True)
    receiver.plan = [("redirect", second_receiver.url + "/elsewhere")]
    bead("gt-a")
    action_needed(launched(["gt-a"]), django_capture_on_commit_callbacks)
    assert WebhookDelivery.objects.get().state == "retrying"
    assert len(receiver.requests) == 1 and second_receiver.requests == []


# --- manage.py hooks ------------------------------------------------------------------------------
def refused(*args):
    with pytest.raises(CommandError) as caught:
        call_command(*args, stdout=io.StringIO(), stderr=io.StringIO())
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_hooks_add_prints_the_id_and_a_generated_secret(receiver, routes):
    out = command("hooks", "add", receiver.url, "--town", "--kinds", "landed,at-risk")
    target = WebhookTarget.objects.get()
    assert f"Added target {target.pk}" in out and "landed,at-risk" in out
    assert f"secret: {target.secret}" in out and target.secret.startswith("whsec_")
    user_with("alice", "view_convoy")
    out = command("hooks", "add", receiver.url, "--user", "alice", "--secret", target.secret)
    assert "secret:" not in out
    assert WebhookTarget.objects.filter(scope="user", user__username="alice").exists()
    bead("gt-a")
    convoy = launched(["gt-a"])
    command("hooks", "add", receiver.url, "--convoy", convoy.pk)
    assert WebhookTarget.objects.filter(scope="convoy", convoy=convoy).exists()


def test_hooks_add_of_a_chat_url_makes_no_secret_and_takes_none(receiver):
    chat = f"json://127.0.0.1:{receiver.port}/"
    out = command("hooks", "add", chat, "--town")
    assert "(town):" in out and "secret" not in out
    assert WebhookTarget.objects.get().secret == ""
    problem = refused("hooks", "add", chat, "--town", "--secret", "whsec_" + "A" * 32)
    assert "a chat URL takes no secret" in problem
    assert WebhookTarget.objects.count() == 1


@pytest.mark.parametrize(
    "args, problem",
    [
        (["--town", "--kinds", "landed,exploded"], "unknown kind 'exploded'"),
        (["--user", "nobody"], "user 'nobody' not found"),
        (["--convoy", "hq-cv-nope"], "convoy 'hq-cv-nope' not found"),
        (["--town", "--secret", "whsec_!!"], "base64"),
    ],
)
def test_hooks_add_refuses_bad_input_in_one_line_and_saves_nothing(receiver, args, problem):
    assert problem in refused("hooks", "add", receiver.url, *args)
    assert not WebhookTarget.objects.exists()


def test_hooks_add_refuses_a_bad_url_and_a_private_address(settings):
    assert "is not a URL" in refused("hooks", "add", "example.com", "--town")
    settings.CONVOY_WEBHOOK_ALLOW_PRIVATE = False
    assert "loopback" in refused("hooks", "add", "http://127.0.0.1:8000/x", "--town")
    assert not WebhookTarget.objects.exists()


def test_hooks_list_and_remove(receiver):
    assert command("hooks", "list") == "No targets.\n"
    target = hooks.add_target(receiver.url, town=True, kinds="merged").target
    assert receiver.url in command("hooks", "list")
    (row,) = json.loads(command("hooks", "list", "--json"))
    assert (row["id"], row["scope"], row["kinds"], row["chat"]) == (
        target.pk,
        "town",
        ["merged"],
        False,
    )
    assert "secret" not in row
    assert f"Removed target {target.pk}" in command("hooks", "remove", str(target.pk))
    assert not WebhookTarget.objects.exists()
    assert "webhook target 99 not found" in refused("hooks", "remove", "99")


def test_hooks_test_sends_now_and_prints_status_and_latency(receiver):
    added = hooks.add_target(receiver.url, town=True)
    out = command("hooks", "test", str(added.target.pk))
    assert out.startswith("Delivered: status 200, ") and out.strip().endswith("ms")
    assert verified(receiver, added.secret)[0]["type"] == "webhook.test"
    receiver.plan = [500]
    assert "status 500" in refused("hooks", "test", str(added.target.pk))
    assert "not found" in refused("hooks", "test", "99")


def test_hooks_deliveries_shows_time_status_latency_attempts_and_body(receiver):
    added = hooks.add_target(receiver.url, town=True)
    pk = str(added.target.pk)
    assert command("hooks", "deliveries", pk) == "No deliveries.\n"
    command("hooks", "test", pk)
    out = command("hooks", "deliveries", pk)
    assert "status 200" in out and "attempts 1" in out and '"type":"webhook.test"' in out
    (row,) = json.loads(command("hooks", "deliveries", pk, "--json"))
    assert (row["status_code"], row["attempts"], row["state"]) == (200, 1, "delivered")
    assert row["latency_ms"] >= 0 and row["body"]["type"] == "webhook.test"
    assert "not found" in refused("hooks", "deliveries", "99")
