"""Authorization matrix: every URL pattern Django resolves and every API operation,
for each role and each method it accepts, against the statuses written in the tables below.

The tables are the spec. A URL pattern or API operation without a row fails the test, so a new
page or endpoint cannot ship without someone deciding who may use it. Each request runs inside
a rolled-back savepoint: every cell sees the same world.

Roles: anonymous; `none`, signed in without permissions; `viewer`, every view_* permission of
the convoys app; `staff`, is_staff plus viewing everything and adding/changing beads and
convoys (an operator); `superuser`. API rows run twice, with a session and with a Bearer token.
"""

import functools
import json
import re

import pytest
from asgiref.sync import async_to_sync
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from channels.testing import WebsocketCommunicator
from django.contrib import admin
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.test import Client
from django.urls import URLResolver, get_resolver, resolve
from django.utils import timezone
from django_q.models import OrmQ, Schedule, Task

from convoys.api import api, api_not_found
from convoys.models import (
    ApiToken,
    Bead,
    Dispatch,
    Event,
    Notification,
    Rig,
    Route,
    Subscription,
    Worker,
)
from convoys.services import beads, convoys, notify, staging
from convoys.services.launch import launch_staged
from convoys.services.tokens import create_token

from .support.factories import bead, blocks
from .support.users import logged_in

ROLES = ("anonymous", "none", "viewer", "staff", "superuser")
LOGIN = "login"  # 302 to /login/?next=…
ADMIN_LOGIN = "admin-login"  # 302 to /admin/login/?next=…
OK = "ok"  # a form POST that was allowed: saved (302) or shown again with its errors (200)
L, AL = LOGIN, ADMIN_LOGIN
MISSING = "hq-cv-nope0"  # a convoy id that does not exist

