"""Convoy lifecycle: ids, the status transition rule, create, add, check, close, land (its
notification claimed once per completion), and watching a convoy from the CLI.

Completion: at least one tracked bead and every tracked bead done; a tracked bead
that is not in the database is "unknown" and never done.
"""

import re
import secrets
import string
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypedDict

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Exists, Max, OuterRef
from django.utils import timezone

from convoys.core import parsing
from convoys.core.ids import name_problem, target_problem, unwrap_external
from convoys.log.events import record
from convoys.models import (
    COMPLETED_REASON,
    CONVOY_CLOSED,
    CONVOY_OPEN,
    CONVOY_STATUSES,
    DONE_STATUSES,
    LANDED_REASON,
    SLINGABLE_TYPES,
    Bead,
    Convoy,
    Dependency,
    Subscription,
    TrackedBead,
)
from convoys.rules import merging
from convoys.services import notify as notify_service  # `close` has a `notify` argument
from convoys.services.errors import NeedsForce, NotFound, ServiceError

if TYPE_CHECKING:
    from django.contrib.auth.models import User

BASE36 = string.digits + string.ascii_lowercase
EMPTY_REASON = "Empty convoy (0 tracked issues)"

TRANSITIONS: dict[str, set[str]] = {
    "open": {"open", "closed"},
    "closed": {"closed", "open"},
    "staged_ready": {"open", "closed", "staged_ready", "staged_warnings"},
    "staged_warnings": {"open", "closed", "staged_ready", "staged_warnings"},
}

# A convoy's tracked beads in tracking order: (tracked id, its Bead, or None when unknown).
Pairs = list[tuple[str, Bead | None]]


class Progress(TypedDict):
    total: int
    done: int
    submitted: int  # closed, waiting for their merge (`merging`): not done
    unknown: int  # tracked ids no bead in the database has
    complete: bool  # at least one tracked bead, and every one done


class Checked(NamedTuple):
    convoy: Convoy
    closed: bool  # this check landed it
    progress: Progress


class Added(NamedTuple):
    convoy: Convoy
    added: list[str]  # ids now tracked (those already tracked are left out)
    reopened: bool  # it was closed


class Closed(NamedTuple):
    convoy: Convoy
    changed: bool  # False: it was closed already
    still_open: Pairs  # the tracked beads not done when it closed


class Landed(NamedTuple):
    convoy: Convoy
    changed: bool  # False: closed already, or a dry run
    released: list[str]  # the workers released (that would be, on a dry run)


def normalize_status(raw: str | None) -> str:
    status = (raw or "").strip().lower()
    if status not in CONVOY_STATUSES:
        raise ServiceError(
            f'unsupported convoy status "{raw}" (expected "open", "closed", "staged_ready", '
            'or "staged_warnings")'
        )
    return status


def check_transition(current: str, target: str) -> str:
    """The one transition rule. Raises ServiceError when the move is illegal."""
    cur, tgt = normalize_status(current), normalize_status(target)
    if tgt not in TRANSITIONS[cur]:
        raise ServiceError(f'illegal convoy status transition "{current}" -> "{target}"')
    return tgt


def new_convoy_id() -> str:
    for _ in range(50):
        candidate = "hq-cv-" + "".join(secrets.choice(BASE36) for _ in range(5))
        if not Convoy.objects.filter(pk=candidate).exists():
            return candidate
    raise ServiceError("could not find a free convoy id")


def get_convoy(convoy_id: str, lock: bool = False) -> Convoy:
    queryset = Convoy.objects.select_for_update() if lock else Convoy.objects
    try:
        return queryset.get(pk=convoy_id)
    except Convoy.DoesNotExist:
        if Bead.objects.filter(pk=convoy_id).exists():
            bead_type = Bead.objects.get(pk=convoy_id).issue_type
            raise ServiceError(f"'{convoy_id}' is not a convoy (type: {bead_type})")
        raise NotFound(f"convoy '{convoy_id}' not found")


