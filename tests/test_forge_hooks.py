"""Forge webhooks: GitHub, GitLab and Gitea (Forgejo) tell a bead's change was opened, merged
or abandoned, signed each its own way; a replay, an unknown bead or a hostile body changes
nothing it should not."""

import hashlib
import hmac
import json
import logging
import time
from pathlib import Path

import pytest

from convoys.models import Bead, Convoy, Event, ForgeDelivery, Merge

from .support.factories import bead, launched

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "forges"
SECRET = "hook-secret-1"
BRANCH = "polecat/nux/gt-abc12"
URLS = {"github": "/hooks/github", "gitlab": "/hooks/gitlab", "gitea": "/hooks/gitea"}
URLS["forgejo"] = URLS["gitea"]
FORGES = ("github", "gitlab", "gitea", "forgejo")


@pytest.fixture(autouse=True)
def secrets(settings):
    settings.CONVOY_GITHUB_SECRET = SECRET
    settings.CONVOY_GITLAB_TOKEN = SECRET
    settings.CONVOY_GITEA_SECRET = SECRET


@pytest.fixture
def hook_log(caplog):
    """Every warning the request causes, the app's own loggers (not propagated) included."""
    mine = [logging.getLogger("convoys"), logging.getLogger("convoyweb")]
    for logger in mine:
        logger.addHandler(caplog.handler)
    yield lambda: [r for r in caplog.records if r.levelno >= logging.WARNING]
    for logger in mine:
        logger.removeHandler(caplog.handler)