# fmt: off
# --- pages: (route pattern, method, path, form data, statuses for ROLES) -------------------------
# "Missing and forbidden answer alike": a user who may not view convoys gets 403 whether the
# convoy exists or not.
PAGES = {
    "": [
        ("GET", "/", None, (L, 403, 200, 200, 200)),
        ("POST", "/", {}, (L, 403, 200, 200, 200)),
    ],
    "convoys/<id:convoy_id>/": [
        ("GET", "/convoys/{convoy}/", None, (L, 403, 200, 200, 200)),
        ("POST", "/convoys/{convoy}/", {}, (L, 403, 200, 200, 200)),
        ("GET", f"/convoys/{MISSING}/", None, (L, 403, 404, 404, 404)),
    ],
    # every convoy action is POST only, for everyone
    "convoys/<id:convoy_id>/<str:action>/": [
        ("GET", "/convoys/{convoy}/subscribe/", None, (405,) * 5),
        ("POST", "/convoys/{convoy}/subscribe/", {}, (L, 403, 302, 302, 302)),
        ("POST", "/convoys/{convoy}/unsubscribe/", {}, (L, 403, 302, 302, 302)),
        ("POST", f"/convoys/{MISSING}/subscribe/", {}, (L, 403, 404, 404, 404)),
        ("POST", f"/convoys/{MISSING}/unsubscribe/", {}, (L, 403, 404, 404, 404)),
        ("POST", "/convoys/{staged}/launch/", {}, (L, 403, 403, 302, 302)),
        ("POST", "/convoys/{convoy}/check/", {}, (L, 403, 403, 302, 302)),
        ("POST", "/convoys/{convoy}/close/", {"force": "1"}, (L, 403, 403, 302, 302)),
        ("POST", "/convoys/{convoy}/land/", {"force": "1"}, (L, 403, 403, 302, 302)),
        ("POST", "/convoys/{convoy}/add/", {"ids": "gt-x"}, (L, 403, 403, 302, 302)),
        ("POST", "/convoys/{convoy}/bogus/", {}, (L, 403, 403, 404, 404)),
    ],
    "convoys/<id:convoy_id>/pause/": [
        ("GET", "/convoys/{staged}/pause/", None, (405,) * 5),
        ("POST", "/convoys/{staged}/pause/", {"reason": "r"}, (L, 403, 403, 302, 302)),
        ("POST", f"/convoys/{MISSING}/pause/", {}, (L, 403, 403, 404, 404)),
    ],
    "convoys/<id:convoy_id>/resume/": [
        ("GET", "/convoys/{staged}/resume/", None, (405,) * 5),
        ("POST", "/convoys/{staged}/resume/", {}, (L, 403, 403, 302, 302)),
        ("POST", f"/convoys/{MISSING}/resume/", {}, (L, 403, 403, 404, 404)),
    ],
    # whoever may view convoys may acknowledge a stuck one's escalation (400: not escalated)
    "convoys/<id:convoy_id>/ack/": [
        ("GET", "/convoys/{convoy}/ack/", None, (405,) * 5),
        ("POST", "/convoys/{convoy}/ack/", {}, (L, 403, 302, 302, 302)),
        ("POST", f"/convoys/{MISSING}/ack/", {}, (L, 403, 404, 404, 404)),
    ],
    # the convoy page's time slider (JSON) and its visit report: whoever may view convoys
    "convoys/<id:convoy_id>/history/": [
        ("GET", "/convoys/{convoy}/history/?step=1", None, (L, 403, 200, 200, 200)),
        ("GET", "/convoys/{convoy}/history/?step=x", None, (L, 403, 400, 400, 400)),
        ("POST", "/convoys/{convoy}/history/?step=1", {}, (405,) * 5),
        ("GET", f"/convoys/{MISSING}/history/?step=1", None, (L, 403, 404, 404, 404)),
    ],
    "convoys/<id:convoy_id>/visit/": [
        ("GET", "/convoys/{convoy}/visit/", None, (405,) * 5),
        ("POST", "/convoys/{convoy}/visit/", {"seq": "1"}, (L, 403, 200, 200, 200)),
        ("POST", f"/convoys/{MISSING}/visit/", {"seq": "1"}, (L, 403, 404, 404, 404)),
    ],
    "beads/actions/": [
        ("GET", "/beads/actions/", None, (405,) * 5),
        ("POST", "/beads/actions/", {"action": "retry", "ids": "gt-x"}, (L, 403, 403, 200, 200)),
    ],
    "beads/<id:bead_id>/retry/": [
        ("GET", "/beads/gt-x/retry/", None, (405,) * 5),
        ("POST", "/beads/gt-x/retry/", {}, (L, 403, 403, 302, 302)),
        ("POST", "/beads/gt-nope/retry/", {}, (L, 403, 403, 404, 404)),
    ],
    # forge webhooks: signed by the forge, not by a login; an unsigned delivery is refused
    **{
        f"hooks/{forge}": [
            ("GET", f"/hooks/{forge}", None, (405,) * 5),
            ("POST", f"/hooks/{forge}", {}, (401,) * 5),
        ]
        for forge in ("github", "gitlab", "gitea")
    },
    "stage/": [
        ("GET", "/stage/?ids=gt-x", None, (L, 403, 200, 200, 200)),
        ("POST", "/stage/", {"ids": "gt-x", "do": "stage"}, (L, 403, 403, 302, 302)),
        ("POST", "/stage/", {"ids": "gt-x", "do": "launch"}, (L, 403, 403, 302, 302)),
    ],
    # authoring: the model permission itself (add_bead, change_bead, change_convoy, change_rig)
    "create/": [
        ("GET", "/create/", None, (L, 403, 403, 200, 200)),
        ("POST", "/create/", {"kind": "bead"}, (L, 403, 403, 400, 400)),
    ],
    "beads/<id:bead_id>/dependencies/add/": [
        ("GET", "/beads/gt-x/dependencies/add/", None, (L, 403, 403, 200, 200)),
        ("POST", "/beads/gt-x/dependencies/add/", {"target": "gt-y", "type": "blocks"}, (L, 403, 403, 302, 302)),
        ("POST", "/beads/gt-nope/dependencies/add/", {"target": "gt-y"}, (L, 403, 403, 404, 404)),
    ],
    "convoys/<id:convoy_id>/staging/recheck/": [
        ("GET", "/convoys/{staged}/staging/recheck/", None, (405,) * 5),
        ("POST", "/convoys/{staged}/staging/recheck/", {}, (L, 403, 403, 302, 302)),
        ("POST", f"/convoys/{MISSING}/staging/recheck/", {}, (L, 403, 403, 404, 404)),
    ],
    "rigs/<id:name>/restore/": [
        ("GET", "/rigs/gastown/restore/", None, (405,) * 5),
        ("POST", "/rigs/gastown/restore/", {}, (L, 403, 403, 403, 302)),
        ("POST", "/rigs/nowhere/restore/", {}, (L, 403, 403, 403, 404)),
    ],
    "stranded/": [
        ("GET", "/stranded/", None, (L, 403, 200, 200, 200)),
        ("POST", "/stranded/", {}, (L, 403, 200, 200, 200)),
    ],
    # saved views: whoever may view convoys saves their own and opens anyone's by its link
    "views/save/": [
        ("GET", "/views/save/", None, (405,) * 5),
        ("POST", "/views/save/", {"page": "dashboard", "name": "v", "query": "status=all"}, (L, 403, 302, 302, 302)),
    ],
    "views/<int:view_id>/": [
        ("GET", "/views/999999/", None, (L, 403, 404, 404, 404)),
        ("POST", "/views/999999/", {}, (405,) * 5),
    ],
    "views/<int:view_id>/<str:action>/": [
        ("GET", "/views/999999/delete/", None, (405,) * 5),
        ("POST", "/views/999999/delete/", {}, (L, 403, 302, 302, 302)),
    ],
    "search/": [
        ("GET", "/search/?q=gt-a", None, (L, 403, 200, 200, 200)),
        ("POST", "/search/", {}, (L, 403, 200, 200, 200)),
    ],
    # the dashboard's selection: shown to confirm (200), then done (302); pausing needs the
    # change permission, acknowledging only the view one (a refusal goes back, 302)
    "actions/convoys/": [
        ("GET", "/actions/convoys/", None, (405,) * 5),
        ("POST", "/actions/convoys/", {"action": "pause", "ids": ["{convoy}"]}, (L, 403, 403, 200, 200)),
        ("POST", "/actions/convoys/", {"action": "pause", "ids": ["{convoy}"], "confirmed": "1"}, (L, 403, 403, 302, 302)),
        ("POST", "/actions/convoys/", {"action": "acknowledge", "ids": ["{convoy}"], "confirmed": "1"}, (L, 403, 302, 302, 302)),
    ],
    "beads/<id:bead_id>/": [
        ("GET", "/beads/gt-a/", None, (L, 403, 200, 200, 200)),
        ("POST", "/beads/gt-a/", {}, (L, 403, 200, 200, 200)),
        ("GET", "/beads/gt-nope/", None, (L, 403, 404, 404, 404)),
    ],
    "beads/<id:bead_id>/<str:action>/": [
        ("GET", "/beads/gt-x/close/", None, (405,) * 5),
        ("POST", "/beads/gt-x/close/", {}, (L, 403, 403, 302, 302)),
        ("POST", "/beads/gt-x/reopen/", {}, (L, 403, 403, 302, 302)),
        ("POST", "/beads/gt-x/bogus/", {}, (L, 403, 403, 404, 404)),
    ],
    # the inbox holds only the user's own notices: any signed-in user
    "inbox/": [
        ("GET", "/inbox/", None, (L, 200, 200, 200, 200)),
        ("POST", "/inbox/", {}, (L, 302, 302, 302, 302)),
        ("POST", "/inbox/", {"id": ["²", "9" * 5000]}, (L, 302, 302, 302, 302)),
    ],
    "subscriptions/": [
        ("GET", "/subscriptions/", None, (L, 403, 200, 200, 200)),
        ("POST", "/subscriptions/", {"convoy": "{convoy}"}, (L, 403, 302, 302, 302)),
        ("POST", "/subscriptions/", {"convoy": MISSING}, (L, 403, 302, 302, 302)),
        ("POST", "/subscriptions/", {}, (L, 403, 302, 302, 302)),
    ],
    # webhooks and chat: one's own targets (a refused URL is said on the page, 302); a
    # target or delivery of someone else's is 403 (tests/test_outbound_hooks_page.py)
    "subscriptions/hooks/": [
        ("GET", "/subscriptions/hooks/", None, (405,) * 5),
        ("POST", "/subscriptions/hooks/", {"url": "not a url"}, (L, 403, 302, 302, 302)),
    ],
    "subscriptions/hooks/<int:target_id>/<str:action>/": [
        ("GET", "/subscriptions/hooks/99/test/", None, (405,) * 5),
        ("POST", "/subscriptions/hooks/99/test/", {}, (L, 403, 404, 404, 404)),
        ("POST", "/subscriptions/hooks/99/remove/", {}, (L, 403, 404, 404, 404)),
    ],
    "subscriptions/deliveries/<int:delivery_id>/redeliver/": [
        ("GET", "/subscriptions/deliveries/99/redeliver/", None, (405,) * 5),
        ("POST", "/subscriptions/deliveries/99/redeliver/", {}, (L, 403, 404, 404, 404)),
    ],
    "^api/": [
        ("GET", "/api/beads/", None, (404,) * 5),
        ("POST", "/api/beads/a/b/c", {}, (404,) * 5),
    ],
    "favicon.ico": [
        ("GET", "/favicon.ico", None, (302,) * 5),
        ("POST", "/favicon.ico", {}, (302,) * 5),
    ],
    # operators' endpoints: no login; /metrics wants a token (none is configured here), and
    # /readyz is 503 while no task cluster ticks (none does in these tests)
    "healthz": [
        ("GET", "/healthz", None, (200,) * 5),
        ("POST", "/healthz", {}, (405,) * 5),
    ],
    "readyz": [
        ("GET", "/readyz", None, (503,) * 5),
        ("POST", "/readyz", {}, (405,) * 5),
    ],
    "metrics": [
        ("GET", "/metrics", None, (401,) * 5),
        ("POST", "/metrics", {}, (405,) * 5),
    ],
    "login/": [
        ("GET", "/login/", None, (200,) * 5),
        ("POST", "/login/", {}, (200,) * 5),
    ],
    "logout/": [
        ("GET", "/logout/", None, (405,) * 5),
        ("POST", "/logout/", {}, (302,) * 5),
    ],
    # the API's own non-operation URLs; the docs need a signed-in user (any), or a token
    "api/": [
        ("GET", "/api/", None, (404,) * 5),
        ("POST", "/api/", {}, (404,) * 5),
    ],
    "api/docs": [
        ("GET", "/api/docs", None, (L, 200, 200, 200, 200)),
        ("POST", "/api/docs", {}, (L, 200, 200, 200, 200)),
    ],
    "api/openapi.json": [
        ("GET", "/api/openapi.json", None, (401, 200, 200, 200, 200)),
        ("POST", "/api/openapi.json", {}, (401, 200, 200, 200, 200)),
    ],
}

