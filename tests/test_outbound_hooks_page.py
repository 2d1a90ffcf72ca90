"""The Subscriptions page's "Webhooks and chat" card, without a browser: a user's own
targets with their deliveries, the test and redeliver buttons, adding one, and who may
manage which target."""

import re

import pytest
from standardwebhooks import Webhook

from convoys.models import WebhookDelivery, WebhookTarget
from convoys.services import hooks

from .support.factories import bead, launched
from .support.users import logged_in, user_with

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _hook_settings(settings):
    settings.CONVOY_WEBHOOK_ALLOW_PRIVATE = True  # the receiver listens on 127.0.0.1
    settings.CONVOY_WEBHOOK_TIMEOUT = 0.5


def card(client):
    response = client.get("/subscriptions/")
    assert response.status_code == 200
    html = response.content.decode()
    start = html.index('id="hooks-card"')
    return html[start : html.index("</section>", start)]


def flash(response):
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_the_card_lists_my_targets_with_their_deliveries(receiver):
    alice = user_with("alice", "view_convoy")
    mine = hooks.add_target(receiver.url + "/mine", user=alice, kinds="landed,merged")
    hooks.send_test(mine.target)
    bob = user_with("bob", "view_convoy")
    hooks.add_target(receiver.url + "/bobs", user=bob)
    hooks.add_target(receiver.url + "/town", town=True)
    html = card(logged_in(alice))
    assert "Webhooks and chat" in html
    assert receiver.url + "/mine" in html and "landed, merged" in html
    assert "/bobs" not in html and "/town" not in html  # not hers to manage
    row = WebhookDelivery.objects.get()
    assert "webhook.test" in html  # the body, in a <details>
    assert re.search(r"<td>200 delivered</td>", html)
    assert f"<td>{row.attempts}</td>" in html and " ms</td>" in html
    assert f'action="/subscriptions/deliveries/{row.pk}/redeliver/"' in html
    assert f'action="/subscriptions/hooks/{mine.target.pk}/test/"' in html
    assert mine.secret not in html  # the secret is never shown again


def test_an_operator_also_sees_the_convoys_and_the_towns_targets(receiver, routes):
    olga = user_with("olga", "view_convoy", "change_convoy")
    bead("gt-a")
    convoy = launched(["gt-a"])
    hooks.add_target(receiver.url + "/convoy", convoy_id=convoy.pk)
    hooks.add_target(receiver.url + "/town", town=True)
    html = card(logged_in(olga))
    assert "/convoy" in html and "/town" in html and "the whole town" in html


def test_send_a_test_posts_a_signed_test_event(receiver):
    alice = user_with("alice", "view_convoy")
    added = hooks.add_target(receiver.url, user=alice)
    client = logged_in(alice, csrf=False)
    response = client.post(f"/subscriptions/hooks/{added.target.pk}/test/", follow=True)
    assert any("Delivered to target" in m and "status 200" in m for m in flash(response))
    ((_, _, headers, body, _),) = receiver.requests
    assert Webhook(added.secret).verify(body, headers)["type"] == "webhook.test"


def test_redeliver_sends_the_same_body_and_id_again(receiver):
    alice = user_with("alice", "view_convoy")
    added = hooks.add_target(receiver.url, user=alice)
    receiver.plan = [500]
    row = hooks.send_test(added.target)
    assert row.state == "retrying"
    response = logged_in(alice).post(f"/subscriptions/deliveries/{row.pk}/redeliver/", follow=True)
    assert any("Delivered" in m for m in flash(response))
    row.refresh_from_db()
    assert (row.attempts, row.state) == (2, "delivered")
    first, second = receiver.requests
    assert first[3] == second[3] and first[2]["webhook-id"] == second[2]["webhook-id"]
    assert "2</td>" in card(logged_in(alice))


def test_nobody_manages_someone_elses_target(receiver):
    alice = user_with("alice", "view_convoy")
    mallory = user_with("mallory", "view_convoy")
    added = hooks.add_target(receiver.url, user=alice)
    row = hooks.send_test(added.target)
    client = logged_in(mallory)
    assert client.post(f"/subscriptions/hooks/{added.target.pk}/test/").status_code == 403
    assert client.post(f"/subscriptions/hooks/{added.target.pk}/remove/").status_code == 403
    assert client.post(f"/subscriptions/deliveries/{row.pk}/redeliver/").status_code == 403
    assert len(receiver.requests) == 1 and WebhookTarget.objects.count() == 1


def test_the_towns_target_needs_change_convoy(receiver):
    town = hooks.add_target(receiver.url, town=True).target
    viewer_client = logged_in(user_with("vera", "view_convoy"))
    assert viewer_client.post(f"/subscriptions/hooks/{town.pk}/test/").status_code == 403
    operator = logged_in(user_with("olga", "view_convoy", "change_convoy"))
    assert operator.post(f"/subscriptions/hooks/{town.pk}/test/").status_code == 302
    assert len(receiver.requests) == 1


def test_adding_my_own_target_shows_its_secret_once(receiver):
    alice = user_with("alice", "view_convoy")
    client = logged_in(alice)
    response = client.post(
        "/subscriptions/hooks/", {"url": receiver.url, "kinds": ["landed", "at-risk"]}, follow=True
    )
    target = WebhookTarget.objects.get()
    assert (target.scope, target.user, target.kinds) == ("user", alice, ",landed,at-risk,")
    assert any(target.secret in m for m in flash(response))
    assert target.secret not in card(client)


def test_a_refused_url_is_said_on_the_page_and_nothing_is_added(settings):
    settings.CONVOY_WEBHOOK_ALLOW_PRIVATE = False
    client = logged_in(user_with("alice", "view_convoy"))
    response = client.post("/subscriptions/hooks/", {"url": "http://127.0.0.1:9/"}, follow=True)
    assert any("loopback" in m for m in flash(response))
    response = client.post(
        "/subscriptions/hooks/", {"url": "https://example.com/", "kinds": ["nope"]}, follow=True
    )
    assert any("unknown kind 'nope'" in m for m in flash(response))
    assert not WebhookTarget.objects.exists()


def test_the_page_has_csrf_protected_forms_and_no_inline_script_or_style(receiver):
    alice = user_with("alice", "view_convoy")
    hooks.send_test(hooks.add_target(receiver.url, user=alice).target)
    html = card(logged_in(alice))
    assert html.count("<form") == html.count("csrfmiddlewaretoken") >= 4
    assert "<script" not in html and "style=" not in html
    client = logged_in(alice, csrf=True)
    target = WebhookTarget.objects.get()
    assert client.post(f"/subscriptions/hooks/{target.pk}/test/").status_code == 403
