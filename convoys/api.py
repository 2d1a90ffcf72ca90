"""The JSON API under /api/, with its OpenAPI schema at /api/openapi.json.

Built on django-ninja: typed request/response schemas generate the OpenAPI document and
validate input before a view runs (bad input never reaches a service), with less machinery
than DRF for an API of this size. Workers and tools use `Authorization: Bearer <token>`
(`manage.py tokens create`); browsers use their session (with CSRF).

One module, though long: django-ninja builds one schema from one router, and the request and
response schemas sit beside the endpoint that uses them; each endpoint calls a service or a
read model and holds no rule of its own.
"""

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import wraps
from typing import Annotated, Any, Literal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import RequestDataTooBig
from django.db import DataError, InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI, Schema, Swagger
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.params.functions import Query as query  # what ninja.Query(...) calls, typed for mypy
from ninja.parser import Parser
from ninja.security import HttpBearer, SessionAuth
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from convoys.core.formatting import person
from convoys.core.parsing import NotJson, json_document
from convoys.models import Bead, Convoy, SourcedRecord
from convoys.read import bead_page, dashboard, graph, pages, search, summaries
from convoys.rules import causes, forecasting, merging
from convoys.services import (
    actions,
    batch,
    controls,
    escalation,
    feeding,
    launch,
    merges,
    staging,
    tokens,
    worklog,
)
from convoys.services import beads as bead_service
from convoys.services.errors import NotFound, ServiceError
from convoys.web.access import database_unavailable


class BearerToken(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> AbstractBaseUser | None:
        user = tokens.authenticate(token)
        if user is not None:
            request.user = user
        return user


class SessionCookie(SessionAuth):
    """Django's session, checked for CSRF only when the request carries a session cookie: a
    request without one is not signed in (401 with WWW-Authenticate), not a forged one (403)."""

    def _get_key(self, request: HttpRequest) -> str | None:
        if settings.SESSION_COOKIE_NAME not in request.COOKIES:
            return None
        return super()._get_key(request)


def docs_need_login(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The docs page and the OpenAPI document are for signed-in people and token holders:
    anonymous browsers go to the login page, anonymous tools get 401."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.user.is_authenticated or BearerToken()(request) is not None:
            return view(request, *args, **kwargs)
        if request.path.endswith(".json"):
            return JsonResponse({"detail": "Unauthorized"}, status=401)
        return redirect_to_login(request.get_full_path())

    return guarded


class JsonBody(Parser):
    """Request bodies read by the one rule for JSON from clients (convoys/core/parsing.py): a body
    nested 100,000 deep is refused, not a RecursionError."""

    def parse_body(self, request: HttpRequest) -> Any:
        return json_document(request.body)


class LocalSwagger(Swagger):
    """Swagger UI from ninja's own template and static files (settings.NINJA_FILES): no CDN,
    works offline and under the Content Security Policy. ninja picks its local template only
    when "ninja" is an installed app, which would make every command import ninja and
    pydantic at start-up; this page renders it without that."""

    def render_page(self, request: HttpRequest, api: NinjaAPI, **kwargs: Any) -> HttpResponse:
        self.settings["url"] = self.get_openapi_url(api, kwargs)
        context = {
            "swagger_settings": json.dumps(self.settings, indent=1),
            "api": api,
            "add_csrf": True,  # signed-in users try requests with their session (SessionCookie)
        }
        return render(request, self.template, context)


# No online validator badge: on any host but localhost it would load an image from validator.swagger.io, telling it where our schema is.
api = NinjaAPI(
    title="convoyweb API",
    version="1",
    auth=[BearerToken(), SessionCookie()],
    urls_namespace="api",
    docs=LocalSwagger(settings={"validatorUrl": None}),
    docs_decorator=docs_need_login,
    parser=JsonBody(),
)


@csrf_exempt  # it writes nothing; a client's POST gets this JSON, not the CSRF failure page
def api_not_found(request: HttpRequest) -> JsonResponse:
    """A path under /api/ that names no operation (an empty id, a '/' in one)."""
    return JsonResponse({"detail": f"no API operation at {request.path[:200]}"}, status=404)


@api.exception_handler(AuthenticationError)
def not_signed_in(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    response = api.create_response(request, {"detail": "Unauthorized"}, status=401)
    response["WWW-Authenticate"] = 'Bearer realm="convoyweb"'  # a token, or the session cookie
    return response


@api.exception_handler(HttpError)
def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # As ninja answers, and for a body it cannot read ("Cannot parse request body") why not.
    detail = str(exc)
    if isinstance(exc.__cause__, NotJson):
        detail = f"{detail}: {exc.__cause__}"
    return api.create_response(request, {"detail": detail}, status=exc.status_code)


@api.exception_handler(NotFound)
def not_found(request: HttpRequest, exc: NotFound) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc)}, status=404)