# --- admin: the site's own URLs, then per model -----------------------------------------------
# Nobody but staff gets past the admin login page.
ADMIN_SITE = {
    "admin/": [
        ("GET", "/admin/", None, (AL, AL, AL, 200, 200)),
        ("POST", "/admin/", {}, (AL, AL, AL, 200, 200)),
    ],
    "admin/login/": [
        ("GET", "/admin/login/", None, (200, 200, 200, 302, 302)),
        ("POST", "/admin/login/", {}, (200,) * 5),
    ],
    "admin/logout/": [
        ("GET", "/admin/logout/", None, (302, 302, 302, 405, 405)),
        ("POST", "/admin/logout/", {}, (302,) * 5),
    ],
    "admin/password_change/": [
        ("GET", "/admin/password_change/", None, (AL, AL, AL, 200, 200)),
        ("POST", "/admin/password_change/", {}, (AL, AL, AL, 200, 200)),
    ],
    "admin/password_change/done/": [
        ("GET", "/admin/password_change/done/", None, (AL, AL, AL, 200, 200)),
        ("POST", "/admin/password_change/done/", {}, (AL, AL, AL, 405, 405)),
    ],
    "admin/autocomplete/": [
        ("GET", "/admin/autocomplete/", None, (AL, AL, AL, 403, 403)),
        ("POST", "/admin/autocomplete/", {}, (AL, AL, AL, 405, 405)),
    ],
    "admin/jsi18n/": [
        ("GET", "/admin/jsi18n/", None, (AL, AL, AL, 200, 200)),
        ("POST", "/admin/jsi18n/", {}, (AL, AL, AL, 405, 405)),
    ],
    # content type shortcut: no model has get_absolute_url, so it leads nowhere
    "admin/r/<path:content_type_id>/<path:object_id>/": [
        ("GET", "/admin/r/{bead_ct}/gt-a/", None, (AL, AL, AL, 404, 404)),
        ("POST", "/admin/r/{bead_ct}/gt-a/", {}, (AL, AL, AL, 404, 404)),
    ],
    "admin/^(?P<app_label>auth|axes|convoys|django_q)/$": [
        ("GET", "/admin/convoys/", None, (AL, AL, AL, 200, 200)),
        ("POST", "/admin/convoys/", {}, (AL, AL, AL, 200, 200)),
        ("GET", "/admin/auth/", None, (AL, AL, AL, 404, 200)),
    ],
    "admin/(?P<url>.*)$": [
        ("GET", "/admin/nowhere/", None, (AL, AL, AL, 404, 404)),
        ("POST", "/admin/nowhere/", {}, (AL, AL, AL, 404, 404)),
    ],
}