def fixture(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


def pull_request(forge, state="merged", branch=BRANCH, title=None, body=None):
    """A pull (merge) request delivery in `forge`'s format: merged, abandoned or open."""
    if forge == "gitlab":
        data = fixture("gitlab_merge_request")
        mr = data["object_attributes"]
        mr["action"] = {"merged": "merge", "abandoned": "close", "open": "open"}[state]
        mr["state"] = {"merged": "merged", "abandoned": "closed", "open": "opened"}[state]
        mr["source_branch"] = branch
        mr["title"] = title if title is not None else mr["title"]
        mr["description"] = body if body is not None else mr["description"]
        return data
    data = fixture("github_pull_request" if forge == "github" else "gitea_pull_request")
    pr = data["pull_request"]
    data["action"] = "opened" if state == "open" else "closed"
    pr["merged"] = state == "merged"
    pr["state"] = "open" if state == "open" else "closed"
    pr["head"]["ref"] = branch
    pr["title"] = title if title is not None else pr["title"]
    pr["body"] = body if body is not None else pr["body"]
    return data


_deliveries = iter(range(1, 1_000_000))


def post(client, forge, data, *, event=None, delivery=None, signature=None, extra=None):
    """POST `data` (an object, or raw bytes) to the forge's hook, signed with SECRET unless
    `signature` says otherwise ("" leaves it out)."""
    body = data if isinstance(data, bytes) else json.dumps(data).encode()
    delivery = delivery or f"delivery-{next(_deliveries)}"
    digest = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    if forge == "github":
        headers = {"X-GitHub-Event": event or "pull_request", "X-GitHub-Delivery": delivery}
        headers["X-Hub-Signature-256"] = f"sha256={digest}" if signature is None else signature
    elif forge == "gitlab":
        headers = {"X-Gitlab-Event": event or "Merge Request Hook"}
        headers["X-Gitlab-Event-UUID"] = delivery
        headers["X-Gitlab-Token"] = SECRET if signature is None else signature
    else:
        name = "Forgejo" if forge == "forgejo" else "Gitea"
        headers = {f"X-{name}-Event": event or "pull_request", f"X-{name}-Delivery": delivery}
        headers[f"X-{name}-Signature"] = digest if signature is None else signature
    headers = {k: v for k, v in {**headers, **(extra or {})}.items() if v != ""}
    return client.post(URLS[forge], data=body, content_type="application/json", headers=headers)


def mr_convoy(ids):
    convoy = launched(ids)
    Convoy.objects.filter(pk=convoy.pk).update(merge_strategy="mr")
    return convoy


def one_line_json(response):
    assert b"\n" not in response.content.strip()
    return response.json()


# --- merged, abandoned, open ---------------------------------------------------------------------
@pytest.mark.parametrize("forge", FORGES)
def test_a_signed_merge_records_it_and_lands_the_mr_convoy(
    forge, client, routes, closing, django_capture_on_commit_callbacks
):
    bead("gt-abc12")
    convoy = mr_convoy(["gt-abc12"])
    closing("gt-abc12")
    assert Convoy.objects.get(pk=convoy.pk).status == "open"
    with django_capture_on_commit_callbacks(execute=True):
        response = post(client, forge, pull_request(forge), delivery="d-1")
    assert response.status_code == 200
    assert one_line_json(response) == {"recorded": ["gt-abc12"], "beads": ["gt-abc12"]}
    row = Merge.objects.get(pk="gt-abc12")
    source = "gitea" if forge == "forgejo" else forge
    assert (row.state, row.source, row.branch, row.target) == ("merged", source, BRANCH, "main")
    assert row.ref == "1e2a068b5c9d4f1a2b3c4d5e6f708192a3b4c5d6"
    assert row.link.startswith("https://") and row.link.endswith(("/pull/42", "/7", "/12"))
    landed = Convoy.objects.get(pk=convoy.pk)
    assert landed.status == "closed" and landed.landed
    delivery = ForgeDelivery.objects.get(forge=source, delivery="d-1")
    assert delivery.outcome == "merged: gt-abc12; changed gt-abc12"
    actor = Event.objects.get(kind="bead.merged", bead_id="gt-abc12").actor
    assert actor == f"{source}:mayor"


@pytest.mark.parametrize("forge", FORGES)
def test_closed_without_merge_abandons_the_change_and_reopens_the_bead(
    forge, client, routes, closing
):
    bead("gt-abc12")
    mr_convoy(["gt-abc12"])
    closing("gt-abc12")
    response = post(client, forge, pull_request(forge, "abandoned"))
    assert response.status_code == 200 and response.json()["recorded"] == ["gt-abc12"]
    row = Merge.objects.get(pk="gt-abc12")
    assert (row.state, row.reason) == ("abandoned", "closed without merge")
    assert Bead.objects.get(pk="gt-abc12").status == "open"


@pytest.mark.parametrize("forge", ("github", "gitlab", "gitea"))
def test_an_opened_change_is_recorded_open_with_its_number(forge, client, routes):
    bead("gt-abc12")
    response = post(client, forge, pull_request(forge, "open"))
    assert response.status_code == 200
    row = Merge.objects.get(pk="gt-abc12")
    assert row.state == "open"
    assert row.ref == {"github": "PR #42", "gitlab": "MR !7", "gitea": "PR #12"}[forge]


def test_github_open_actions_and_an_edit_of_an_open_pull_request(client, routes):
    bead("gt-abc12")
    for action in ("opened", "reopened", "synchronize", "ready_for_review"):
        data = pull_request("github", "open")
        data["action"] = action
        assert post(client, "github", data).status_code == 200, action
    edited = pull_request("github", "open", title="gt-abc12 and bd-later1")
    edited["action"] = "edited"
    bead("bd-later1")
    assert post(client, "github", edited).json()["recorded"] == ["bd-later1"]
    edited["pull_request"]["state"] = "closed"
    assert post(client, "github", edited).json() == {"ignored": "pull_request action 'edited'"}


def test_a_gitlab_update_of_a_closed_merge_request_is_ignored(client, routes):
    bead("gt-abc12")
    data = pull_request("gitlab", "abandoned")
    data["object_attributes"]["action"] = "update"
    response = post(client, "gitlab", data)
    assert response.status_code == 202 and response.json() == {
        "ignored": "merge request action 'update'"
    }
    assert not Merge.objects.exists()


# --- CI ------------------------------------------------------------------------------------------
def test_a_completed_check_suite_sets_the_ci_of_its_pull_requests_bead(client, routes):
    bead("gt-abc12")
    post(client, "github", pull_request("github", "open"))
    suite = fixture("github_check_suite")
    suite["check_suite"]["conclusion"] = "failure"
    response = post(client, "github", suite, event="check_suite")
    assert response.status_code == 200 and response.json()["recorded"] == ["gt-abc12"]
    row = Merge.objects.get(pk="gt-abc12")
    assert (row.state, row.ci, row.ref) == ("open", "failure", "PR #42")
    suite["action"] = "requested"
    assert post(client, "github", suite, event="check_suite").status_code == 202


def test_a_gitlab_pipeline_sets_the_ci_by_its_branch_or_its_merge_request(client, routes):
    bead("gt-abc12")
    bead("gt-def34")
    pipeline = fixture("gitlab_pipeline")
    pipeline["object_attributes"]["status"] = "running"
    response = post(client, "gitlab", pipeline, event="Pipeline Hook")
    assert response.json() == {"recorded": ["gt-abc12"], "beads": ["gt-abc12"]}
    assert Merge.objects.get(pk="gt-abc12").ci == "running"
    pipeline["object_attributes"]["ref"] = "refs/merge-requests/8/head"
    pipeline["merge_request"] = {
        "iid": 8,
        "title": "Second change",
        "source_branch": "polecat/slit/gt-def34",
        "target_branch": "main",
        "url": "https://gitlab.example.com/gastown/rig/-/merge_requests/8",
    }
    post(client, "gitlab", pipeline, event="Pipeline Hook")
    row = Merge.objects.get(pk="gt-def34")
    assert (row.ci, row.branch, row.target) == ("running", "polecat/slit/gt-def34", "main")
    assert row.link.endswith("/merge_requests/8")
    pipeline["object_attributes"]["tag"] = True
    assert post(client, "gitlab", pipeline, event="Pipeline Hook").json() == {
        "ignored": "tag pipeline"
    }


def test_a_ci_report_never_revives_an_abandoned_change_nor_undoes_a_merge(client, routes):
    bead("gt-abc12")
    bead("gt-def34")
    post(client, "github", pull_request("github", "abandoned"))
    post(client, "github", pull_request("github", "merged", branch="polecat/slit/gt-def34"))
    for branch in (BRANCH, "polecat/slit/gt-def34"):
        suite = fixture("github_check_suite")
        suite["check_suite"]["head_branch"] = branch
        suite["check_suite"]["pull_requests"] = []
        response = post(client, "github", suite, event="check_suite")
        assert response.status_code == 200 and response.json()["recorded"] == []
    assert Merge.objects.get(pk="gt-abc12").state == "abandoned"
    assert Merge.objects.get(pk="gt-def34").state == "merged"


# --- signatures ----------------------------------------------------------------------------------
WRONG = {"github": "sha256=" + "0" * 64, "gitlab": "not-the-token", "gitea": "0" * 64}
WRONG["forgejo"] = WRONG["gitea"]


@pytest.mark.parametrize("forge", FORGES)
@pytest.mark.parametrize("signature", ["", "wrong"])
def test_an_unsigned_or_wrongly_signed_delivery_is_refused_in_one_line(
    forge, signature, client, routes, hook_log
):
    bead("gt-abc12")
    response = post(client, forge, pull_request(forge), signature=WRONG[forge] if signature else "")
    assert response.status_code == 401
    error = one_line_json(response)["error"]
    assert error.endswith("is wrong" if signature else "is missing")
    assert not Merge.objects.exists() and not ForgeDelivery.objects.exists()
    [line] = hook_log()
    assert line.name == "convoys.hooks" and "refused with 401" in line.getMessage()


def test_a_github_signature_of_another_body_or_scheme_is_refused(client, routes):
    bead("gt-abc12")
    other = hmac.new(SECRET.encode(), b"{}", hashlib.sha256).hexdigest()
    for signature in (f"sha256={other}", f"sha1={other}", "sha256=", other):
        response = post(client, "github", pull_request("github"), signature=signature)
        assert response.status_code == 401, signature
    data = pull_request("gitea")
    body = json.dumps(data).encode()
    sha = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert post(client, "gitea", body, signature=f"sha256={sha}").status_code == 401
    assert not Merge.objects.exists()


@pytest.mark.parametrize("forge", ("github", "gitlab", "gitea"))
def test_a_forge_whose_secret_is_unset_refuses_everything(
    forge, client, routes, settings, hook_log
):
    bead("gt-abc12")
    name = {"github": "CONVOY_GITHUB_SECRET", "gitlab": "CONVOY_GITLAB_TOKEN"}.get(
        forge, "CONVOY_GITEA_SECRET"
    )
    setattr(settings, name, "")
    body = json.dumps(pull_request(forge)).encode()
    empty = hmac.new(b"", body, hashlib.sha256).hexdigest()  # signed with the empty secret
    signature = {"github": f"sha256={empty}", "gitlab": "", "gitea": empty}[forge]
    for signed in (None, signature):
        response = post(client, forge, body, signature=signed)
        assert response.status_code == 401
        assert response.json() == {"error": f"{name} is not set"}
    assert not Merge.objects.exists()
    assert len(hook_log()) == 2


# --- replays and unknown beads -------------------------------------------------------------------
def test_a_replayed_delivery_changes_nothing(client, routes, closing):
    bead("gt-abc12")
    mr_convoy(["gt-abc12"])
    closing("gt-abc12")
    assert post(client, "github", pull_request("github", "open"), delivery="d-7").status_code == 200
    seq = Event.objects.latest("seq").seq
    for data in (pull_request("github", "open"), pull_request("github", "abandoned")):
        response = post(client, "github", data, delivery="d-7")
        assert response.status_code == 200 and response.json() == {"duplicate": True}
    assert Event.objects.latest("seq").seq == seq
    assert Merge.objects.get(pk="gt-abc12").state == "open"
    assert ForgeDelivery.objects.count() == 1
    again = post(client, "github", pull_request("github", "open"), delivery="d-8")
    assert again.json() == {"recorded": [], "beads": ["gt-abc12"]}  # the same news, new id
    assert Event.objects.latest("seq").seq == seq


def test_gitlab_falls_back_to_the_idempotency_key_then_to_the_body(client, routes):
    bead("gt-abc12")
    data = pull_request("gitlab", "open")
    keyed = {"X-Gitlab-Event-UUID": "", "Idempotency-Key": "key-1"}
    assert post(client, "gitlab", data, extra=keyed).status_code == 200
    assert post(client, "gitlab", data, extra=keyed).json() == {"duplicate": True}
    assert ForgeDelivery.objects.filter(forge="gitlab", delivery="key-1").exists()
    bare = {"X-Gitlab-Event-UUID": ""}
    data["object_attributes"]["title"] = "Another title"
    assert post(client, "gitlab", data, extra=bare).status_code == 200
    assert post(client, "gitlab", data, extra=bare).json() == {"duplicate": True}
    assert ForgeDelivery.objects.filter(delivery__startswith="sha256:").count() == 1


def test_a_delivery_naming_no_known_bead_is_accepted_and_kept(client, routes):
    bead("gt-abc12")
    data = pull_request("github", branch="feature/spin", title="Spin", body="gt-nothere1")
    response = post(client, "github", data, delivery="d-9")
    assert response.status_code == 202
    assert one_line_json(response) == {"unknown": True, "branch": "feature/spin"}
    assert ForgeDelivery.objects.get(delivery="d-9").outcome == "merged: no known bead named"
    assert not Merge.objects.exists()
    assert post(client, "github", data, delivery="d-9").json() == {"duplicate": True}


@pytest.mark.parametrize(
    "where",
    [
        {"branch": "polecat/nux/gt-abc12"},
        {"branch": "fix-gt-abc12"},
        {"branch": "feature/spin", "title": "Spin the widget (gt-abc12)"},
        {"branch": "feature/spin", "title": "Spin", "body": "Closes gt-abc12.\n\nThanks"},
    ],
    ids=["gastown-branch", "inside-a-word", "title", "body"],
)
@pytest.mark.parametrize("forge", ("github", "gitlab", "gitea"))
def test_the_bead_is_found_in_the_branch_the_title_or_the_body(forge, where, client, routes):
    bead("gt-abc12")
    response = post(client, forge, pull_request(forge, "open", **where))
    assert response.json() == {"recorded": ["gt-abc12"], "beads": ["gt-abc12"]}


def test_every_bead_named_is_recorded(client, routes):
    for bead_id in ("gt-abc12", "gt-def34", "bd-x.1"):
        bead(bead_id)
    data = pull_request("github", title="gt-def34 and gt-abc12", body="also bd-x.1, bd-x.2")
    response = post(client, "github", data)
    assert response.json()["beads"] == ["gt-abc12", "gt-def34", "bd-x.1"]
    assert set(Merge.objects.values_list("pk", "state")) == {
        ("gt-abc12", "merged"),
        ("gt-def34", "merged"),
        ("bd-x.1", "merged"),
    }


# --- what is ignored -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "forge,event,answer",
    [
        ("github", "push", "event 'push'"),
        ("github", "issues", "event 'issues'"),
        ("gitlab", "Push Hook", "event 'Push Hook'"),
        ("gitea", "push", "event 'push'"),
    ],
)
def test_other_events_are_ignored(forge, event, answer, client, routes):
    bead("gt-abc12")
    response = post(client, forge, {"ref": "refs/heads/" + BRANCH}, event=event)
    assert response.status_code == 202 and response.json() == {"ignored": answer}
    assert not Merge.objects.exists() and not ForgeDelivery.objects.exists()


