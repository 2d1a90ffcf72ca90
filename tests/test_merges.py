"""Landed means merged: a convoy merging by `mr` lands only once its closed beads are merged."""

import html
import json
import re
from collections import Counter
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from convoys.models import Bead, BeadFacts, Convoy, ConvoyFacts, Event, Merge, Notification
from convoys.rules import causes, merging, stranding
from convoys.rules.readiness import ready_among
from convoys.services import convoys, escalation, jsonl, merges, staging
from convoys.services.errors import NeedsForce, NotFound, ServiceError
from convoys.services.merges import Change
from convoys.services.tokens import create_token

from .support.factories import STUCK, bead, blocks, command, launched, started
from .support.pages import as_of, assert_parts_of, live
from .support.paths import FIXTURES, shared_file
from .support.sync import rewrite, run_sync
from .support.users import logged_in, user_with, viewer


def mr_convoy(ids, **fields):
    convoy = launched(ids)
    Convoy.objects.filter(pk=convoy.pk).update(merge_strategy="mr", **fields)
    convoy.refresh_from_db()
    return convoy


def merged(bead_id, ref="abc1234", source="github"):
    return merges.record(bead_id, Change("merged", source, ref=ref, link=f"https://x/{ref}"))


def test_a_closed_bead_under_mr_is_submitted_until_its_merge_lands_the_convoy(
    routes, closing, django_capture_on_commit_callbacks
):
    bead("gt-a")
    bead("gt-b")
    convoy = mr_convoy(["gt-a", "gt-b"])
    closing("gt-a")
    closing("gt-b")
    convoy.refresh_from_db()
    assert convoy.status == "open"
    facts = ConvoyFacts.objects.get(pk=convoy.pk)
    assert (facts.done, facts.submitted) == (0, 2)
    assert facts.code == "merging" and facts.reason == "2 submitted, waiting to merge"
    assert BeadFacts.objects.get(pk="gt-a").segment == "submitted"
    assert convoys.progress(convoys.tracked_details([convoy])[convoy.pk])["submitted"] == 2
    with django_capture_on_commit_callbacks(execute=True):
        assert merged("gt-a")
    convoy.refresh_from_db()
    assert convoy.status == "open"
    facts.refresh_from_db()
    assert (facts.done, facts.submitted) == (1, 1)
    with django_capture_on_commit_callbacks(execute=True):
        assert merged("gt-b", ref="def5678")
    convoy.refresh_from_db()
    assert convoy.status == "closed" and convoy.landed
    notice = Notification.objects.filter(kind="landed").first()
    assert notice is not None
    assert "Merges (2):" in notice.body and "gt-b  def5678 https://x/def5678" in notice.body


def test_direct_and_local_convoys_land_on_the_close(routes, closing):
    for strategy in ("direct", "local", ""):
        bead(f"gt-{strategy or 'none'}")
        convoy = launched([f"gt-{strategy or 'none'}"])
        Convoy.objects.filter(pk=convoy.pk).update(merge_strategy=strategy)
        closing(f"gt-{strategy or 'none'}")
        assert Convoy.objects.get(pk=convoy.pk).status == "closed", strategy


def test_the_default_strategy_comes_from_the_environment(routes, closing, settings):
    settings.CONVOY_MERGE_STRATEGY = "mr"
    bead("gt-a")
    convoy = launched(["gt-a"])
    assert merging.strategy(convoy) == "mr"
    closing("gt-a")
    assert Convoy.objects.get(pk=convoy.pk).status == "open"
    assert BeadFacts.objects.get(pk="gt-a").segment == "submitted"


def test_recording_twice_changes_nothing_and_a_late_open_never_undoes_a_merge(routes, closing):
    bead("gt-a")
    mr_convoy(["gt-a"])
    closing("gt-a")
    assert merged("gt-a")
    seq = Event.objects.latest("seq").seq
    assert not merged("gt-a")
    assert not merges.record("gt-a", Change("open", "github", branch="polecat/x/gt-a"))
    assert Event.objects.latest("seq").seq == seq
    assert Merge.objects.get(pk="gt-a").state == "merged"


def test_an_abandoned_change_reopens_the_bead_and_tells_the_owner(routes, closing):
    bead("gt-a")
    convoy = mr_convoy(["gt-a"], owner="alice")
    closing("gt-a")
    assert merges.record("gt-a", Change("abandoned", "gitlab", reason="Stale MR - cleanup"))
    assert Event.objects.filter(kind="merge.abandoned", bead_id="gt-a").count() == 1
    assert Bead.objects.get(pk="gt-a").status == "open"
    notice = Notification.objects.get(kind="action_needed", convoy_id=convoy.pk)
    assert "gt-a's change was abandoned: Stale MR - cleanup" in notice.subject