# For each registered model, what staff and the superuser get from (changelist GET, add GET,
# add POST, change GET, change POST, history GET, delete GET, delete POST, object URL GET).
# Everyone else is sent to the admin login page. Beads, convoys, rigs and routes save through
# services and are never deleted here; the log tables are read-only; convoys are created by
# staging. "Object URL" redirects to the change page. The superuser cannot delete a user who
# has notices (the notification log is read-only).
ADMIN_ACTIONS = ("", "add/", "add/", "{pk}/change/", "{pk}/change/", "{pk}/history/", "{pk}/delete/", "{pk}/delete/", "{pk}/")
ADMIN_METHODS = ("GET", "GET", "POST", "GET", "POST", "GET", "GET", "POST", "GET")
ADMIN_MODELS = {
    # model:                   staff                                        superuser
    "auth/group": ((403, 403, 403, 403, 403, 403, 403, 403, 302), (200, 200, OK, 200, OK, 200, 200, 302, 302)),
    "auth/user": ((403, 403, 403, 403, 403, 403, 403, 403, 302), (200, 200, OK, 200, OK, 200, 200, 403, 302)),
    "django_q/schedule": ((403, 403, 403, 403, 403, 403, 403, 403, 302), (200, 200, OK, 200, OK, 200, 200, 302, 302)),
    "django_q/success": ((403, 403, 403, 403, 403, 403, 403, 403, 302), (200, 403, 403, 200, OK, 200, 200, 302, 302)),
    "django_q/failure": ((403, 403, 403, 403, 403, 403, 403, 403, 302), (200, 403, 403, 200, OK, 200, 200, 302, 302)),
    "django_q/ormq": ((403, 403, 403, 403, 403, 403, 403, 403, 302), (200, 403, 403, 200, OK, 200, 200, 302, 302)),
    "axes/accessattempt": ((403, 403, 403, 403, 403, 403, 403, 403, 302), (200, 403, 403, 200, OK, 200, 200, 302, 302)),
    "axes/accesslog": ((403, 403, 403, 403, 403, 403, 403, 403, 302), (200, 403, 403, 200, OK, 200, 200, 302, 302)),
    "axes/accessfailurelog": ((403, 403, 403, 403, 403, 403, 403, 403, 302), (200, 403, 403, 200, OK, 200, 200, 302, 302)),
    "convoys/bead": ((200, 200, OK, 200, OK, 200, 403, 403, 302), (200, 200, OK, 200, OK, 200, 403, 403, 302)),
    "convoys/convoy": ((200, 403, 403, 200, OK, 200, 403, 403, 302), (200, 403, 403, 200, OK, 200, 403, 403, 302)),
    "convoys/rig": ((200, 403, 403, 200, 403, 200, 403, 403, 302), (200, 200, OK, 200, OK, 200, 403, 403, 302)),
    "convoys/route": ((200, 403, 403, 200, 403, 200, 403, 403, 302), (200, 200, OK, 200, OK, 200, 403, 403, 302)),
    "convoys/event": ((200, 403, 403, 200, 403, 200, 403, 403, 302), (200, 403, 403, 200, 403, 200, 403, 403, 302)),
    "convoys/dispatch": ((200, 403, 403, 200, 403, 200, 403, 403, 302), (200, 403, 403, 200, 403, 200, 403, 403, 302)),
    "convoys/worker": ((200, 403, 403, 200, 403, 200, 403, 403, 302), (200, 403, 403, 200, 403, 200, 403, 403, 302)),
    "convoys/subscription": ((200, 403, 403, 200, 403, 200, 403, 403, 302), (200, 200, OK, 200, OK, 200, 200, 302, 302)),
    "convoys/notification": ((200, 403, 403, 200, 403, 200, 403, 403, 302), (200, 403, 403, 200, 403, 200, 403, 403, 302)),
    "convoys/apitoken": ((200, 403, 403, 200, 403, 200, 403, 403, 302), (200, 200, OK, 200, OK, 200, 200, 302, 302)),
}