def set_status(
    convoy: Convoy,
    target: str,
    *,
    reason: str = "",
    actor: str = "",
    kind: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> Convoy:
    """Move a convoy through the transition table and record the event."""
    target = check_transition(convoy.status, target)
    old = convoy.status
    now = timezone.now()
    convoy.status = target
    convoy.updated_at = now
    if target == CONVOY_CLOSED:
        convoy.closed_at = convoy.closed_at if old == CONVOY_CLOSED else now
        convoy.close_reason = reason or convoy.close_reason
    else:
        convoy.closed_at = None
        convoy.close_reason = ""
    if old == CONVOY_CLOSED and target == CONVOY_OPEN:
        convoy.completion_notified_at = None
    convoy.save()
    kind = kind or {
        (CONVOY_CLOSED, CONVOY_OPEN): "convoy.reopened",
    }.get((old, target), "convoy.closed" if target == CONVOY_CLOSED else "convoy.status")
    record(
        kind,
        convoy_id=convoy.id,
        actor=actor,
        data={
            "status": target,
            "old_status": old,
            "title": convoy.title,
            "reason": convoy.close_reason,
            **(data or {}),
        },
    )
    return convoy


def tracked_details(convoys: Collection[Convoy | str]) -> dict[str, Pairs]:
    """{convoy_id: [(tracked bead id, Bead or None)]} in tracking order (two queries)."""
    rows = list(
        TrackedBead.objects.filter(convoy__in=convoys).order_by("convoy_id", "position", "id")
    )
    beads = Bead.objects.in_bulk({row.bead_id for row in rows})
    result: dict[str, Pairs] = {c.pk if isinstance(c, Convoy) else c: [] for c in convoys}
    for row in rows:
        result.setdefault(row.convoy_id, []).append((row.bead_id, beads.get(row.bead_id)))
    return result


def progress(pairs: Sequence[tuple[str, Bead | None]]) -> Progress:
    total = len(pairs)
    waiting = submitted_of(pairs)
    done = sum(
        1
        for i, bead in pairs
        if bead is not None and bead.status in DONE_STATUSES and i not in waiting
    )
    unknown = sum(1 for _, bead in pairs if bead is None)
    return {
        "total": total,
        "done": done,
        "submitted": len(waiting),
        "unknown": unknown,
        "complete": total > 0 and done == total,
    }


def submitted_of(pairs: Sequence[tuple[str, Bead | None]]) -> set[str]:
    """The ids among tracked `pairs` that are closed and wait for their merge."""
    closed = [i for i, bead in pairs if bead is not None and bead.status == "closed"]
    return merging.awaiting_among(closed)


def unfinished(pairs: Sequence[tuple[str, Bead | None]]) -> list[tuple[str, Bead | None]]:
    """The tracked `pairs` not done: open, unknown, or closed and waiting for their merge."""
    waiting = submitted_of(pairs)
    return [(i, b) for i, b in pairs if b is None or b.status not in DONE_STATUSES or i in waiting]


def is_complete(convoy: Convoy) -> bool:
    """It tracks at least one bead and every tracked bead is done (an unknown one is not, nor
    one waiting for its merge): `progress`'s rule as one query, whatever the convoy's size."""
    tracked = TrackedBead.objects.filter(convoy=convoy)
    done = Bead.objects.filter(pk=OuterRef("bead_id"), status__in=DONE_STATUSES).exclude(
        merging.awaiting_q()
    )
    return tracked.exists() and not tracked.filter(~Exists(done)).exists()


def looks_like_issue_id(text: str) -> bool:
    if re.match(r"^[a-z]{2,3}-", text):
        return True
    # No id holds a NUL (and PostgreSQL refuses one in a lookup): such a name is a title.
    return "\x00" not in text and Bead.objects.filter(pk=text).exists()


@transaction.atomic
def create(
    name: str,
    bead_ids: Iterable[str] = (),
    *,
    owner: str = "",
    notify: str = "",
    owned: bool = False,
    merge: str = "",
    base_branch: str = "",
    molecule: str = "",
    from_epic: str | None = None,
    actor: str = "",
    max_in_flight: int | None = None,
    due: str | datetime | None = None,
) -> Convoy:
    """`convoy create`: name + beads, or `--from-epic` (slingable leaves, sub-epics recursed);
    `due`: when it should land (`due_at`)."""
    due_at = due_time_of(due)
    ids = list(bead_ids)
    if merge and merge not in Convoy.MERGE_STRATEGIES:
        raise ServiceError(f'invalid --merge value "{merge}": must be direct, mr, or local')
    if from_epic:
        epic = Bead.objects.filter(pk=from_epic).first()
        if epic is None:
            raise NotFound(f"bead '{from_epic}' not found")
        if epic.issue_type != "epic":
            raise ServiceError(
                f"'{from_epic}' is not an epic (type: {epic.issue_type}); "
                "--from-epic only works with epic beads"
            )
        ids = epic_leaves(from_epic) + ids
        if not ids:
            raise ServiceError(
                f"epic '{from_epic}' has no slingable children (task, bug, feature, chore)"
            )
        name = name or epic.title
    elif name and looks_like_issue_id(name):
        ids = [name, *ids]
        first = Bead.objects.filter(pk=name).first()
        name = first.title if first else f"Tracking {name}"
    if not name:
        raise ServiceError("convoy name required (or give bead ids, or --from-epic)")
    if name.startswith("-") and " " not in name:
        raise ServiceError(f'refusing to create convoy: name "{name}" looks like a CLI flag')
    now = timezone.now()
    convoy = Convoy.objects.create(
        id=new_convoy_id(),
        title=name,
        status=CONVOY_OPEN,
        owner=owner or actor,
        notify=notify,
        owned=owned,
        merge_strategy=merge,
        base_branch=base_branch,
        molecule=molecule,
        created_by=actor,
        created_at=now,
        updated_at=now,
        description=f"Convoy tracking {len(ids)} issues",
        max_in_flight=max_in_flight,
        labels=["gt:owned"] if owned else [],
        due_at=due_at,
    )
    record(
        "convoy.created",
        convoy_id=convoy.id,
        actor=actor,
        data={"status": convoy.status, "title": convoy.title, "owner": convoy.owner},
    )
    if ids:
        _track(convoy, ids, actor)
    return convoy


def epic_leaves(epic_id: str) -> list[str]:
    """BFS down parent-child: slingable children are tracked leaves, others are recursed."""
    leaves: list[str] = []
    queue, seen = [epic_id], {epic_id}
    while queue:
        children = list(
            Dependency.objects.filter(depends_on_id__in=queue, type="parent-child")
            .values_list("issue_id", "issue__issue_type")
            .order_by("issue_id")
        )
        queue = []
        for child, child_type in children:
            if child in seen:
                continue
            seen.add(child)
            if (child_type or "") in SLINGABLE_TYPES:
                leaves.append(child)
            else:
                queue.append(child)
    return leaves


def _track(
    convoy: Convoy,
    bead_ids: Iterable[str],
    actor: str,
    data: Mapping[str, Any] | None = None,
) -> list[str]:
    start = (TrackedBead.objects.filter(convoy=convoy).aggregate(m=Max("position"))["m"] or 0) + 1
    added = []
    for offset, raw in enumerate(bead_ids):
        problem = target_problem(raw)
        if problem:
            raise ServiceError(f"bead id {ascii(raw)[:80]} {problem}")
        bead_id = unwrap_external(raw.strip())
        try:
            with transaction.atomic():
                TrackedBead.objects.create(
                    convoy=convoy,
                    bead_id=bead_id,
                    position=start + offset,
                    raw_target=raw if raw != bead_id else "",
                )
            added.append(bead_id)
        except IntegrityError:
            continue
    if added:
        record(
            "convoy.tracked",
            convoy_id=convoy.id,
            actor=actor,
            data={"added": added, "title": convoy.title, "status": convoy.status, **(data or {})},
        )
    return added


@transaction.atomic
def add(
    convoy_id: str,
    bead_ids: Collection[str],
    actor: str = "",
    data: Mapping[str, Any] | None = None,
) -> Added:
    """Track more beads; a closed convoy reopens and its landing stamp is cleared. `data` is
    added to the convoy.tracked event (e.g. why the beads joined)."""
    convoy = get_convoy(convoy_id, lock=True)
    normalize_status(convoy.status)
    if not bead_ids:
        raise ServiceError("give at least one bead id to add")
    reopened = False
    if convoy.status == CONVOY_CLOSED:
        set_status(convoy, CONVOY_OPEN, actor=actor)
        reopened = True
    added = _track(convoy, bead_ids, actor, data)
    return Added(convoy, added, reopened)


def close_if_complete(convoy: Convoy, *, dry_run: bool = False, actor: str = "feeder") -> bool:
    """Check: close a complete open (or staged) convoy and land it. Returns True if closed."""
    with transaction.atomic():
        convoy = get_convoy(convoy.pk, lock=True)
        if convoy.status == CONVOY_CLOSED:
            return False
        if not is_complete(convoy):
            return False
        if dry_run:
            return True
        set_status(
            convoy, CONVOY_CLOSED, reason=COMPLETED_REASON, actor=actor, kind="convoy.landed"
        )
    notify_landing(convoy)
    return True


def notify_landing(convoy: Convoy) -> list[Any]:
    """Claim the completion stamp with one conditional update; only the winner notifies."""
    with transaction.atomic():
        now = timezone.now()
        won = Convoy.objects.filter(pk=convoy.pk, completion_notified_at__isnull=True).update(
            completion_notified_at=now
        )
        if won != 1:
            return []
        convoy.refresh_from_db()
        return notify_service.notify_landed(convoy, tracked_details([convoy])[convoy.pk], now)


def check(
    convoy_id: str | None = None, *, dry_run: bool = False, actor: str = "cli"
) -> list[Checked]:
    """`convoy check`: one convoy or every open one. Returns [(convoy, closed?, progress)]."""
    if convoy_id:
        convoys = [get_convoy(convoy_id)]
    else:
        convoys = list(Convoy.objects.filter(status=CONVOY_OPEN).order_by("id"))
    details = tracked_details(convoys)
    results: list[Checked] = []
    for convoy in convoys:
        info = progress(details[convoy.pk])
        closed = False
        if convoy.status != CONVOY_CLOSED and info["complete"]:
            closed = close_if_complete(convoy, dry_run=dry_run, actor=actor)
        elif convoy.status == CONVOY_CLOSED:
            if convoy.close_reason == COMPLETED_REASON and not dry_run:
                notify_landing(convoy)  # a missed notification is sent once
        results.append(Checked(convoy, closed, info))
    return results


def close(
    convoy_id: str, *, reason: str = "", force: bool = False, actor: str = "cli", notify: str = ""
) -> Closed:
    """Close a convoy (open issues need `force`). A completion lands it (subscribers told);
    `notify` names one more address told that it closed, with the reason."""
    if notify:
        problem = name_problem(notify) or ("" if notify.strip() else "must not be blank")
        if problem:
            raise ServiceError(f"--notify address {problem}")
        if not notify_service.address_recipients([notify]):
            raise ServiceError(f"--notify {notify}: that user may not view convoys")
    with transaction.atomic():
        convoy = get_convoy(convoy_id, lock=True)
        if convoy.status == CONVOY_CLOSED:
            return Closed(convoy, False, [])
        check_transition(convoy.status, CONVOY_CLOSED)
        pairs = tracked_details([convoy])[convoy.pk]
        still_open = unfinished(pairs)
        if still_open and not force:
            lines = [
                f"    {'▶' if b and b.status in ('in_progress', 'hooked') else '○'} {i}"
                if b is None or b.status != "closed"
                else f"    ◐ {i} (waiting to merge)"
                for i, b in still_open
            ]
            raise NeedsForce(
                f"convoy has {len(still_open)} open issue(s)\n" + "\n".join(lines), "close"
            )
        reason = reason or ("Force closed" if force else COMPLETED_REASON)
        set_status(convoy, CONVOY_CLOSED, reason=reason, actor=actor)
    if reason == COMPLETED_REASON:
        notify_landing(convoy)
    if notify:
        notify_service.notify_closed(convoy, notify)
    return Closed(convoy, True, still_open)


def land(
    convoy_id: str, *, force: bool = False, actor: str = "cli", dry_run: bool = False
) -> Landed:
    """Owned convoys only: close with "Landed by owner", release workers, notify. A dry run
    makes every check and changes nothing."""
    with transaction.atomic():
        convoy = get_convoy(convoy_id, lock=True)
        if not convoy.owned:
            raise ServiceError(
                f"convoy '{convoy_id}' is not an owned convoy\n  Only convoys created with "
                "--owned can be landed.\n  Use `convoy close` instead for non-owned convoys."
            )
        if convoy.status == CONVOY_CLOSED:
            return Landed(convoy, False, [])
        pairs = tracked_details([convoy])[convoy.pk]
        waiting = submitted_of(pairs)
        still_open = [i for i, b in unfinished(pairs) if i not in waiting]
        if waiting and not force:
            raise NeedsForce(
                f"convoy has {len(waiting)} bead(s) waiting to merge: "
                + ", ".join(i for i, _ in pairs if i in waiting),
                "land",
            )
        if still_open and not force:
            raise NeedsForce(
                f"convoy has {len(still_open)} open issue(s): {', '.join(still_open)}", "land"
            )
        released = sorted({b.assignee for _, b in pairs if b is not None and b.assignee})
        if dry_run:
            return Landed(convoy, False, released)
        set_status(
            convoy,
            CONVOY_CLOSED,
            reason=LANDED_REASON,
            actor=actor,
            kind="convoy.landed",
            data={"released_workers": released},
        )
    notify_landing(convoy)
    return Landed(convoy, True, released)


def tracking_open_convoy(bead_id: str) -> Convoy | None:
    """The open convoy tracking `bead_id`, if any (staged convoys do not count)."""
    return (
        Convoy.objects.filter(status=CONVOY_OPEN, tracked__bead_id=bead_id).order_by("id").first()
    )


EDITABLE = (
    "title",
    "description",
    "owner",
    "notify",
    "owned",
    "merge_strategy",
    "base_branch",
    "molecule",
    "max_in_flight",
    "close_reason",
    "due_at",
)


def due_time_of(due: str | datetime | None) -> datetime | None:
    """A due time given as text (`--due`, a form, the API) or a time; "" or None: none."""
    if due is None or due == "":
        return None
    if isinstance(due, datetime):
        if timezone.is_naive(due):
            raise ServiceError("due time has no time zone")
        return due
    try:
        return parsing.due_time(due)
    except ValueError as exc:
        raise ServiceError(f"--due {exc}") from None


@transaction.atomic
def update_fields(convoy_id: str, *, actor: str = "", **fields: Any) -> Convoy:
    """Change a convoy's descriptive fields (not its status) with one convoy.updated event."""
    unknown = set(fields) - set(EDITABLE)
    if unknown:
        raise ServiceError(f"cannot update convoy field(s): {', '.join(sorted(unknown))}")
    if "title" in fields and not (fields["title"] or "").strip():
        raise ServiceError("convoy title must not be empty")
    merge = fields.get("merge_strategy")
    if merge and merge not in Convoy.MERGE_STRATEGIES:
        raise ServiceError(f'invalid merge strategy "{merge}": must be direct, mr, or local')
    limit = fields.get("max_in_flight")
    if limit is not None and not (isinstance(limit, int) and limit >= 1):
        raise ServiceError(f"max_in_flight must be at least 1 (or empty), got {limit!r}")
    if "due_at" in fields:
        fields["due_at"] = due_time_of(fields["due_at"])
    convoy = get_convoy(convoy_id, lock=True)
    changes: dict[str, list[Any]] = {}
    for name, value in fields.items():
        if getattr(convoy, name) != value:
            changes[name] = [_stored(getattr(convoy, name)), _stored(value)]
            setattr(convoy, name, value)
    if "due_at" in changes:
        convoy.deadline = ""  # a new due time: told afresh
    if not changes:
        return convoy
    if "owned" in changes:
        others = [label for label in convoy.labels if label != "gt:owned"]
        convoy.labels = ["gt:owned", *others] if convoy.owned else others
    convoy.updated_at = timezone.now()
    convoy.save()
    record(
        "convoy.updated",
        convoy_id=convoy.id,
        actor=actor,
        data={"status": convoy.status, "title": convoy.title, "changes": changes},
    )
    return convoy


def _stored(value: Any) -> Any:
    """A value as the event's data keeps it (times as RFC 3339 text)."""
    return value.isoformat() if isinstance(value, datetime) else value


@transaction.atomic
def reopen(convoy_id: str, actor: str = "") -> Convoy:
    """closed -> open; the landing stamp is cleared so a new completion notifies again."""
    convoy = get_convoy(convoy_id, lock=True)
    if convoy.status != CONVOY_CLOSED:
        raise ServiceError(f"convoy '{convoy_id}' is not closed (status: {convoy.status})")
    return set_status(convoy, CONVOY_OPEN, actor=actor)


@transaction.atomic
def untrack(convoy_id: str, bead_ids: Iterable[str], actor: str = "") -> list[str]:
    """Stop tracking beads (the beads themselves are untouched). Returns the ids removed."""
    convoy = get_convoy(convoy_id, lock=True)
    wanted = {unwrap_external(raw.strip()) for raw in bead_ids}
    rows = TrackedBead.objects.filter(convoy=convoy, bead_id__in=wanted)
    removed = sorted(rows.values_list("bead_id", flat=True))
    missing = sorted(wanted - set(removed))
    if missing:
        raise NotFound(f"convoy '{convoy.id}' does not track {', '.join(missing)}")
    rows.delete()
    record(
        "convoy.untracked",
        convoy_id=convoy.id,
        actor=actor,
        data={"removed": removed, "title": convoy.title, "status": convoy.status},
    )
    return removed


def watch(
    username: str, convoy_id: str, email: bool = False
) -> Literal["subscribed", "updated", "already_watching"]:
    """`convoy watch`: subscribe a user who may view convoys (as the web does). Returns
    "subscribed", "updated" (the e-mail choice changed) or "already_watching"."""
    convoy = get_convoy(convoy_id)
    user = _user(username)
    if not (user.is_active and user.has_perm("convoys.view_convoy")):
        raise ServiceError(f"user '{username}' may not view convoys: nothing to watch")
    existing = Subscription.objects.filter(user=user, convoy=convoy).first()
    if existing and existing.email == email:
        return "already_watching"
    notify_service.subscribe(user, convoy, email=email)
    return "updated" if existing else "subscribed"


def unwatch(username: str, convoy_id: str) -> bool:
    """`convoy unwatch`: True if the user was watching the convoy."""
    convoy = get_convoy(convoy_id)
    return bool(notify_service.unsubscribe(_user(username), convoy))


def _user(username: str) -> "User":
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"user '{username}' not found")
    return user