def test_bad_changes_are_refused_and_change_nothing(routes):
    bead("gt-a")
    with pytest.raises(NotFound, match="bead 'gt-zz' not found"):
        merged("gt-zz")
    with pytest.raises(ServiceError, match="merge state must be one of"):
        merges.record("gt-a", Change("landed", "github"))
    with pytest.raises(ServiceError, match="merge source must be one of"):
        merges.record("gt-a", Change("merged", "svn"))
    assert not Merge.objects.exists()


def test_land_refuses_while_beads_wait_to_merge_and_says_which(routes, closing):
    bead("gt-a")
    bead("gt-b")
    convoy = mr_convoy(["gt-a", "gt-b"], owned=True)
    closing("gt-a")
    closing("gt-b")
    with pytest.raises(NeedsForce, match="2 bead\\(s\\) waiting to merge: gt-a, gt-b"):
        convoys.land(convoy.pk)
    with pytest.raises(CommandError, match="waiting to merge: gt-a, gt-b"):
        call_command("convoy", "land", convoy.pk)
    assert convoys.land(convoy.pk, force=True).changed


@pytest.mark.parametrize("ref", ["Merged in abc123", "Direct merge to main"])
def test_merge_blocks_waits_for_the_merge_by_any_path(routes, closing, ref):
    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b", "merge-blocks")
    closing("gt-a", reason="Implemented")
    assert ready_among(["gt-b"]) == set()
    merged("gt-a")
    assert ready_among(["gt-b"]) == {"gt-b"}
    bead("gt-c")
    bead("gt-d")
    blocks("gt-c", "gt-d", "merge-blocks")
    closing("gt-c", reason=ref)
    assert ready_among(["gt-d"]) == {"gt-d"}


# --- the bead store ------------------------------------------------------------------------------
def test_an_import_records_merge_requests_and_merged_closes(routes):
    jsonl.import_file(FIXTURES / "merge-requests.jsonl")
    rows = {m.bead_id: (m.state, m.source, m.ref, m.branch, m.target) for m in Merge.objects.all()}
    assert rows == {
        "mq-a": ("merged", "bd", "mq-mr-a", "polecat/nux/mq-a", "main"),
        "mq-b": ("open", "bd", "mq-mr-b", "polecat/toast/mq-b", "main"),
        "mq-c": ("merged", "bd", "Merged in 1a2b3c4", "", ""),
    }
    assert Event.objects.filter(kind="bead.merged").count() == 2
    jsonl.import_file(FIXTURES / "merge-requests.jsonl")  # again: nothing new
    assert Event.objects.filter(kind__in=["bead.merged", "merge.opened"]).count() == 3


def test_a_convoy_under_mr_lands_when_the_synced_store_merges_its_last_bead(
    routes, tmp_path, django_capture_on_commit_callbacks
):
    path = tmp_path / "town.jsonl"
    path.write_bytes((FIXTURES / "merge-requests.jsonl").read_bytes())
    run_sync(path)
    convoy = convoys.create("Merge me", ["mq-a", "mq-b"], merge="mr", actor="test")
    assert convoys.check(convoy.pk)[0].progress["submitted"] == 1
    assert Convoy.objects.get(pk=convoy.pk).status == "open"
    assert BeadFacts.objects.get(pk="mq-b").segment == "submitted"
    rewrite(
        path,
        "mq-mr-b",
        status="closed",
        updated_at="2026-11-01T13:00:00Z",
        closed_at="2026-11-01T13:00:00Z",
        close_reason="Branch already merged",
    )
    run_sync(path, capture=django_capture_on_commit_callbacks)
    assert Merge.objects.get(pk="mq-b").state == "merged"
    convoy.refresh_from_db()
    assert convoy.status == "closed" and convoy.landed


