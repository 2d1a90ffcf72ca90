"""Sling: dispatch beads by hand. One bead gets an auto-convoy `Work: <title>`; several get one
convoy `Batch: N beads to <rig>` (refused when a bead is already tracked by an open convoy).
A convoy id expands to its tracked beads: each ready one is dispatched, the rest are listed
with the reason; the convoy is the container, so no new convoy is made (Gas City's container
expansion). Epics and other non-slingable types are refused, and so is a bead whose blockers
are open unless --force (the original dispatches them, a known bug of its sling).
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, NotRequired, TypedDict

from django.db import transaction
from django.utils import timezone

from convoys.log.events import record
from convoys.models import (
    ACTIVE_WORK_STATUSES,
    CONVOY_OPEN,
    Bead,
    Convoy,
    Rig,
    TrackedBead,
    bead_prefix,
)
from convoys.rules import breaker, capacity
from convoys.rules.readiness import blocked_by, ready_beads
from convoys.services import dispatch
from convoys.services.convoys import get_convoy, new_convoy_id, tracking_open_convoy
from convoys.services.errors import ServiceError
from convoys.services.launch import Skipped, why_not_ready
from convoys.services.rigs import route_map


class SlingResult(TypedDict):
    """A dispatch result (dispatch.DispatchResult) with whether --force sent it past open
    blockers; a bead refused before its dispatch has no title."""

    id: str
    title: NotRequired[str]
    rig: str | None
    worker: str
    ok: bool
    error: str
    forced: bool


class Slung(NamedTuple):
    convoy: Convoy | None  # None with no_convoy
    rig: str | None
    results: list[SlingResult]


class SlungConvoy(NamedTuple):
    convoy: Convoy
    results: list[SlingResult]
    skipped: list[Skipped]


def resolve_rig(
    bead_ids: Sequence[str], routes: Mapping[str, str | None] | None = None
) -> str | None:
    routes = route_map() if routes is None else routes
    resolved: str | None = None
    seen: list[tuple[str, str, str]] = []
    for bead_id in bead_ids:
        prefix = bead_prefix(bead_id)
        if not prefix:
            raise ServiceError(
                f"cannot resolve rig for {bead_id}: no valid prefix\n\n  Options:\n"
                f"    1. Specify the rig explicitly:\n         sling {' '.join(bead_ids)} <rig>\n"
                f"    2. Check the bead ID is correct:\n         beads show {bead_id}"
            )
        rig = routes.get(prefix)
        if not rig:
            raise ServiceError(
                f'cannot resolve rig for {bead_id}: prefix "{prefix}" is not mapped to any rig\n\n'
                "  The prefix may belong to a town-level bead or the routes are not configured.\n\n"
                f"  Options:\n    1. Specify the rig explicitly: sling {' '.join(bead_ids)} <rig>\n"
                f"    2. Add a route: rigs route {prefix} <rig>\n    3. Check the bead ID is correct"
            )
        seen.append((bead_id, prefix, rig))
        if resolved is None:
            resolved = rig
        elif rig != resolved:
            listing = "\n".join(f"    {i} (prefix {p}) -> {r}" for i, p, r in seen)
            raise ServiceError(
                f"beads resolve to different rigs:\n\n{listing}\n\n  All beads in a batch sling "
                "must target the same rig.\n\n  Options:\n    1. Sling each rig's beads "
                "separately\n    2. Specify the target rig explicitly"
            )
    return resolved


def is_convoy(sling_id: str) -> bool:
    return Convoy.objects.filter(pk=sling_id).exists()


def refuse_unslingable(beads: Iterable[Bead]) -> None:
    """Epics (stage them), other non-slingable types, and closed beads, in argument order."""
    for bead in beads:
        if bead.issue_type == "epic":
            raise ServiceError(
                f"'{bead.pk}' is an epic: epics are staged, not slung: `convoy stage {bead.pk}` "
                f"(or `convoy launch {bead.pk}` to stage it and dispatch Wave 1)"
            )
        if not bead.is_slingable:
            raise ServiceError(
                f"'{bead.pk}' has non-slingable type \"{bead.issue_type}\" "
                "(only task, bug, feature and chore beads are slung)"
            )
        if bead.is_done:
            raise ServiceError(f"bead {bead.pk} is closed (work already completed)")


def refuse_paused(paused: Sequence[str], what: str) -> None:
    """A paused convoy is fed by no path; say so, rather than "claimed by another"."""
    if paused:
        raise ServiceError(
            f"{what} paused convoy {paused[0]}: nothing is dispatched until "
            f"`convoy resume {paused[0]}`"
        )


def sling(
    bead_ids: Sequence[str],
    rig: str | None = None,
    *,
    no_convoy: bool = False,
    owned: bool = False,
    merge: str = "",
    force: bool = False,
    actor: str = "cli",
) -> Slung:
    if not bead_ids:
        raise ServiceError("give at least one bead id")
    beads = Bead.objects.in_bulk(bead_ids)
    for bead_id in bead_ids:
        if bead_id not in beads:
            if is_convoy(bead_id):
                raise ServiceError(
                    f"'{bead_id}' is a convoy: sling it on its own (`sling {bead_id}`) to "
                    "dispatch its tracked beads"
                )
            raise ServiceError(f"bead '{bead_id}' not found")
    refuse_unslingable(beads[b] for b in bead_ids)
    routes = route_map()
    if rig:
        if not Rig.objects.filter(pk=rig).exists():
            raise ServiceError(f"rig '{rig}' not found")
        for bead_id in bead_ids:
            own = routes.get(bead_prefix(bead_id))
            if own and own != rig and not force:
                raise ServiceError(
                    f'bead {bead_id} (prefix "{bead_prefix(bead_id)}") belongs to rig "{own}", '
                    f'but target is "{rig}"\n  Options: drop the bead, sling it to {own}, or '
                    "use --force"
                )
    else:
        rig = resolve_rig(bead_ids, routes)
    rig_row = Rig.objects.get(pk=rig)
    if rig_row.state != Rig.ACTIVE and not force:
        raise ServiceError(
            f"rig {rig} is {rig_row.state}: use `rigs un{rig_row.state[:-2]} {rig}` or --force"
        )
    for bead_id in bead_ids:
        refuse_paused(dispatch.paused_convoys(bead_id), f"cannot sling {bead_id}: it is in")
        failures = beads[bead_id].dispatch_failures
        if failures >= breaker.max_failures():
            raise ServiceError(
                f"cannot sling {bead_id}: parked after {failures} failed dispatches in a row; "
                f"fix the cause, then `beads retry {bead_id}`"
            )
    blockers = blocked_by(bead_ids)
    if blockers and not force:
        raise ServiceError(
            "\n".join(
                f"bead {b} has open blockers: {', '.join(blockers[b])}"
                for b in bead_ids
                if b in blockers
            )
            + "\n  Dispatch it when its blockers close, or use --force to dispatch anyway"
        )
    convoy = None
    if not no_convoy:
        convoy = _convoy_for(bead_ids, beads, rig, owned, merge, actor)
    results: list[SlingResult] = []
    path = "batch" if len(bead_ids) > 1 else "manual"
    for bead_id in bead_ids:
        bead = Bead.objects.get(pk=bead_id)
        if bead.rig_id != rig:
            bead.rig_id = rig  # an explicit --force target wins for this dispatch
        if bead.status != "open" or bead.assignee:
            results.append(
                {
                    "id": bead_id,
                    "rig": rig,
                    "worker": bead.assignee,
                    "ok": False,
                    "error": f"already {bead.status}"
                    + (f" ({bead.assignee})" if bead.assignee else ""),
                    "forced": False,
                }
            )
            continue
        forced = bead_id in blockers
        result = dispatch.dispatch(
            bead, convoy_id=convoy.pk if convoy else "", path=path, forced=forced
        )
        if result is None:  # the claim was refused
            results.append(
                {
                    "id": bead_id,
                    "rig": rig,
                    "worker": "",
                    "ok": False,
                    "error": dispatch.refusal(bead, convoy.pk if convoy else ""),
                    "forced": forced,
                }
            )
        else:
            results.append({**result, "forced": forced})
    return Slung(convoy, rig, results)


def sling_convoy(convoy_id: str, *, force: bool = False, actor: str = "cli") -> SlungConvoy:
    """Container expansion: claim every ready tracked bead (blocked ones too with --force),
    in tracking order, up to the convoy's max in flight, then run the dispatcher for each
    claim (a failure releases only its own). Returns (convoy, results, skipped)."""
    claims: list[dispatch.Claim] = []
    skipped: list[Skipped] = []
    with transaction.atomic():
        if capacity.cap():
            capacity.lock_town()  # before the convoy's row lock, as every claim takes them
        convoy = get_convoy(convoy_id, lock=True)
        if convoy.is_staged:
            raise ServiceError(
                f"convoy {convoy.pk} is staged ({convoy.status}): launch it with "
                f"`convoy launch {convoy.pk}`"
            )
        if convoy.status != CONVOY_OPEN:
            raise ServiceError(f"convoy {convoy.pk} is {convoy.status}")
        refuse_paused([convoy.pk] if convoy.paused_at else [], "cannot sling")
        ids = list(TrackedBead.objects.filter(convoy=convoy).values_list("bead_id", flat=True))
        if not ids:
            raise ServiceError(f"convoy {convoy.pk} tracks no beads")
        tracked = Bead.objects.filter(pk__in=ids)
        beads = tracked.in_bulk()
        ready = {b.pk: b for b in ready_beads(tracked, blockers=not force)}
        blockers = blocked_by(ids)
        cooling = breaker.cooling_down(ids)
        room = None
        if convoy.max_in_flight:
            busy = tracked.filter(status__in=ACTIVE_WORK_STATUSES).count()
            room = max(convoy.max_in_flight - busy, 0)
        for bead_id in ids:
            bead = beads.get(bead_id)
            if bead_id not in ready or bead_id in cooling:
                reason = why_not_ready(bead, {} if force else blockers, cooling)
            elif room is not None and len(claims) >= room:
                reason = f"convoy at max in flight ({convoy.max_in_flight})"
            else:
                assert bead is not None  # a ready bead is one of the tracked beads read above
                won = dispatch.claim(
                    bead, convoy_id=convoy.pk, path="batch", actor=actor, forced=bead_id in blockers
                )
                if won:
                    claims.append(won)
                    continue
                reason = dispatch.refusal(bead, convoy.pk)
            skipped.append({"id": bead_id, "reason": reason})
    results: list[SlingResult] = [
        {**dispatch.run(claim), "forced": claim.bead_id in blockers} for claim in claims
    ]
    return SlungConvoy(convoy, results, skipped)


def _convoy_for(
    bead_ids: Sequence[str],
    beads: Mapping[str, Bead],
    rig: str | None,
    owned: bool,
    merge: str,
    actor: str,
) -> Convoy:
    if len(bead_ids) == 1:
        existing = tracking_open_convoy(bead_ids[0])
        if existing:
            return existing
        title = beads[bead_ids[0]].title
        if title.startswith("-") and " " not in title:
            raise ServiceError(
                f'refusing to create convoy: bead title "{title}" looks like a CLI flag'
            )
        return _create(
            f"Work: {title}",
            f"Auto-created convoy tracking {bead_ids[0]}",
            bead_ids,
            owned,
            merge,
            actor,
        )
    for bead_id in bead_ids:
        existing = tracking_open_convoy(bead_id)
        if existing:
            raise ServiceError(
                f"cannot create batch convoy: {bead_id} is already tracked by convoy {existing.pk}"
            )
    return _create(
        f"Batch: {len(bead_ids)} beads to {rig}",
        f"Auto-created convoy tracking {len(bead_ids)} beads",
        bead_ids,
        owned,
        merge,
        actor,
    )


@transaction.atomic
def _create(
    title: str, description: str, bead_ids: Sequence[str], owned: bool, merge: str, actor: str
) -> Convoy:
    now = timezone.now()
    convoy = Convoy.objects.create(
        id=new_convoy_id(),
        title=title,
        description=description,
        status=CONVOY_OPEN,
        owned=owned,
        merge_strategy=merge,
        created_by=actor,
        created_at=now,
        updated_at=now,
        labels=["gt:owned"] if owned else [],
    )
    TrackedBead.objects.bulk_create(
        [TrackedBead(convoy=convoy, bead_id=b, position=i) for i, b in enumerate(bead_ids)]
    )
    record(
        "convoy.created",
        convoy_id=convoy.pk,
        actor=actor,
        data={"status": convoy.status, "title": title, "tracked": list(bead_ids)},
    )
    return convoy
