"""The convoy page's one action bar: what the convoy's state allows, each field labelled for
its action, close apart and confirmed, no command-line words; the subscription line follows
the convoy to its landing, live and on a reload alike."""

import re

import pytest

from convoys.models import Convoy
from convoys.services import beads, feeding, launch, staging

from .support.factories import bead, blocks, child
from .support.users import signed_in

FLAGS = re.compile(r"--[a-z]|CONVOY_[A-Z_]+|manage\.py")


@pytest.fixture
def convoy_id(routes):
    bead("gt-root", "Root", type="epic")
    for bead_id in ("gt-a", "gt-b"):
        bead(bead_id)
        child("gt-root", bead_id)
    blocks("gt-a", "gt-b")
    return staging.stage(["gt-root"], actor="test").convoy_id


def bar(client, convoy_id, **headers):
    if headers:
        return client.get(f"/convoys/{convoy_id}/", headers=headers).json()["fragments"][
            "convoy-actions"
        ]
    html = client.get(f"/convoys/{convoy_id}/").content.decode()
    start = html.index('<section class="action-bar"')
    return html[start : html.index("</section>", start) + len("</section>")]


def same(html):
    """The markup without its CSRF tokens (masked afresh for every answer)."""
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", html).strip()


def buttons(html):
    return re.findall(r"<button[^>]*>([^<]+)</button>", html)


def test_the_bar_offers_what_the_state_allows_in_words(convoy_id):
    operator = signed_in("op", "view_convoy", "view_bead", "change_convoy")
    staged = bar(operator, convoy_id)
    assert buttons(staged) == ["Launch", "Check again", "Pause", "Add", "Subscribe", "Close convoy"]
    launch.launch([convoy_id], actor="test")
    opened = bar(operator, convoy_id)
    assert buttons(opened) == ["Check", "Pause", "Add", "Subscribe", "Close convoy"]
    # Each field is labelled for its own action; close is apart, confirmed, and counts.
    assert "Reason for pausing <input" in opened and "Reason for closing <input" in opened
    assert "Beads to add <input" in opened
    danger = opened[opened.index('<details class="danger-zone">') :]
    assert "Close convoy" in danger and "Pause" not in danger
    assert re.search(
        r'name="force" value="1" required> Yes, close it with its 2 unfinished beads', danger
    )
    page = operator.get(f"/convoys/{convoy_id}/").content.decode()
    assert not FLAGS.search(re.sub(r"<script.*?</script>", "", page, flags=re.S)), FLAGS.findall(
        page
    )
    # A viewer sees only what they may do.
    viewer = signed_in("vi", "view_convoy", "view_bead")
    assert buttons(bar(viewer, convoy_id)) == ["Subscribe"]


def test_a_refused_close_says_what_to_do_in_page_words(convoy_id):
    launch.launch([convoy_id], actor="test")
    operator = signed_in("op", "view_convoy", "view_bead", "change_convoy")
    answer = operator.post(f"/convoys/{convoy_id}/close/", {"reason": "stop"}, follow=True)
    text = answer.content.decode()
    assert "convoy has 2 open issue(s)" in text and "tick the confirmation to close anyway" in text
    assert "--force" not in text
    assert Convoy.objects.get(pk=convoy_id).status == "open"
    operator.post(f"/convoys/{convoy_id}/close/", {"reason": "stop", "force": "1"})
    assert Convoy.objects.get(pk=convoy_id).status == "closed"
    closed = bar(operator, convoy_id)
    assert "Closed" in closed and "without landing" in closed
    assert buttons(closed) == ["Add"]  # adding beads reopens it, and says so
    assert "Beads to add (reopens it)" in closed


def test_the_subscription_line_follows_the_landing(convoy_id):
    launch.launch([convoy_id], actor="test")
    subscriber = signed_in("sub", "view_convoy", "view_bead")
    subscriber.post(f"/convoys/{convoy_id}/subscribe/", {"email": "1"})
    assert "You are subscribed: you will be told when it lands, by e-mail too." in bar(
        subscriber, convoy_id
    )
    seq = re.search(r'data-seq="(\d+)"', subscriber.get(f"/convoys/{convoy_id}/").content.decode())
    for bead_id in ("gt-a", "gt-b"):
        beads.close_bead(bead_id, actor="worker")
    feeding.feed_convoy(Convoy.objects.get(pk=convoy_id), "event")
    assert Convoy.objects.get(pk=convoy_id).landed
    live = bar(
        subscriber, convoy_id, **{"X-Live": "1", "X-Live-Since": seq.group(1) if seq else "1"}
    )
    reload = bar(subscriber, convoy_id)
    assert "you were subscribed, so you were told" in reload
    assert "will be told" not in reload
    assert same(live) == same(reload)
    head = subscriber.get(f"/convoys/{convoy_id}/").content.decode()
    assert 'id="convoy-status">landed</span>' in head


def test_a_user_who_hears_about_every_convoy_is_told_so(convoy_id):
    from django.contrib.auth.models import User

    from convoys.services import notify

    fan = signed_in("fan", "view_convoy", "view_bead")
    notify.subscribe(User.objects.get(username="fan"), None)
    shown = bar(fan, convoy_id)
    assert "You hear about every convoy's landing" in shown
    assert buttons(shown) == []  # nothing to subscribe to: they hear already