# --- API operations: (path, method, body, statuses for ROLES) -----------------------------------
# Run with a session and with a Bearer token: anonymous 401, no permission 403.
READ = (401, 403, 200, 200, 200)
WRITE = (401, 403, 403, 200, 200)
API = [
    ("/api/convoys", "GET", None, READ),
    ("/api/convoys/{convoy}", "GET", None, READ),
    ("/api/convoys/" + MISSING, "GET", None, (401, 403, 404, 404, 404)),
    ("/api/beads", "GET", None, READ),
    ("/api/beads/gt-a", "GET", None, READ),
    ("/api/beads/gt-nope", "GET", None, (401, 403, 404, 404, 404)),
    ("/api/beads/gt-x", "PATCH", {"assignee": "someone"}, WRITE),
    ("/api/beads/gt-x/close", "POST", {"reason": "done"}, WRITE),
    ("/api/heartbeat", "POST", {"worker": "w1"}, WRITE),
    ("/api/beads/gt-x/log", "POST", {"lines": ["hi"]}, WRITE),
    ("/api/beads/gt-nope/log", "POST", {"lines": ["hi"]}, (401, 403, 403, 404, 404)),
    ("/api/beads/gt-x/log", "GET", None, READ),
    ("/api/beads/gt-nope/log", "GET", None, (401, 403, 404, 404, 404)),
    ("/api/stranded", "GET", None, READ),
    ("/api/search?q=gt-a", "GET", None, READ),
    ("/api/convoys/actions", "POST", {"action": "pause", "ids": ["{convoy}"]}, WRITE),
    ("/api/convoys/actions", "POST", {"action": "acknowledge", "ids": ["{convoy}"]}, READ),
    ("/api/stage", "POST", {"ids": ["gt-x"]}, WRITE),
    ("/api/launch", "POST", {"ids": ["{staged}"], "force": True}, WRITE),
    ("/api/convoys/{staged}/pause", "POST", {"reason": "r"}, WRITE),
    ("/api/convoys/{staged}/resume", "POST", {}, WRITE),
    ("/api/convoys/{convoy}/ack", "POST", {}, (401, 403, 400, 400, 400)),
    ("/api/convoys/" + MISSING + "/ack", "POST", {}, (401, 403, 404, 404, 404)),
    ("/api/beads/gt-x/retry", "POST", {}, WRITE),
    ("/api/beads/actions", "POST", {"action": "retry", "ids": ["gt-x"], "dry_run": True}, WRITE),
    ("/api/beads/gt-nope/retry", "POST", {}, (401, 403, 403, 404, 404)),
    ("/api/beads/gt-x/merge", "POST", {"state": "open", "branch": "b"}, WRITE),
    ("/api/beads/gt-nope/merge", "POST", {"state": "open"}, (401, 403, 403, 404, 404)),
    # the document and its page: any signed-in user or token holder
    ("/api/openapi.json", "GET", None, (401, 200, 200, 200, 200)),
    ("/api/docs", "GET", None, (L, 200, 200, 200, 200)),
]

# fmt: on


@functools.cache
def openapi_paths():
    return api.get_openapi_schema()["paths"]


def route_of(api_path):
    """/api/beads/gt-a -> the OpenAPI path it exercises, e.g. /api/beads/{bead_id}."""
    for path in openapi_paths():
        if re.fullmatch(re.sub(r"\{\w+\}", "[^/]+", path), api_path.split("?")[0]):
            return path
    return None


# --- the world ----------------------------------------------------------------------------------
CLIENT = Client()  # one for all requests: each new client loads the middleware again
BROWSER = Client(enforce_csrf_checks=True)  # checks CSRF tokens as a real browser session is


