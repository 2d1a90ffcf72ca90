"""Sling: dispatch beads by hand. One bead gets an auto-convoy `Work: <title>`; several get one
convoy `Batch: N beads to <rig>` (refused when a bead is already tracked by an open convoy)."""

from django.db import transaction
from django.utils import timezone

from ..events import record
from ..models import CONVOY_OPEN, Bead, Convoy, Rig, TrackedBead, bead_prefix
from . import dispatch
from .convoys import new_convoy_id, tracking_open_convoy
from .errors import ServiceError
from .rigs import route_map


def resolve_rig(bead_ids, routes=None):
    routes = route_map() if routes is None else routes
    resolved, seen = None, []
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


def sling(bead_ids, rig=None, *, no_convoy=False, owned=False, merge="", force=False, actor="cli"):
    if not bead_ids:
        raise ServiceError("give at least one bead id")
    beads = Bead.objects.in_bulk(bead_ids)
    for bead_id in bead_ids:
        if bead_id not in beads:
            raise ServiceError(f"bead '{bead_id}' not found")
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
        if beads[bead_id].status in ("closed", "tombstone"):
            raise ServiceError(f"bead {bead_id} is closed (work already completed)")
    convoy = None
    if not no_convoy:
        convoy = _convoy_for(bead_ids, beads, rig, owned, merge, actor)
    results = []
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
                }
            )
            continue
        result = dispatch.dispatch(bead, convoy_id=convoy.pk if convoy else "", path=path)
        results.append(
            result
            or {
                "id": bead_id,
                "rig": rig,
                "worker": "",
                "ok": False,
                "error": "claimed by another dispatcher",
            }
        )
    return convoy, rig, results


def _convoy_for(bead_ids, beads, rig, owned, merge, actor):
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
def _create(title, description, bead_ids, owned, merge, actor):
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