def test_every_merge_request_of_the_real_export_has_an_outcome_by_the_settings(db, capsys):
    counts = {"merged": 0, "abandoned": 0, "undecided": 0, "open": 0}
    undecided = []
    for line in shared_file("steveyegge+gastown+issues.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("issue_type") != "merge-request":
            continue
        if record.get("status") != "closed":
            counts["open"] += 1
            continue
        outcome = merging.outcome_of(record.get("close_reason") or "") or "undecided"
        counts[outcome] += 1
        if outcome == "undecided" and record.get("close_reason"):
            undecided.append(record["close_reason"][:60])
    with capsys.disabled():
        print(f"\nreal export's merge requests by outcome: {counts}; undecided: {undecided}")
    assert sum(counts.values()) == 336
    assert counts["merged"] >= 150 and counts["abandoned"] >= 60
    # What is left undecided is a review verdict or no reason at all, never a merge's words.
    assert all("merged" not in reason.lower() for reason in undecided)


def test_the_real_export_imports_its_merges(routes):
    jsonl.import_file(shared_file("steveyegge+gastown+issues.jsonl"))
    states = Counter(Merge.objects.values_list("state", flat=True))
    assert states["merged"] > 0
    assert Merge.objects.filter(source="bd", ref__startswith="gt-").exists() or states["merged"]


# --- the convoy page -----------------------------------------------------------------------------
def test_the_convoy_page_shows_submitted_beads_and_the_merge_queue_live(
    routes, closing, django_capture_on_commit_callbacks
):
    bead("gt-a", "Parser")
    bead("gt-b", "Printer")
    blocks("gt-a", "gt-b", "merge-blocks")
    convoy = mr_convoy(["gt-a", "gt-b"])
    closing("gt-a")
    merges.record(
        "gt-a",
        Change("open", "github", ref="PR #7", link="https://forge/pr/7", branch="polecat/nux/gt-a"),
    )
    client = logged_in(viewer("vera"))
    url = f"/convoys/{convoy.pk}/"
    page = client.get(url).content.decode()
    assert 'id="merge-strategy">mr<' in page
    assert '<span class="submitted-count">1</span> submitted, waiting to merge' in page
    queue = re.search(r'<div id="merge-queue">.*?</div>\s*$', page, re.S | re.M)
    assert queue and "0 merged · 1 submitted, waiting to merge" in queue.group(0)
    assert '<a href="https://forge/pr/7" rel="noopener noreferrer">PR #7</a>' in page
    assert "<code>polecat/nux/gt-a</code>" in page
    assert 'class="node st-submitted"' in page or "st-submitted" in page
    assert 'class="edge merge"' in page and "waits for a merge (merge-blocks)" in page
    assert '<td class="c-submitted">1</td>' in page
    seq = as_of(page)
    with django_capture_on_commit_callbacks(execute=True):
        merged("gt-a", ref="9f8e7d6")
    fragments = live(client, url, since=seq)["fragments"]
    assert "1 merged · 0 submitted" in fragments["merge-queue"]
    fresh = client.get(url).content.decode()
    assert_parts_of(fresh, fragments)
    assert Bead.objects.get(pk="gt-b").status == "hooked"  # the merge fed what it unblocked


def test_a_direct_convoy_page_has_no_merge_queue(routes, closing):
    bead("gt-a")
    convoy = launched(["gt-a"])
    page = logged_in(viewer("vera")).get(f"/convoys/{convoy.pk}/").content.decode()
    assert '<div id="merge-queue"></div>' in page and 'id="merge-strategy">direct<' in page
    assert "c-submitted" not in page


# --- the API and the command line ----------------------------------------------------------------
def api(token, method, url, body=None):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if method == "get":
        return Client().get(url, **auth)
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return Client().post(url, data=data, content_type="application/json", **auth)


@pytest.fixture
def operator_token(routes):
    return create_token(user_with("otto", "view_convoy", "change_bead", "add_convoy"), "merges")


def test_a_tool_reports_a_merge_through_the_api_and_the_convoy_lands(
    operator_token, closing, django_capture_on_commit_callbacks
):
    bead("gt-a")
    convoy = mr_convoy(["gt-a"])
    closing("gt-a")
    detail = api(operator_token, "get", f"/api/convoys/{convoy.pk}").json()
    assert detail["merge_strategy"] == "mr" and detail["progress"]["submitted"] == 1
    assert detail["tracked"][0]["status"] == "submitted"
    with django_capture_on_commit_callbacks(execute=True):
        answer = api(
            operator_token,
            "post",
            "/api/beads/gt-a/merge",
            {"state": "merged", "ref": "abc", "link": "https://forge/c/abc"},
        )
    assert answer.status_code == 200, answer.content
    assert answer.json()["changed"] and answer.json()["merge"]["state"] == "merged"
    assert Convoy.objects.get(pk=convoy.pk).status == "closed"
    detail = api(operator_token, "get", f"/api/convoys/{convoy.pk}").json()
    assert detail["tracked"][0]["merge"] == {
        "state": "merged",
        "ref": "abc",
        "link": "https://forge/c/abc",
        "source": "api",
        "branch": "",
        "target": "",
        "ci": "",
        "reason": "",
    }
    again = api(operator_token, "post", "/api/beads/gt-a/merge", {"state": "merged", "ref": "abc"})
    assert again.json()["changed"] is False


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"state": "landed"}, 422),
        ({"state": "merged", "ref": 12}, 422),
        ({"state": "merged", "ref": "x" * 300}, 422),
        ({"state": "merged", "extra": 1}, 422),
        ("[1, 2]", 422),
        ("not json", 400),
        ({"state": "merged", "reason": "x" * 3_000_000}, 413),
    ],
    ids=["state", "type", "long", "unknown-key", "list", "not-json", "huge"],
)
def test_hostile_merge_reports_are_refused_and_change_nothing(operator_token, body, status):
    bead("gt-a")
    answer = api(operator_token, "post", "/api/beads/gt-a/merge", body)
    assert answer.status_code == status, answer.content
    assert "detail" in answer.json()
    assert not Merge.objects.exists()