def role_users():
    convoys_app = Permission.objects.filter(content_type__app_label="convoys")
    # no passwords (tests sign in with force_login): hashing one costs most of a second
    users = {"none": User.objects.create_user("none")}
    users["viewer"] = User.objects.create_user("viewer")
    users["viewer"].user_permissions.add(*convoys_app.filter(codename__startswith="view_"))
    users["staff"] = User.objects.create_user("staff", is_staff=True)
    users["staff"].user_permissions.add(
        *convoys_app.filter(codename__startswith="view_"),
        *convoys_app.filter(codename__in=["add_bead", "change_bead", "add_convoy"]),
        *convoys_app.filter(codename="change_convoy"),
    )
    users["superuser"] = User.objects.create_superuser("root", "root@localhost", None)
    return users


@pytest.fixture
def world(routes):
    """Beads, a launched convoy, a staged one, a landed one with its notice, tokens."""
    for bead_id in ("gt-a", "gt-b", "gt-x", "gt-y", "gt-d"):
        bead(bead_id)
    blocks("gt-a", "gt-b")
    users = role_users()
    notify.subscribe(users["superuser"])
    launched = staging.stage(["gt-a", "gt-b"], actor="test").convoy_id
    launch_staged(launched, force=True)
    staged = staging.stage(["gt-y"], actor="test").convoy_id
    landed = convoys.create("Landed", ["gt-d"])
    beads.close_bead("gt-d")
    convoys.check(landed.pk)
    Group.objects.create(name="operators")
    third_party_rows()
    tokens = {role: create_token(user, role) for role, user in users.items()}
    sessions = {}
    for role, user in users.items():
        CLIENT.cookies.clear()  # a new session each (signing in over one ends it)
        CLIENT.force_login(user)
        sessions[role] = CLIENT.cookies["sessionid"].value
    return {
        "users": users,
        "tokens": tokens,
        "sessions": sessions,
        "ids": {
            "convoy": launched,
            "staged": staged,
            "bead_ct": ContentType.objects.get_for_model(Bead).pk,
        },
        "objects": {
            "django_q/schedule": Schedule.objects.get().pk,
            "django_q/success": "task0",
            "django_q/failure": "task1",
            "django_q/ormq": OrmQ.objects.get().pk,
            "axes/accessattempt": AccessAttempt.objects.order_by("pk").first().pk,
            "axes/accesslog": AccessLog.objects.order_by("pk").first().pk,
            "axes/accessfailurelog": AccessFailureLog.objects.order_by("pk").first().pk,
            "auth/group": Group.objects.get(name="operators").pk,  # not a role's group (0022)
            "auth/user": users["superuser"].pk,
            "convoys/bead": "gt-a",
            "convoys/convoy": launched,
            "convoys/rig": Rig.objects.order_by("pk").first().pk,
            "convoys/route": Route.objects.order_by("pk").first().pk,
            "convoys/event": Event.objects.order_by("pk").first().pk,
            "convoys/dispatch": Dispatch.objects.order_by("pk").first().pk,
            "convoys/worker": Worker.objects.order_by("pk").first().pk,
            "convoys/subscription": Subscription.objects.get().pk,
            "convoys/notification": Notification.objects.order_by("pk").first().pk,
            "convoys/apitoken": ApiToken.objects.order_by("pk").first().pk,
        },
    }


def third_party_rows():
    """A row for each other app's admin: a failed sign-in (axes), a schedule, a
    finished and a failed task, a queued message (django-q)."""
    CLIENT.post("/login/", {"username": "none", "password": "wrong"})  # signing in logs too
    Schedule.objects.create(func="math.floor", args="1.5")
    now = timezone.now()
    for n, ok in enumerate((True, False)):
        Task.objects.create(
            id=f"task{n}", name=f"t{n}", func="math.floor", started=now, stopped=now, success=ok
        )
    OrmQ.objects.create(key="default", payload="-")
    AccessFailureLog.objects.create(  # not written with the default settings
        username="none",
        ip_address="127.0.0.1",
        user_agent="",
        http_accept="",
        path_info="/login/",
        attempt_time=now,
    )


def fill(value, ids):
    if isinstance(value, str):
        return value.format(**ids)
    if isinstance(value, list):
        return [fill(v, ids) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, ids) for k, v in value.items()}
    return value


def answer(world, role, method, path, data=None, token=False, client=CLIENT):
    """The status (or LOGIN / ADMIN_LOGIN) for one request, its writes rolled back; bodies
    to the API are JSON, to pages form data."""
    client.cookies.clear()
    kwargs = {}
    if role != "anonymous" and token:
        kwargs["HTTP_AUTHORIZATION"] = f"Bearer {world['tokens'][role]}"
    elif role != "anonymous":
        client.cookies["sessionid"] = world["sessions"][role]
    if data is not None:
        kwargs["data"] = data
    if data is not None and path.startswith("/api/"):
        kwargs.update(data=json.dumps(data), content_type="application/json")
    with transaction.atomic():
        response = getattr(client, method.lower())(path, **kwargs)
        transaction.set_rollback(True)
    if response.status_code == 302:
        target = response.headers["Location"]
        if target.startswith("/login/?next="):
            return LOGIN
        if target.startswith("/admin/login/?next="):
            return ADMIN_LOGIN
        return f"302 to {target}"
    return response.status_code


