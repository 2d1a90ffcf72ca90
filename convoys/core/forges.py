"""What a forge's webhook says of a change, and whether the forge really sent it. Pure: no
Django.

Each forge signs its own way: GitHub `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the
body>`, Gitea and Forgejo `X-Gitea-Signature` / `X-Forgejo-Signature: <hex HMAC-SHA256>`,
GitLab a shared token in `X-Gitlab-Token`. An empty secret signs nothing.

`github`, `gitlab` and `gitea` read a parsed payload by its event name and return a `Report`
(the change, and the texts that may name its bead), an `Ignored` (an event or action that
says nothing of a change), or raise `BadPayload` naming the field that is wrong.
"""

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from convoys.core.ids import text_problem
from convoys.core.merges import ABANDONED, MERGED, OPEN

MAX_BODY = 1024 * 1024  # bytes of a delivery
TEXT_CHARS = 65536  # of a title or body searched for ids (GitHub's own limit on a body)
CI_CHARS = 20  # of a CI state (its column)
CLOSED_WITHOUT_MERGE = "closed without merge"


class BadPayload(ValueError):
    """A payload that is not what the forge documents; the message names the field."""


@dataclass(frozen=True)
class Report:
    """What one delivery says of a change (the Change fields) and where to look for beads."""

    state: str
    ref: str = ""
    link: str = ""
    branch: str = ""
    target: str = ""
    ci: str = ""
    reason: str = ""
    texts: tuple[str, ...] = ()
    only_ci: bool = False  # a CI report: it never revives an abandoned change
    sender: str = ""


@dataclass(frozen=True)
class Ignored:
    """A delivery that says nothing of a change, and what it was."""

    what: str


# --- signatures ----------------------------------------------------------------------------------
def hmac_hex(secret: str, body: bytes) -> str:
    """The hex HMAC-SHA256 of `body` with `secret`."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github_signed(body: bytes, signature: str, secret: str) -> bool:
    """Whether `X-Hub-Signature-256` is `sha256=` and the body's HMAC under `secret`."""
    scheme, _, digest = signature.partition("=")
    if not secret or scheme != "sha256" or not digest:
        return False
    return hmac.compare_digest(digest.encode(), hmac_hex(secret, body).encode())


def gitea_signed(body: bytes, signature: str, secret: str) -> bool:
    """Whether `X-Gitea-Signature` (or Forgejo's) is the body's HMAC under `secret`."""
    if not secret or not signature:
        return False
    return hmac.compare_digest(signature.encode(), hmac_hex(secret, body).encode())


def gitlab_signed(token: str, secret: str) -> bool:
    """Whether `X-Gitlab-Token` is the configured token."""
    if not secret or not token:
        return False
    return hmac.compare_digest(token.encode(), secret.encode())


# --- payloads ------------------------------------------------------------------------------------
class _Node:
    """A JSON object of the payload and its dotted path, read field by field with its type
    checked."""

    def __init__(self, value: object, path: str) -> None:
        if not isinstance(value, dict):
            where = path or "the body"
            raise BadPayload(f"{where} must be a JSON object")
        self.value: dict[str, Any] = value
        self.path = path

    def _name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def node(self, key: str) -> "_Node":
        if self.value.get(key) is None:
            raise BadPayload(f"{self._name(key)} is missing")
        return _Node(self.value[key], self._name(key))

    def maybe(self, key: str) -> "_Node | None":
        return None if self.value.get(key) is None else self.node(key)

    def nodes(self, key: str) -> list["_Node"]:
        value = self.value.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise BadPayload(f"{self._name(key)} must be a list")
        return [_Node(item, f"{self._name(key)}[{i}]") for i, item in enumerate(value)]

    def text(self, key: str, required: bool = False) -> str:
        value = self.value.get(key)
        if value is None:
            if required:
                raise BadPayload(f"{self._name(key)} is missing")
            return ""
        if not isinstance(value, str):
            raise BadPayload(f"{self._name(key)} must be a string")
        problem = text_problem(value)
        if problem:
            raise BadPayload(f"{self._name(key)} {problem}")
        return value

    def flag(self, key: str) -> bool:
        value = self.value.get(key)
        if value is not None and not isinstance(value, bool):
            raise BadPayload(f"{self._name(key)} must be true or false")
        return bool(value)

    def number(self, key: str) -> int | None:
        value = self.value.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise BadPayload(f"{self._name(key)} must be a number")
        return value


def _login(root: _Node, key: str, field: str) -> str:
    who = root.maybe(key)
    return who.text(field) if who else ""