def test_merge_reports_need_change_bead_and_a_known_bead(operator_token):
    reader = create_token(user_with("vera", "view_convoy"), "reader")
    bead("gt-a")
    assert api(reader, "post", "/api/beads/gt-a/merge", {"state": "merged"}).status_code == 403
    missing = api(operator_token, "post", "/api/beads/gt-nope/merge", {"state": "merged"})
    assert missing.status_code == 404 and missing.json() == {"detail": "bead 'gt-nope' not found"}
    assert not Merge.objects.exists()


def test_the_command_line_stages_under_mr_reports_merges_and_shows_them(routes, closing):
    bead("gt-a")
    bead("gt-b")
    staged = json.loads(command("convoy", "stage", "gt-a", "gt-b", "--merge", "mr", "--json"))
    convoy_id = staged["convoy_id"]
    assert Convoy.objects.get(pk=convoy_id).merge_strategy == "mr"
    command("convoy", "launch", convoy_id, "--force")
    closing("gt-a")
    closing("gt-b")
    assert "gt-a: submitted, waiting to merge" in command(
        "beads", "merge", "gt-a", "open", "--branch", "polecat/nux/gt-a"
    )
    status = command("convoy", "status", convoy_id)
    assert "0/2 done · 2 submitted, waiting to merge" in status and "Merge: mr" in status
    assert "◐ gt-a" in status and "polecat/nux/gt-a" in status
    assert "gt-a: merged" in command("beads", "merge", "gt-a", "merged", "--ref", "abc")
    assert "already merged" in command("beads", "merge", "gt-a", "merged")
    with pytest.raises(CommandError, match="invalid choice: 'landed'"):
        command("beads", "merge", "gt-a", "landed")
    with pytest.raises(CommandError, match='invalid --merge value "fast"'):
        command("convoy", "stage", "gt-a", "--merge", "fast")


def test_the_stage_page_stages_under_the_merge_strategy_chosen(routes):
    bead("gt-a")
    client = logged_in(user_with("olga", "view_convoy", "add_convoy", "change_convoy"))
    preview = client.get("/stage/?ids=gt-a").content.decode()
    assert '<option value="mr">mr: done once its change is merged</option>' in preview
    answer = client.post("/stage/", {"ids": "gt-a", "do": "stage", "merge": "mr"})
    assert answer.status_code == 302
    assert Convoy.objects.get().merge_strategy == "mr"
    refused = client.post("/stage/", {"ids": "gt-a", "do": "stage", "merge": "sideways"})
    assert 'invalid --merge value "sideways"' in html.unescape(refused.content.decode())
    assert Convoy.objects.get().merge_strategy == "mr"


def test_the_dashboard_counts_submitted_beads(routes, closing):
    bead("gt-a")
    bead("gt-b")
    mr_convoy(["gt-a", "gt-b"])
    closing("gt-a")
    page = logged_in(viewer("vera")).get("/").content.decode()
    assert (
        '<span class="submitted-count" title="closed, waiting to merge">◐ 1 submitted</span>'
        in page
    )


def test_a_convoy_stuck_on_merges_alone_escalates_as_waiting_to_merge(routes, closing):
    bead("gt-a")
    convoy = mr_convoy(["gt-a"], owner="alice")
    closing("gt-a")
    merges.record("gt-a", Change("open", "gitlab", ref="!12", branch="polecat/nux/gt-a"))
    cause = causes.for_bead("gt-a")
    assert cause["kind"] == "waiting-to-merge"
    assert cause["text"] == "!12 polecat/nux/gt-a"
    assert ConvoyFacts.objects.get(pk=convoy.pk).causes == {"waiting-to-merge": 1}
    sent = escalation.escalate_stuck(now=started(convoy) + STUCK + timedelta(minutes=1))
    assert [s["id"] for s in sent] == [convoy.pk]
    notice = Notification.objects.get(kind="escalation", convoy_id=convoy.pk)
    assert notice.subject.startswith("⚠ Convoy waiting to merge for ")
    assert "gt-a (waiting to merge): !12 polecat/nux/gt-a" in notice.body