def flat(table):
    """{route: [(method, path, data, statuses)]} -> [(route, method, path, data, statuses)]"""
    return [(route, *row) for route, rows in table.items() for row in rows]


def matches(got, want):
    redirect = str(got).startswith("302 ")  # to anything but a login page
    if want == OK:
        return got == 200 or redirect
    return got == want or (want == 302 and redirect)


def check_rows(world, rows, token=False):
    wrong = []
    for route, method, path, data, expected in rows:
        path, data = fill(path, world["ids"]), fill(data, world["ids"])
        for role, want in zip(ROLES, expected, strict=True):
            got = answer(world, role, method, path, data, token=token)
            if not matches(got, want):
                wrong.append(f"{method} {path} as {role}: {got}, table says {want}  [{route}]")
    return wrong


def admin_rows(world):
    rows = []
    # django-q2 registers its queue table (OrmQ) only with the ORM broker, not with Redis.
    registered = {f"{m._meta.app_label}/{m._meta.model_name}" for m in admin.site._registry}
    for model, (staff, superuser) in ADMIN_MODELS.items():
        if model not in registered:
            continue
        pk = world["objects"][model]
        for action, method, s, su in zip(
            ADMIN_ACTIONS, ADMIN_METHODS, staff, superuser, strict=True
        ):
            data = {"post": "yes"} if action.endswith("delete/") and method == "POST" else {}
            rows.append(
                (
                    f"admin/{model}/",
                    method,
                    f"/admin/{model}/{action.format(pk=pk)}",
                    data if method == "POST" else None,
                    (AL, AL, AL, s, su),
                )
            )
    return rows