def _pull_request(root: _Node, opening: tuple[str, ...]) -> Report | Ignored:
    """A GitHub or Gitea `pull_request` delivery (Gitea's payload follows GitHub's)."""
    action = root.text("action", required=True)
    pr = root.node("pull_request")
    edited_open = action == "edited" and pr.text("state") == "open"
    if action != "closed" and action not in opening and not edited_open:
        return Ignored(f"pull_request action '{action[:40]}'")
    branch = pr.node("head").text("ref")
    number = pr.number("number")
    fields: dict[str, Any] = {
        "ref": f"PR #{number}" if number is not None else "",
        "link": pr.text("html_url"),
        "branch": branch,
        "target": pr.node("base").text("ref"),
        "texts": (branch, pr.text("title")[:TEXT_CHARS], pr.text("body")[:TEXT_CHARS]),
        "sender": _login(root, "sender", "login"),
    }
    if action != "closed":
        return Report(OPEN, **fields)
    if pr.flag("merged"):
        return Report(MERGED, **(fields | {"ref": pr.text("merge_commit_sha") or fields["ref"]}))
    return Report(ABANDONED, reason=CLOSED_WITHOUT_MERGE, **fields)


def _check_suite(root: _Node) -> Report | Ignored:
    action = root.text("action", required=True)
    if action != "completed":
        return Ignored(f"check_suite action '{action[:40]}'")
    suite = root.node("check_suite")
    branch = suite.text("head_branch")
    heads = [pr.node("head").text("ref") for pr in suite.nodes("pull_requests")]
    return Report(
        OPEN,
        ci=suite.text("conclusion")[:CI_CHARS],
        branch=branch,
        texts=(*heads, branch),
        only_ci=True,
        sender=_login(root, "sender", "login"),
    )


GITHUB_OPENING = ("opened", "reopened", "synchronize", "ready_for_review")
GITEA_OPENING = ("opened", "reopened", "synchronized")


def github(event: str, payload: object) -> Report | Ignored:
    """A GitHub delivery by its `X-GitHub-Event`."""
    if event == "pull_request":
        return _pull_request(_Node(payload, ""), GITHUB_OPENING)
    if event == "check_suite":
        return _check_suite(_Node(payload, ""))
    return Ignored(f"event '{event[:40]}'")


def gitea(event: str, payload: object) -> Report | Ignored:
    """A Gitea or Forgejo delivery by its `X-Gitea-Event` (some versions send a new push to
    a pull request as its own `pull_request_sync`)."""
    if event in ("pull_request", "pull_request_sync"):
        return _pull_request(_Node(payload, ""), GITEA_OPENING)
    return Ignored(f"event '{event[:40]}'")


GITLAB_STATES = {"merge": MERGED, "close": ABANDONED, "open": OPEN, "reopen": OPEN}


def _merge_request(root: _Node) -> Report | Ignored:
    mr = root.node("object_attributes")
    action = mr.text("action")
    state = GITLAB_STATES.get(action)
    if action == "update" and mr.text("state") == "opened":
        state = OPEN
    if state is None:
        return Ignored(f"merge request action '{action[:40]}'")
    branch = mr.text("source_branch")
    iid = mr.number("iid")
    merged_ref = mr.text("merge_commit_sha") if state == MERGED else ""
    return Report(
        state,
        ref=merged_ref or (f"MR !{iid}" if iid is not None else ""),
        link=mr.text("url"),
        branch=branch,
        target=mr.text("target_branch"),
        reason=CLOSED_WITHOUT_MERGE if state == ABANDONED else "",
        texts=(branch, mr.text("title")[:TEXT_CHARS], mr.text("description")[:TEXT_CHARS]),
        sender=_login(root, "user", "username"),
    )


def _pipeline(root: _Node) -> Report | Ignored:
    pipeline = root.node("object_attributes")
    if pipeline.flag("tag"):
        return Ignored("tag pipeline")
    ref = pipeline.text("ref")
    mr = root.maybe("merge_request")  # a merge request pipeline's ref is refs/merge-requests/…
    branch = mr.text("source_branch") if mr else ref
    return Report(
        OPEN,
        link=mr.text("url") if mr else "",
        branch=branch,
        target=mr.text("target_branch") if mr else "",
        ci=pipeline.text("status")[:CI_CHARS],
        texts=(branch, ref, mr.text("title")[:TEXT_CHARS] if mr else ""),
        only_ci=True,
        sender=_login(root, "user", "username"),
    )


def gitlab(event: str, payload: object) -> Report | Ignored:
    """A GitLab delivery by its `X-Gitlab-Event`."""
    if event == "Merge Request Hook":
        return _merge_request(_Node(payload, ""))
    if event == "Pipeline Hook":
        return _pipeline(_Node(payload, ""))
    return Ignored(f"event '{event[:40]}'")