@api.exception_handler(DataError)
def refused_by_database(request: HttpRequest, exc: DataError) -> HttpResponse:
    # A value the database cannot store (a NUL byte on PostgreSQL, say): the statement failed
    # inside its transaction, so nothing was written.
    return api.create_response(request, {"detail": f"invalid input: {exc}".strip()}, status=400)


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def database_unreachable(request: HttpRequest, exc: Exception) -> HttpResponse:
    # The database is down: 503 in this API's shape, with DEBUG on too (ninja would answer
    # its traceback). Any other error of the database is a bug, raised as it was.
    response = database_unavailable(request, exc)
    if response is None:
        raise exc
    return response


@api.exception_handler(RequestDataTooBig)
def too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    # Django's DATA_UPLOAD_MAX_MEMORY_SIZE: refused before the body is parsed.
    return api.create_response(request, {"detail": f"request body too large: {exc}"}, status=413)


@api.exception_handler(ValidationError)
def malformed(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = [{**error, "loc": client_loc(error["loc"])} for error in exc.errors]
    return api.create_response(request, {"detail": errors}, status=422)


def client_loc(loc: Sequence[str | int]) -> list[str | int]:
    """A body field's place as the client wrote it, ["body", "reason"], without the view's
    parameter name in between (ninja says ["body", "payload", "reason"])."""
    loc = list(loc)
    return [loc[0], *loc[2:]] if loc[:2] == ["body", "payload"] else loc


@api.exception_handler(ServiceError)
def refused(request: HttpRequest, exc: ServiceError) -> HttpResponse:
    detail = exc.explained("api")
    return api.create_response(request, {"detail": detail}, status=400)


def need(request: HttpRequest, perm: str) -> None:
    if not request.user.has_perm(f"convoys.{perm}"):
        raise HttpError(403, f"permission required: convoys.{perm}")


class Progress(Schema):
    total: int
    done: int
    skipped: int = 0  # closed as not needed (`beads skip`): not done
    submitted: int = 0  # closed, waiting for their merge (merge strategy mr): not done
    active: int
    ready: int
    blocked: int
    unknown: int
    failed: int  # last dispatch failed, not running
    percent: int  # percent of tracked beads done, 100 only when all are
    stranded: bool
    spin: bool


class ConvoyOut(Schema):
    id: str
    title: str
    status: str
    owner: str
    merge_strategy: str  # direct, mr (a closed bead is done once merged) or local
    due_at: datetime | None = None  # when it should land
    # on-track, at-risk or overdue (what the deadline scan told and the clock; "" no due time)
    deadline: str = ""
    source: str | None = None  # the sync source its record comes from
    missing_from_source: bool = False
    created_at: datetime
    closed_at: datetime | None
    close_reason: str
    progress: Progress


class TaskOut(Schema):
    id: str
    title: str
    status: str
    rig: str
    blocked_by: list[str]


class WaveOut(Schema):
    number: int
    tasks: list[TaskOut]


class WindowOut(Schema):
    offset: int
    limit: int
    total: int  # tracked beads in all
    next: int | None  # the next window's offset (None: this is the last)


class ConvoyDetailOut(ConvoyOut):
    tracked: list[dict[str, Any]]
    waves: list[WaveOut]
    gated: list[str]
    paused: dict[str, Any] | None  # who, when, why, dispatches since the pause (None: not paused)
    causes: dict[str, int] = {}  # unfinished beads per cause kind (each tracked bead: "cause")
    # stuck since, reminders sent, causes, acknowledged (None: never)
    escalation: dict[str, Any] | None
    window: WindowOut  # which tracked beads this answer lists


class BeadOut(Schema):
    id: str
    title: str
    status: str
    issue_type: str
    priority: int
    assignee: str
    rig: str | None
    close_reason: str
    updated_at: datetime
    source: str | None = None  # the sync source it comes from (then it is changed in bd)
    missing_since: datetime | None = None  # since when that source no longer has it
    ready: bool | None = None
    blocked_by: list[str] | None = None
    cause: dict[str, Any] | None = (
        None  # why it is not moving: {"kind": …, …} (detail; None when done)
    )
    # Every dispatch attempt, newest first (detail): when, path, rig, worker, outcome, output.
    attempts: list[dict[str, Any]] | None = None


def plain_text(value: str) -> str:
    """Text any database stores as sent: no NUL character, no lone surrogate (a JSON
    escape such as \\ud800 is not a character and cannot be encoded)."""
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(f"lone surrogate at position {exc.start}: not Unicode text") from None
    return value


_plain = AfterValidator(plain_text)
Text = Annotated[str, _plain]
# Text of a bounded length (checked as a string: "at most 50 characters").
TextUpTo50 = Annotated[str, StringConstraints(max_length=50), _plain]
TextUpTo100 = Annotated[str, StringConstraints(max_length=100), _plain]
TextUpTo255 = Annotated[str, StringConstraints(max_length=255), _plain]
TextUpTo500 = Annotated[str, StringConstraints(max_length=500), _plain]
NonEmptyText = Annotated[str, StringConstraints(min_length=1), _plain]
NonEmptyUpTo50 = Annotated[str, StringConstraints(min_length=1, max_length=50), _plain]
NonEmptyUpTo255 = Annotated[str, StringConstraints(min_length=1, max_length=255), _plain]


class Body(BaseModel):
    """A request body: a JSON object whose values have exactly the declared types (no
    coercion: `true` is not a priority, `"1"` is not a number), and no unknown fields.
    Plain pydantic rather than ninja's Schema, which reads attributes off any value
    (the string "hello world" had a `.title`)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def json_object(cls, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return data


class BeadUpdateIn(Body):
    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    status: NonEmptyUpTo50 | None = None
    assignee: TextUpTo255 | None = None
    priority: int | None = Field(None, ge=0, le=4)
    title: NonEmptyText | None = None
    force: bool = False  # with status "closed": close it though its blockers are not done


class CloseIn(Body):
    reason: Text = ""
    force: bool = False  # close it though its blockers are not done


class HeartbeatIn(Body):
    worker: NonEmptyUpTo255


class LogIn(Body):
    lines: list[Text] = Field(min_length=1)  # cut to CONVOY_LOG_LINE_CHARS each


class LogLineOut(Schema):
    id: int
    at: datetime
    text: str


class StageIn(Body):
    ids: list[Text] = Field(min_length=1)
    title: Text | None = None
    merge: Literal["direct", "mr", "local", ""] = ""  # "": keep it, or the town's default
    due: TextUpTo50 | None = None  # when it should land: RFC 3339 with its zone


class MergeIn(Body):
    """A bead's change as a tool reports it: submitted (open), merged or abandoned."""

    state: Literal["open", "merged", "abandoned"]
    ref: TextUpTo255 = ""  # a commit, "PR #12"
    link: TextUpTo500 = ""
    branch: TextUpTo255 = ""
    target: TextUpTo255 = ""
    ci: TextUpTo50 = ""
    reason: TextUpTo500 = ""  # why it was abandoned


class LaunchIn(StageIn):
    force: bool = False


class Detail(Schema):
    detail: str


class ValidationErrors(Schema):
    detail: list[dict[str, Any]]


def responses(ok: Any, *errors: int) -> dict[int, Any]:
    """An operation's documented answers: its success, the errors it raises, and what any
    operation may answer (400 a value the database refuses, 401 no credentials, 403 no
    permission, 422 malformed input)."""
    return {
        200: ok,
        400: Detail,
        401: Detail,
        403: Detail,
        422: ValidationErrors,
        **dict.fromkeys(errors, Detail),
    }


def _convoy_out(convoy: Convoy, summary: summaries.Summary) -> dict[str, Any]:
    return {
        "id": convoy.id,
        "title": convoy.title,
        "status": convoy.status,
        "owner": person(convoy.owner),
        "merge_strategy": merging.strategy(convoy),
        "due_at": convoy.due_at,
        "deadline": forecasting.told_state(convoy, timezone.now()),
        "created_at": convoy.created_at,
        "closed_at": convoy.closed_at,
        "close_reason": convoy.close_reason,
        "progress": {
            "total": summary["total"],
            "done": summary["done"],
            "skipped": summary["skipped"],
            "submitted": summary["submitted"],
            "active": summary["active"],
            "ready": summary["ready"],
            "blocked": summary["blocked"],
            "unknown": summary["unknown"],
            "failed": summary["failed"],
            "stranded": summary["stranded"],
            "spin": summary["spin"],
            "percent": summary["percent_complete"],
        },
    }


def _bead_out(
    bead: Bead, detail: bool = False, origins: dict[str, SourcedRecord] | None = None
) -> dict[str, Any]:
    if origins is None:
        origins = SourcedRecord.of([bead.pk])
    origin = origins.get(bead.pk)
    data = {
        "id": bead.id,
        "title": bead.title,
        "status": bead.status,
        "issue_type": bead.issue_type,
        "priority": bead.priority,
        "assignee": bead.assignee,
        "rig": bead.rig_id,
        "close_reason": bead.close_reason,
        "updated_at": bead.updated_at,
        "source": origin.source if origin else None,
        "missing_since": origin.missing_since if origin else None,
    }
    if detail:
        state = bead_page.bead_state(bead)  # as the bead page shows it
        data |= {
            "ready": state.ready,
            "blocked_by": state.blocked_by,
            "cause": causes.jsonable(state.cause),
            "attempts": [a.as_json() for a in bead_page.attempts(bead.pk)],
        }
    return data


@api.get("/convoys", response=responses(list[ConvoyOut]), tags=["convoys"])
def list_convoys(
    request: HttpRequest,
    status: TextUpTo50 = "active",
    limit: int = query(200, ge=1, le=1000),
) -> list[dict[str, Any]]:
    need(request, "view_convoy")
    problem = dashboard.status_filter_problem(status)
    if problem:  # in the shape of every 422: where, and what is wrong
        raise ValidationError([{"loc": ["query", "status"], "msg": problem, "type": "value_error"}])
    queryset = dashboard.convoys_with_status(status).order_by("-created_at", "id")
    rows = list(queryset[:limit])
    by_convoy = summaries.convoy_summaries(rows)
    return [_convoy_out(c, by_convoy[c.pk]) for c in rows]


class ConvoyActionsIn(Body):
    action: Literal["pause", "resume", "acknowledge"]
    ids: Annotated[
        list[Annotated[str, StringConstraints(max_length=64), _plain]],
        Field(min_length=1, max_length=batch.MAX_IDS),
    ]
    reason: TextUpTo500 = ""


class ConvoyActionOut(Schema):
    id: str
    result: Literal["done", "unchanged", "refused"]
    detail: str


class ConvoyActionsOut(Schema):
    action: str
    done: int
    unchanged: int
    refused: int
    summary: str
    results: list[ConvoyActionOut]


@api.post("/convoys/actions", response=responses(ConvoyActionsOut, 413), tags=["convoys"])
def convoy_actions(request: HttpRequest, payload: ConvoyActionsIn) -> dict[str, Any]:
    """Pause, resume or acknowledge several convoys, each in its own transaction: a refusal
    of one (closed, not escalated, unknown) is reported beside the others, which are done."""
    need(request, batch.PERMISSIONS[payload.action])
    done = batch.run(
        payload.action, payload.ids, actor=f"api:{request.user}", reason=payload.reason
    )
    return {
        "action": done.action,
        **{result: len(done.ids(result)) for result in ("done", "unchanged", "refused")},
        "summary": done.summary,
        "results": [o.as_json() for o in done.outcomes],
    }


@api.get("/convoys/{convoy_id}", response=responses(ConvoyDetailOut, 404), tags=["convoys"])
def get_convoy(
    request: HttpRequest,
    convoy_id: Text,
    offset: int = query(0, ge=0, le=10**9),
    limit: int = query(500, ge=1, le=1000),
) -> dict[str, Any]:
    """A convoy with a window of its tracked beads (`offset`, `limit`, in position order):
    `tracked`, `waves` and `gated` list the window's beads; counts cover every bead; `window`
    says where the next one starts (`next`: null on the last)."""
    need(request, "view_convoy")
    convoy = Convoy.objects.filter(pk=convoy_id).first()
    if convoy is None:
        raise NotFound(f"convoy '{convoy_id}' not found")
    found, summary, waves = graph.wave_tasks(convoy)
    status = summaries.convoy_status_json(convoy, slice(offset, offset + limit))
    shown = {t["id"] for t in status["tracked"]}
    total = status["total"]
    return {
        **_convoy_out(convoy, summary),
        "source": status["source"],
        "missing_from_source": status["missing_from_source"],
        "tracked": [{k: v for k, v in t.items() if k != "worker_seen"} for t in status["tracked"]],
        "waves": [
            {**wave, "tasks": tasks}
            for wave in waves
            if (tasks := [t for t in wave["tasks"] if t["id"] in shown])
        ],
        "gated": [g.id for g in found.gated if g.id in shown],
        "paused": controls.pause_json(convoy),
        "causes": status["causes"],
        "escalation": escalation.state_json(convoy),
        "window": {
            "offset": offset,
            "limit": limit,
            "total": total,
            "next": offset + limit if offset + limit < total else None,
        },
    }


@api.get("/beads", response=responses(list[BeadOut]), tags=["beads"])
def list_beads(
    request: HttpRequest,
    status: TextUpTo50 | None = None,
    rig: TextUpTo100 | None = None,
    assignee: TextUpTo255 | None = None,
    q: TextUpTo500 | None = None,  # SQLite refuses LIKE patterns over 50 kB
    ready: bool = False,
    limit: int = query(200, ge=1, le=2000),
) -> list[dict[str, Any]]:
    need(request, "view_bead")
    rows = pages.find_beads(
        status=status, rig=rig, assignee=assignee, q=q, ready=ready, limit=limit
    )
    origins = SourcedRecord.of(b.pk for b in rows)
    return [_bead_out(b, origins=origins) for b in rows]


class ActionsIn(Body):
    """One action on several beads (docs/actions.md)."""

    action: Literal["retry", "skip", "release", "reassign", "reopen"]
    ids: list[TextUpTo255] = Field(min_length=1, max_length=settings.CONVOY_ACTION_MAX_BEADS)
    reason: TextUpTo500 = ""
    dry_run: bool = False  # say what it would do, change nothing
    rig: TextUpTo100 = ""  # reassign: to this rig
    worker: TextUpTo255 = ""  # reassign: to this worker


class ActionOutcome(Schema):
    id: str
    ok: bool  # done (dry run: would be)
    words: str  # what it does, or why it is refused
    refused: str
    ready: list[str]  # beads it makes ready
    lands: list[str]  # convoys it lands
    stays_open: list[str]
    told: str  # the dispatcher's release hook's answer, when a worker was told


class ActionsOut(Schema):
    action: str
    dry_run: bool
    done: int
    refused: int
    summary: str  # "3 skipped, 1 refused (gt-x: gt-x is closed)"
    outcomes: list[ActionOutcome]
    fed: list[str]  # dispatched by the feed pass after the batch


@api.post("/beads/actions", response=responses(ActionsOut, 413), tags=["beads"])
def bead_actions(request: HttpRequest, payload: ActionsIn) -> dict[str, Any]:
    """Retry, skip, release, reassign or reopen several beads: each bead in its own
    transaction (a refusal is an outcome; the rest are applied), then one feed. With
    `dry_run` the same steps run and are rolled back: the preview."""
    need(request, "change_bead")
    return actions.run(
        payload.action,
        payload.ids,
        actor=f"api:{request.user}",
        reason=payload.reason,
        dry_run=payload.dry_run,
        rig=payload.rig,
        worker=payload.worker,
    ).as_json()


class SearchHitOut(Schema):
    kind: str  # bead, epic, convoy or rig
    id: str
    title: str
    status: str
    url: str


class SearchOut(Schema):
    q: str
    total: int  # beads and convoys matched, counted up to 1,001
    offset: int
    next: int | None  # the offset of the next page, if any
    hits: list[SearchHitOut]


# Longer text is refused by name; within it only the first terms count (core/search_terms.py).
SearchText = Annotated[str, StringConstraints(max_length=20_000), _plain]


@api.get("/search", response=responses(SearchOut), tags=["search"])
def search_all(
    request: HttpRequest,
    q: SearchText = "",
    limit: int = query(10, ge=1, le=search.MAX_LIMIT),
    offset: int = query(0, ge=0, le=search.MAX_OFFSET),
) -> dict[str, Any]:
    """Beads, epics, convoys and rigs by id (a prefix: `gt-a` finds `gt-abc`), title, label,
    assignee or description, best first. Any text is searched as plain words."""
    need(request, "view_convoy")
    found = search.search(q, limit=limit, offset=offset)
    return {
        "q": q,
        "total": found.total,
        "offset": found.offset,
        "next": found.next_offset,
        "hits": [h.as_json() for h in found.hits],
    }


@api.get("/beads/{bead_id}", response=responses(BeadOut, 404), tags=["beads"])
def get_bead(request: HttpRequest, bead_id: Text) -> dict[str, Any]:
    need(request, "view_bead")
    return _bead_out(bead_service.get_bead(bead_id), detail=True)


@api.patch("/beads/{bead_id}", response=responses(BeadOut, 404, 413), tags=["beads"])
def update_bead(request: HttpRequest, bead_id: Text, payload: BeadUpdateIn) -> dict[str, Any]:
    need(request, "change_bead")
    fields = {k: v for k, v in payload.model_dump(exclude={"force"}).items() if v is not None}
    if not fields:
        raise ServiceError("nothing to update: give status, assignee, priority or title")
    return _bead_out(
        bead_service.update_bead(
            bead_id, actor=f"api:{request.user}", force=payload.force, **fields
        )
    )


@api.post("/beads/{bead_id}/close", response=responses(BeadOut, 404, 413), tags=["beads"])
def close_bead(request: HttpRequest, bead_id: Text, payload: CloseIn) -> dict[str, Any]:
    need(request, "change_bead")
    return _bead_out(
        bead_service.close_bead(
            bead_id, reason=payload.reason, actor=f"api:{request.user}", force=payload.force
        )
    )


@api.post("/heartbeat", response=responses(dict, 413), tags=["workers"])
def heartbeat(request: HttpRequest, payload: HeartbeatIn) -> dict[str, str]:
    need(request, "change_bead")
    return {"worker": payload.worker, "at": bead_service.heartbeat(payload.worker).at.isoformat()}


@api.get("/stranded", response=responses(list[dict[str, Any]]), tags=["convoys"])
def stranded(request: HttpRequest) -> list[dict[str, Any]]:
    need(request, "view_convoy")
    return [{k: v for k, v in row.items()} for row in feeding.stranded()]


@api.post("/stage", response={**responses(dict, 404, 413), 400: dict}, tags=["convoys"])
def stage(request: HttpRequest, payload: StageIn) -> tuple[int, dict[str, Any]]:
    """200 with the plan, or 400 with the plan and `detail` when its errors refused staging."""
    need(request, "add_convoy")
    plan = staging.stage(
        payload.ids,
        payload.title,
        actor=f"api:{request.user}",
        merge=payload.merge,
        due=payload.due,
    )
    if plan.errors:
        return 400, {"detail": plan.refusal, **plan.as_json()}
    return 200, plan.as_json()


@api.post("/launch", response=responses(dict, 404, 413), tags=["convoys"])
def launch_convoy(request: HttpRequest, payload: LaunchIn) -> dict[str, Any]:
    need(request, "change_convoy")
    return launch.launch(
        payload.ids,
        force=payload.force,
        title=payload.title,
        actor=f"api:{request.user}",
        merge=payload.merge,
    ).as_json()


class PauseIn(Body):
    reason: TextUpTo500 = ""


@api.post("/convoys/{convoy_id}/pause", response=responses(dict, 404, 413), tags=["convoys"])
def pause_convoy(request: HttpRequest, convoy_id: Text, payload: PauseIn) -> dict[str, Any]:
    """Stop every path from dispatching the convoy's beads; answers the proof."""
    need(request, "change_convoy")
    convoy, changed = controls.pause(convoy_id, actor=f"api:{request.user}", reason=payload.reason)
    return {"id": convoy.pk, "changed": changed, "paused": controls.pause_json(convoy)}


# The body of an operation that takes none: nothing, or an empty object.
NO_BODY = {
    "requestBody": {
        "required": False,
        "content": {"application/json": {"schema": {"type": "object", "maxProperties": 0}}},
    }
}


def no_body(request: HttpRequest) -> None:
    """422, nothing done, for a body an operation does not take ({"actor": 7} was accepted and
    the convoy acknowledged: a client that thinks it sent something must hear it was not read)."""
    body: Any
    if request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded"):
        body = {} if not (request.POST or request.FILES) else None
    elif raw := request.body.strip():
        try:
            body = json_document(raw)
        except NotJson as exc:
            body = exc
    else:
        body = {}
    if body != {}:
        msg = "this operation takes no body (send nothing or {})"
        if isinstance(body, NotJson):
            msg += f"; this one is {body}"
        raise ValidationError([{"loc": ["body"], "msg": msg, "type": "extra_forbidden"}])


@api.post(
    "/convoys/{convoy_id}/resume",
    response=responses(dict, 404),
    tags=["convoys"],
    openapi_extra=NO_BODY,
)
def resume_convoy(request: HttpRequest, convoy_id: Text) -> dict[str, Any]:
    """Resume a paused convoy and feed it at once; answers what that feed dispatched."""
    need(request, "change_convoy")
    no_body(request)
    convoy, changed, fed = controls.resume(convoy_id, actor=f"api:{request.user}")
    return {"id": convoy.pk, "changed": changed, "dispatched": fed}


@api.post(
    "/convoys/{convoy_id}/ack",
    response=responses(dict, 404),
    tags=["convoys"],
    openapi_extra=NO_BODY,
)
def acknowledge_convoy(request: HttpRequest, convoy_id: Text) -> dict[str, Any]:
    """Acknowledge a stuck convoy's escalation: no more reminders until it moves and stalls
    again. 400 when it is not escalated now."""
    need(request, "view_convoy")
    no_body(request)
    found, changed = escalation.acknowledge(convoy_id, actor=f"api:{request.user}")
    return {"id": convoy_id, "changed": changed, "escalation": found.as_json()}


@api.post("/beads/{bead_id}/merge", response=responses(dict, 404, 413), tags=["beads"])
def report_merge(request: HttpRequest, bead_id: Text, payload: MergeIn) -> dict[str, Any]:
    """Report a bead's change: `open` (submitted, or its CI state), `merged` (a convoy merging
    by mr counts the bead done and may land) or `abandoned` (the bead needs work again).
    Reporting the same twice changes nothing (`changed`: false)."""
    need(request, "change_bead")
    change = merges.Change.of(payload.state, "api", payload)
    changed = merges.record(bead_id, change, actor=f"api:{request.user}")
    return {"id": bead_id, "changed": changed, "merge": summaries.merge_of(bead_id)}


@api.post(
    "/beads/{bead_id}/retry", response=responses(dict, 404), tags=["beads"], openapi_extra=NO_BODY
)
def retry_bead(request: HttpRequest, bead_id: Text) -> dict[str, Any]:
    """Clear a bead the dispatch breaker parked: every path may dispatch it again."""
    need(request, "change_bead")
    no_body(request)
    bead, changed = controls.retry(bead_id, actor=f"api:{request.user}")
    return {"id": bead.pk, "changed": changed, "dispatch_failures": bead.dispatch_failures}


@api.post("/beads/{bead_id}/log", response=responses(dict, 404, 413), tags=["workers"])
def append_log(request: HttpRequest, bead_id: Text, payload: LogIn) -> dict[str, Any]:
    """A worker appends lines to its bead's log (the oldest dropped past the bounds)."""
    need(request, "change_bead")
    done = worklog.append(bead_id, payload.lines, actor=f"api:{request.user}")
    return {"id": bead_id, **done._asdict()}


@api.get("/beads/{bead_id}/log", response=responses(list[LogLineOut], 404), tags=["beads"])
def read_log(
    request: HttpRequest, bead_id: Text, after: int = query(0, ge=0, le=2**63 - 1)
) -> list[dict[str, Any]]:
    """The bead's kept log lines after line id `after`, oldest first."""
    need(request, "view_bead")
    if not bead_page.exists(bead_id):
        raise NotFound(f"bead '{bead_id}' not found")
    return [{"id": x.pk, "at": x.at, "text": x.text} for x in bead_page.log_after(bead_id, after)]