# --- completeness: every pattern and operation has rows ---------------------------------------
def url_patterns(patterns=None, prefix=""):
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(pattern, URLResolver):
            yield from url_patterns(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield same_apps_in_any_order(prefix + str(pattern.pattern))


def same_apps_in_any_order(route):
    """The admin's app index lists its apps in the order their admin modules registered."""
    return re.sub(
        r"\(\?P<app_label>([^)]*)\)",
        lambda found: "(?P<app_label>" + "|".join(sorted(found.group(1).split("|"))) + ")",
        route,
    )


def api_operations():
    return {(path, method.upper()) for path, ops in openapi_paths().items() for method in ops}


def test_every_url_pattern_and_api_operation_has_rows():
    """Each page pattern has a GET and a POST row; each admin model a row; each API
    operation a row."""
    rows = {(route, method) for route, method, *_ in flat(PAGES) + flat(ADMIN_SITE)}
    api_routes = {re.sub(r"\{(\w+)\}", r"<\1>", path).lstrip("/") for path, _ in api_operations()}
    missing = []
    for route in url_patterns():
        model = re.match(r"admin/(\w+/\w+)/", route)
        if route in api_routes or (model and model.group(1) in ADMIN_MODELS):
            continue
        missing += [
            f"{method} {route}" for method in ("GET", "POST") if (route, method) not in rows
        ]
    assert missing == [], f"no row in the authorization tables for: {missing}"
    exercised = {(route_of(path), method) for path, method, _, _ in API}
    assert api_operations() - exercised == set(), "API operations without a row"


@pytest.mark.slow
@pytest.mark.django_db
def test_pages_answer_each_role_as_the_table_says(world):
    wrong = check_rows(world, flat(PAGES))
    assert wrong == [], "\n".join(wrong)


@pytest.mark.slow
@pytest.mark.django_db
def test_admin_answers_each_role_as_the_table_says(world):
    wrong = check_rows(world, flat(ADMIN_SITE) + admin_rows(world))
    assert wrong == [], "\n".join(wrong)


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize("token", [False, True], ids=["session", "bearer"])
def test_api_answers_each_role_as_the_table_says(world, token):
    rows = [(route_of(path), method, path, body, want) for path, method, body, want in API]
    wrong = check_rows(world, rows, token=token)
    assert wrong == [], "\n".join(wrong)


@pytest.mark.slow
@pytest.mark.django_db
def test_writes_need_a_csrf_token_with_a_session_but_not_with_a_bearer_token(world):
    """Every POST row of the tables and every API write, without a CSRF token: refused (403)
    for everyone with a session, and for anonymous on pages (a forge webhook, which a
    signature authenticates, refuses an unsigned delivery: 401); an anonymous API write is 401
    (it sent no credentials at all); with a Bearer token the API answers as its table says.
    An /api/ path that names no operation writes nothing: its JSON 404 comes first."""
    api_rows = [(route_of(path), method, path, body, want) for path, method, body, want in API]
    rows = flat(PAGES) + flat(ADMIN_SITE) + admin_rows(world) + api_rows
    wrong = []
    for route, method, path, data, expected in rows:
        if method == "GET":
            continue
        path, data = fill(path, world["ids"]), fill(data, world["ids"])
        for role, want in zip(ROLES, expected, strict=True):
            got = answer(world, role, method, path, data, client=BROWSER)
            no_operation = resolve(path.split("?")[0]).func is api_not_found
            unsigned = role == "anonymous" and route in openapi_paths()
            # A forge's webhook carries its forge's signature, not a session: no CSRF token.
            unsigned |= route.startswith("hooks/")
            if got != (404 if no_operation else 401 if unsigned else 403):
                wrong.append(f"{method} {path} as {role} without a CSRF token: {got}")
            if route in openapi_paths() and role != "anonymous":
                got = answer(world, role, method, path, data, token=True, client=BROWSER)
                if not matches(got, want):
                    wrong.append(f"{method} {path} as {role} with a token: {got}, not {want}")
    assert wrong == [], "\n".join(wrong)


@pytest.mark.django_db
def test_api_methods_an_operation_does_not_declare_are_405(world):
    declared = {}
    for path, method in api_operations():
        declared.setdefault(path, set()).add(method)
    wrong = []
    for path, methods in declared.items():
        concrete = re.sub(r"\{\w+\}", "gt-a", path)
        for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - methods:
            for role in ("anonymous", "superuser"):
                got = answer(world, role, method, concrete, token=True)
                if got != 405:
                    wrong.append(f"{method} {concrete} as {role}: {got}")
    assert wrong == []


# --- subscriptions and the inbox ---------------------------------------
@pytest.mark.django_db
def test_without_view_permission_nobody_subscribes_or_learns_which_convoys_exist(world):
    client = logged_in(world["users"]["none"])
    convoy = world["ids"]["convoy"]
    answers = [
        client.post(f"/convoys/{convoy}/subscribe/").status_code,
        client.post(f"/convoys/{MISSING}/subscribe/").status_code,
        client.post("/subscriptions/", {"convoy": convoy}).status_code,
        client.post("/subscriptions/", {"convoy": MISSING}).status_code,
        client.post("/subscriptions/", {}).status_code,  # every convoy
    ]
    assert answers == [403] * 5
    assert not Subscription.objects.filter(user=world["users"]["none"]).exists()


@pytest.mark.django_db
def test_subscribing_to_a_missing_convoy_is_404_not_500(world):
    client = logged_in(world["users"]["viewer"])
    assert client.post(f"/convoys/{MISSING}/subscribe/").status_code == 404
    assert client.post(f"/convoys/{MISSING}/unsubscribe/").status_code == 404
    assert not Subscription.objects.filter(user=world["users"]["viewer"]).exists()


@pytest.mark.django_db
def test_a_landing_report_reaches_only_subscribers_who_may_view(routes):
    users = role_users()
    bead("gt-l", "Secret plan")
    convoy = convoys.create("Landing", ["gt-l"], notify="none")
    for role in ("none", "viewer"):
        notify.subscribe(users[role], convoy)  # e.g. before the permission was taken away
    notify.subscribe(users["none"])  # and to every convoy
    beads.close_bead("gt-l")
    convoys.check(convoy.pk)
    assert [n.user.username for n in Notification.objects.filter(convoy=convoy)] == ["viewer"]
    assert "Secret plan" not in logged_in(users["none"]).get("/inbox/").content.decode()
    assert "Secret plan" in logged_in(users["viewer"]).get("/inbox/").content.decode()


@pytest.mark.django_db
def test_inbox_ignores_ids_that_are_not_row_numbers(world):
    root = world["users"]["superuser"]
    note = Notification.objects.get(user=root)
    client = logged_in(root)
    for bad_id in ["²", "9" * 5000, "-1", "1e3", ""]:  # '²' and 5,000 digits were 500s
        assert client.post("/inbox/", {"id": [bad_id]}).status_code == 302
        assert Notification.objects.get(pk=note.pk).read_at is None, bad_id  # nothing read
    client.post("/inbox/", {"id": [str(note.pk)]})
    assert Notification.objects.get(pk=note.pk).read_at is not None


# --- the live websocket (replay included) --------------------------------------------------------
def live_events(cookie, convoy):
    """Connect to every topic with a replay from 0: None if refused, else the events sent."""
    from convoyweb.asgi import application

    headers = [(b"host", b"localhost"), (b"origin", b"http://localhost")]
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    path = f"/ws/live/?topics=dashboard,convoy:{convoy},bead:gt-a,inbox&since=0"

    async def go():
        comm = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await comm.connect()
        if not connected:
            return None
        messages = []
        while not await comm.receive_nothing(timeout=1.0):
            messages.append(await comm.receive_json_from())
        await comm.disconnect()
        return [m for m in messages if m.get("type") == "event"]

    return async_to_sync(go)()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_live_topics_and_replay_follow_the_view_permission(world):
    got = {role: live_events(world["sessions"].get(role), world["ids"]["convoy"]) for role in ROLES}
    assert got["anonymous"] is None  # the handshake is refused
    assert got["none"] == []  # connected, but only to its own (empty) inbox
    for role in ("viewer", "staff", "superuser"):
        assert any(e.get("convoy_id") == world["ids"]["convoy"] for e in got[role]), role
    mine = [e for e in got["superuser"] if e["kind"] == "notification"]
    assert mine and all(e["data"]["user_id"] == world["users"]["superuser"].pk for e in mine)
    assert not [e for e in got["viewer"] if e["kind"] == "notification"]