def test_a_merge_is_progress_for_the_escalation_clock(routes, closing):
    bead("gt-a")
    bead("gt-b")
    convoy = mr_convoy(["gt-a", "gt-b"])
    closing("gt-a")
    closing("gt-b")
    merged("gt-a")
    merged_at = Event.objects.get(kind="bead.merged").created_at
    assert escalation.last_progress([convoy])[convoy.pk] == merged_at


def test_the_bead_page_shows_a_submitted_bead_and_its_change(routes, closing):
    bead("gt-a")
    mr_convoy(["gt-a"])
    closing("gt-a")
    merges.record("gt-a", Change("open", "gitea", ref="#3", link="https://forge/3", ci="pending"))
    page = html.unescape(logged_in(viewer("vera")).get("/beads/gt-a/").content.decode())
    assert '<dd class="b-status">submitted, waiting to merge</dd>' in page
    assert 'submitted · <a href="https://forge/3" rel="noopener noreferrer">#3</a>' in page
    assert "CI pending" in page and "waiting to merge" in page


def test_staging_puts_a_merge_blocked_bead_in_a_later_wave(routes):
    bead("gt-a")
    bead("gt-b")
    blocks("gt-a", "gt-b", "merge-blocks")
    plan = staging.analyze(["gt-a", "gt-b"])
    assert plan.waves == [["gt-a"], ["gt-b"]]


def test_causes_say_what_waits_for_a_merge_and_what_was_abandoned(routes, closing):
    bead("gt-a")
    bead("gt-b")
    bead("gt-c")
    blocks("gt-a", "gt-b", "merge-blocks")
    blocks("gt-c", "gt-b")
    mr_convoy(["gt-a", "gt-b", "gt-c"])
    closing("gt-a")
    assert causes.for_bead("gt-b")["text"] == "blocked by gt-c; waits for gt-a to merge"
    closing("gt-c")
    assert causes.for_bead("gt-b")["text"] == "waits for gt-a to merge"
    merges.record("gt-a", Change("abandoned", "github", reason="closed without merge"))
    cause = causes.for_bead("gt-a")  # reopened: it needs work again, and says why
    assert cause["abandoned"] == "closed without merge"
    assert cause["text"].endswith("(its change was abandoned: closed without merge)")


def test_a_convoy_whose_work_waits_on_a_merge_is_stuck_waiting_on_merges(routes, closing):
    bead("gt-b0")
    bead("gt-b1")
    blocks("gt-b0", "gt-b1", "merge-blocks")
    convoy = mr_convoy(["gt-b0", "gt-b1"])
    closing("gt-b0")
    for verdict in (
        stranding.classify_one(Convoy.objects.get(pk=convoy.pk)),
        ConvoyFacts.objects.get(pk=convoy.pk),
    ):
        assert verdict.code == "merging", verdict
        assert verdict.reason == "gt-b0, gt-b1 waiting on merges"
    page = logged_in(viewer("vera")).get(f"/convoys/{convoy.pk}/").content.decode()
    assert "waiting on merges" in page and "dependency cycle" not in page
    assert "on hold" not in page


def test_a_merge_stays_merged_when_a_later_request_for_it_is_cleaned_up(routes, tmp_path):
    lines = (FIXTURES / "merge-requests.jsonl").read_text().splitlines()
    lines.append(
        json.dumps(
            {
                "id": "mq-mr-a2",
                "title": "Merge: mq-a again",
                "description": "branch: polecat/nux/mq-a\ntarget: main\nsource_issue: mq-a",
                "status": "closed",
                "priority": 2,
                "issue_type": "merge-request",
                "created_at": "2026-11-01T12:00:00Z",
                "updated_at": "2026-11-01T14:00:00Z",
                "closed_at": "2026-11-01T14:00:00Z",
                "close_reason": "Stale MR - cleanup",
            }
        )
    )
    town = tmp_path / "town.jsonl"
    town.write_text("\n".join(lines) + "\n")
    jsonl.import_file(town)
    assert Merge.objects.get(pk="mq-a").state == "merged"
    before = Event.objects.count()
    jsonl.import_file(town)  # again: nothing toggles
    assert Event.objects.count() == before
