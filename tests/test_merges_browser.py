"""In Chromium: a convoy merging by mr shows its merge queue, which follows a forge's webhook
live (submitted, then merged), and the convoy lands with the last merge: the page equals a
reload at each step and the subscriber's inbox toasts the landing."""

import hashlib
import hmac
import json

import pytest
from django.test import Client

from convoys.models import Convoy
from convoys.services import beads, convoys, merges, notify
from convoys.services.merges import Change

from .support.browser import login, shot, wait_js, wait_live
from .support.factories import bead
from .support.pages import assert_live_equals_reload
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
SECRET = "browser-test-secret"


def github(action, number, branch, merged=False):
    body = json.dumps(
        {
            "action": action,
            "number": number,
            "pull_request": {
                "number": number,
                "title": f"Work for {branch}",
                "body": "",
                "html_url": f"https://forge.example/pr/{number}",
                "merged": merged,
                "merge_commit_sha": "a1b2c3d" if merged else None,
                "head": {"ref": branch},
                "base": {"ref": "main"},
            },
        }
    ).encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    answer = Client().post(
        "/hooks/github",
        data=body,
        content_type="application/json",
        headers={
            "X-Hub-Signature-256": signature,
            "X-GitHub-Event": "pull_request",
            "X-GitHub-Delivery": f"{action}-{number}-{merged}",
        },
    )
    assert answer.status_code == 200, answer.content


def test_the_merge_queue_follows_a_forge_live_and_the_convoy_lands(
    browser, server, routes, settings
):
    settings.CONVOY_GITHUB_SECRET = SECRET
    alice = full_staff("alice")
    bead("gt-m1", "Parser")
    bead("gt-m2", "Printer")
    convoy = convoys.create("Merge me", ["gt-m1", "gt-m2"], owner="alice", merge="mr")
    notify.subscribe(alice, convoy)
    beads.close_bead("gt-m1", reason="Implemented")
    ctx, page = login(browser, server, "alice")
    pages = {"convoy": page}
    page.goto(server + f"/convoys/{convoy.pk}/")
    wait_live(page)
    assert "1 submitted, waiting to merge" in page.inner_text("#merge-queue")

    github("opened", 7, "polecat/nux/gt-m1")
    wait_js(page, "document.getElementById('merge-queue').textContent.includes('PR #7')")
    assert "polecat/nux/gt-m1" in page.inner_text("#merge-queue")
    assert_live_equals_reload(pages, "the pull request opened")

    beads.close_bead("gt-m2", reason="Implemented")
    merges.record("gt-m2", Change("merged", "cli", ref="f00d"))
    wait_js(page, "document.getElementById('merge-queue').textContent.includes('1 merged')")
    assert_live_equals_reload(pages, "the second bead merged")
    shot(page, "merge-queue")

    github("closed", 7, "polecat/nux/gt-m1", merged=True)
    wait_js(page, "document.getElementById('convoy-status').textContent.includes('landed')")
    wait_js(
        page,
        "[...document.querySelectorAll('.toast')].some(t => t.textContent.includes('Merge me'))",
    )
    assert Convoy.objects.get(pk=convoy.pk).landed
    assert "2 merged · 0 submitted" in page.inner_text("#merge-queue")
    assert_live_equals_reload(pages, "the last merge landed the convoy")
    ctx.close()