def test_other_pull_request_actions_are_ignored(client, routes):
    bead("gt-abc12")
    data = pull_request("github", "open")
    data["action"] = "labeled"
    assert post(client, "github", data).json() == {"ignored": "pull_request action 'labeled'"}
    data = pull_request("gitea", "open")
    data["action"] = "label_updated"
    assert post(client, "gitea", data).status_code == 202
    assert not Merge.objects.exists()


# --- hostile input -------------------------------------------------------------------------------
def test_a_body_over_1_mib_is_refused_before_its_signature_is_read(client, routes, hook_log):
    body = b'{"pad": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    for signature in (None, ""):
        response = post(client, "github", body, signature=signature)
        assert response.status_code == 413
        assert "over 1048576 bytes" in response.json()["error"]
    assert len(hook_log()) == 2


@pytest.mark.parametrize(
    "body,error",
    [
        (b"[1, 2]", "the body must be a JSON object"),
        (b"not json", "the body is not JSON"),
        (b'{"action": "closed", "pull_request": "\xff"}', "the body is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "the body is not JSON"),
        (b"{}", "action is missing"),
        (b'{"action": 3}', "action must be a string"),
        (b'{"action": "closed"}', "pull_request is missing"),
        (b'{"action": "closed", "pull_request": []}', "pull_request must be a JSON object"),
    ],
    ids=["list", "text", "not-utf8", "deep", "empty", "number-action", "no-pr", "pr-list"],
)
def test_a_body_that_is_not_the_documented_payload_is_a_400_naming_the_field(
    body, error, client, routes
):
    response = post(client, "github", body)
    assert response.status_code == 400 and one_line_json(response) == {"error": error}
    assert not ForgeDelivery.objects.exists()


@pytest.mark.parametrize(
    "forge,change,error",
    [
        ("github", ("pull_request", "head", "ref", 12), "pull_request.head.ref must be a string"),
        ("github", ("pull_request", "merged", "yes"), "pull_request.merged must be true or false"),
        ("github", ("pull_request", "number", "42"), "pull_request.number must be a number"),
        ("github", ("pull_request", "title", "a\x00b"), "pull_request.title contains a NUL"),
        ("gitea", ("pull_request", "head", None), "pull_request.head is missing"),
        ("gitlab", ("object_attributes", "source_branch", ["x"]), "source_branch must be"),
        ("gitlab", ("object_attributes", "iid", True), "object_attributes.iid must be a number"),
    ],
)
def test_wrong_types_are_a_400_naming_the_field(forge, change, error, client, routes):
    bead("gt-abc12")
    data = pull_request(forge)
    *path, key, value = change
    node = data
    for step in path:
        node = node[step]
    node[key] = value
    response = post(client, forge, data)
    assert response.status_code == 400 and error in response.json()["error"]
    assert not Merge.objects.exists()


def test_a_check_suite_with_wrong_types_is_a_400(client, routes):
    suite = fixture("github_check_suite")
    suite["check_suite"]["pull_requests"] = [{"head": {"ref": 5}}]
    response = post(client, "github", suite, event="check_suite")
    assert response.json() == {"error": "check_suite.pull_requests[0].head.ref must be a string"}
    suite["check_suite"]["pull_requests"] = {"head": "x"}
    assert post(client, "github", suite, event="check_suite").status_code == 400


def test_odd_ids_and_long_texts_are_read_quickly_and_safely(client, routes):
    bead("gt-abc12.1")
    bead("GT-Upper9")
    title = "a" * 60_000 + " " + "b-" * 30_000
    body = ("x." * 100_000) + " gt-abc12.1, GT-Upper9! " + ("-" * 1000)
    data = pull_request("github", "open", branch="polecat/nux/gt-abc12.1", title=title)
    data["pull_request"]["body"] = body[:600_000]
    started = time.perf_counter()
    response = post(client, "github", data)
    assert time.perf_counter() - started < 2
    assert response.json()["beads"] == ["gt-abc12.1"]  # the body past 64 KiB is not read
    data["pull_request"]["body"] = "GT-Upper9: ..gt-abc12.1_ and ☃-gt-none1"
    response = post(client, "github", data)
    assert response.json()["beads"] == ["gt-abc12.1", "GT-Upper9"]


def test_an_odd_delivery_id_and_a_missing_event_are_400(client, routes):
    data = pull_request("github")
    assert post(client, "github", data, delivery="d" * 256).status_code == 400
    response = post(client, "github", data, extra={"X-GitHub-Event": ""})
    assert response.json() == {"error": "X-GitHub-Event is missing"}


def test_only_post_is_answered(client, routes):
    for url in ("/hooks/github", "/hooks/gitlab", "/hooks/gitea"):
        assert client.get(url).status_code == 405
