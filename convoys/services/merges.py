"""Landed means merged: record a bead's change as it is opened, merged or abandoned.

Every source calls `record`: the bead store (a `merge-request` bead naming its
`source_issue:`, or a bead closed "Merged in …"; `from_store`), forge webhooks
(`web/forge_hooks.py`) and the command line. One row per bead (`Merge`) and one event per
change of state:
- `merge.opened`: a change was submitted, or its CI state changed; nothing else moves;
- `bead.merged`: the change is in; handed to the cluster like a close, so it feeds what the
  merge unblocked (`merge-blocks`) and lands a convoy whose last merge it was;
- `merge.abandoned`: the change was closed without merge; the bead needs work again (it is
  reopened unless a bead store owns it) and the owners of the convoys tracking it are told.
Recording what is already recorded changes nothing, so a redelivered webhook or a second sync
pass is harmless.
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.db import IntegrityError, transaction
from django.utils import timezone

from convoys.core import merges as core
from convoys.core.forges import Report
from convoys.log import queue
from convoys.log.events import record as record_event
from convoys.models import CONVOY_CLOSED, Bead, Convoy, ForgeDelivery, Merge, SourcedRecord
from convoys.rules import merging
from convoys.services import beads as bead_service
from convoys.services import hooks, notify
from convoys.services.errors import NotFound, ServiceError

SOURCES = ("bd", "github", "gitlab", "gitea", "api", "cli")
STATES = (Merge.OPEN, Merge.MERGED, Merge.ABANDONED)
KIND_OF = {
    Merge.OPEN: "merge.opened",
    Merge.MERGED: "bead.merged",
    Merge.ABANDONED: "merge.abandoned",
}


FIELDS = ("ref", "link", "branch", "target", "ci", "reason")  # what a change says but its state


@dataclass(frozen=True)
class Change:
    """What a source says of one bead's change."""

    state: str  # open, merged or abandoned
    source: str
    ref: str = ""
    link: str = ""
    branch: str = ""
    target: str = ""
    ci: str = ""
    reason: str = ""

    @classmethod
    def of(cls, state: str, source: str, said: Any) -> "Change":
        """The change told by anything that holds FIELDS (a forge's report, an API body)."""
        return cls(state, source, **{name: getattr(said, name) for name in FIELDS})


def record(bead_id: str, change: Change, actor: str = "") -> bool:
    """Record `change` for the bead; True when it changed anything. An unknown bead is
    NotFound; a bad state or source a ServiceError."""
    if change.state not in STATES:
        raise ServiceError(f"merge state must be one of {', '.join(STATES)}, not {change.state!r}")
    if change.source not in SOURCES:
        raise ServiceError(f"merge source must be one of {', '.join(SOURCES)}")
    with transaction.atomic():
        bead = Bead.objects.select_for_update().filter(pk=bead_id).first()
        if bead is None:
            raise NotFound(f"bead '{bead_id}' not found")
        row = Merge.objects.filter(pk=bead_id).first()
        before = _fields(row)
        now = timezone.now()
        if row is None:
            row = Merge(bead_id=bead_id, opened_at=now)
        elif row.state == Merge.MERGED and change.state == Merge.OPEN:
            return False  # a late "opened" or CI report never undoes a merge
        row.state, row.source = change.state, change.source
        for name in FIELDS:
            value = getattr(change, name)
            if value:
                setattr(row, name, value[:255] if name not in ("link", "reason") else value)
        if change.state != Merge.ABANDONED:
            row.reason = ""
        if _fields(row) == before:
            return False
        row.updated_at = now
        row.save(force_insert=before is None)  # a new row: one INSERT, not UPDATE then INSERT
        state_changed = before is None or before["state"] != row.state
        kind = KIND_OF[row.state] if state_changed else "merge.opened"
        event = record_event(
            kind,
            bead_id=bead_id,
            actor=actor or change.source,
            data=_fields(row),
        )
        if kind == "bead.merged":
            queue.handle_closes_on_commit([event.seq])
            hooks.bead_event(
                "merged",
                bead,
                [],
                {"ref": row.ref, "link": row.link, "branch": row.branch, "target": row.target},
            )
        elif kind == "merge.abandoned":
            _needs_work(bead, row, actor or change.source, reopen=change.source != "bd")
    return True


def _fields(row: Merge | None) -> dict[str, Any] | None:
    """What the row says of the change (its event's data), None without a row."""
    if row is None:
        return None
    return {name: getattr(row, name) for name in ("state", "source", *FIELDS)}


def _needs_work(bead: Bead, row: Merge, actor: str, reopen: bool) -> None:
    """An abandoned change: the bead is reopened (`reopen`, and not a bead store's bead: the
    store says its status) and every unfinished convoy tracking it tells its owner."""
    sourced = SourcedRecord.objects.filter(pk=bead.pk).exists()
    if reopen and bead.status == "closed" and not sourced:
        bead_service.reopen_bead(bead.pk, actor=actor)
    why = row.reason or "closed without merge"
    for convoy in Convoy.objects.filter(tracked__bead_id=bead.pk).exclude(status=CONVOY_CLOSED):
        notify.notify_action_needed(
            convoy,
            f"{bead.pk}'s change was abandoned: {why}",
            f"The change for {bead.pk} ({row.branch or row.ref or row.source}) was closed "
            f"without merge: {why}.\nThe bead needs work again before {convoy.pk} can land.",
        )


# --- forge webhooks ------------------------------------------------------------------------------
class Received(NamedTuple):
    """What a forge delivery did: the beads it named and those whose change it changed."""

    duplicate: bool
    beads: list[str]
    recorded: list[str]


def receive(forge: str, delivery: str, report: Report) -> Received:
    """Record a forge delivery's change for every bead its texts name, and the delivery, in
    one transaction; a delivery id seen before changes nothing (`duplicate`)."""
    seen = Received(True, [], [])
    try:
        with transaction.atomic():
            if ForgeDelivery.objects.filter(forge=forge, delivery=delivery).exists():
                return seen
            beads = core.named_ids(report.texts, known_ids)
            change = Change.of(report.state, forge, report)
            actor = f"{forge}:{report.sender}" if report.sender else forge
            recorded = [b for b in _receiving(beads, report) if record(b, change, actor[:255])]
            ForgeDelivery.objects.create(
                forge=forge,
                delivery=delivery,
                received_at=timezone.now(),
                outcome=_outcome(report, beads, recorded),
            )
    except IntegrityError:  # the same delivery, received by another process at once
        return seen
    return Received(False, beads, recorded)


def _receiving(beads: list[str], report: Report) -> list[str]:
    """The beads a report may change: a CI report never revives an abandoned change."""
    if not report.only_ci or not beads:
        return beads
    abandoned = set(
        Merge.objects.filter(pk__in=beads, state=Merge.ABANDONED).values_list("pk", flat=True)
    )
    return [b for b in beads if b not in abandoned]


def _outcome(report: Report, beads: list[str], recorded: list[str]) -> str:
    if not beads:
        return f"{report.state}: no known bead named"
    what = report.state + (f", ci {report.ci}" if report.ci else "")
    line = f"{what}: {', '.join(beads)}; changed {', '.join(recorded) or 'nothing'}"
    return line if len(line) <= 500 else line[:499] + "…"


# --- the bead store ------------------------------------------------------------------------------
def from_store(bead_ids: Collection[str] | None = None, actor: str = "bd") -> dict[str, int]:
    """Record what the bead store says of merges, for the beads among `bead_ids` (every bead
    with None): each `merge-request` bead naming a `source_issue:`, by its status and close
    reason; each bead closed with a reason that merges it ("Merged in …"). Returns
    {outcome: n} of the merge requests read ("merged", "abandoned", "open", "undecided",
    "no source": their source issue is not in the store) and "recorded": changes made."""
    counts = {"merged": 0, "abandoned": 0, "open": 0, "undecided": 0, "no source": 0}
    recorded = 0
    requests = Bead.objects.filter(issue_type="merge-request")
    if bead_ids is not None:
        requests = requests.filter(pk__in=list(bead_ids))
    rows = list(
        requests.order_by("updated_at", "id").values_list(
            "id", "status", "close_reason", "description"
        )
    )
    wanted: list[tuple[str, Change]] = []
    for request_id, status, reason, description in rows:
        fields = core.mr_fields(description)
        change = _store_change(request_id, status, reason, fields)
        counts[change.state if change else "undecided"] += 1
        if change and fields.get("source_issue"):
            wanted.append((fields["source_issue"], change))
    known = _existing([bead_id for bead_id, _ in wanted])
    for bead_id, change in _final(wanted).items():
        if bead_id not in known:
            counts["no source"] += 1
            continue
        recorded += record(bead_id, change, actor)
    recorded += _self_merged(bead_ids, actor)
    return counts | {"recorded": recorded}


def _final(changes: Sequence[tuple[str, Change]]) -> dict[str, Change]:
    """Each bead's one change from its merge requests, oldest first: the latest decides,
    except that a merge stays merged (a later stale request's cleanup undoes no merge).
    Recording only this, not every request in turn, keeps a second pass from toggling."""
    final: dict[str, Change] = {}
    for bead_id, change in changes:
        if final.get(bead_id, change).state != Merge.MERGED or change.state == Merge.MERGED:
            final[bead_id] = change
    return final


def _store_change(
    request_id: str, status: str, reason: str, fields: dict[str, str]
) -> Change | None:
    base = {"source": "bd", "ref": request_id, "branch": fields.get("branch", "")}
    base["target"] = fields.get("target", "")
    if status != "closed":
        return Change(Merge.OPEN, **base) if status != "tombstone" else None
    outcome = merging.outcome_of(reason)
    if not outcome:
        return None
    return Change(outcome, reason=reason if outcome == Merge.ABANDONED else "", **base)


def _self_merged(bead_ids: Collection[str] | None, actor: str) -> int:
    beads = Bead.objects.filter(status="closed").exclude(issue_type="merge-request")
    if bead_ids is not None:
        beads = beads.filter(pk__in=list(bead_ids))
    merged = Merge.objects.filter(state=Merge.MERGED).values("bead_id")
    own = beads.filter(merging.merged_q()).exclude(pk__in=merged)
    recorded = 0
    for bead_id, reason in own.values_list("id", "close_reason"):
        recorded += record(bead_id, Change(Merge.MERGED, "bd", ref=reason[:255]), actor)
    return recorded


def _existing(bead_ids: Sequence[str]) -> set[str]:
    found: set[str] = set()
    for start in range(0, len(bead_ids), 500):
        part = list(bead_ids[start : start + 500])
        found |= set(Bead.objects.filter(pk__in=part).values_list("pk", flat=True))
    return found


def known_ids(candidates: Sequence[str]) -> set[str]:
    """Those of `candidates` that are beads in the store (for `core.merges.named_ids`)."""
    return _existing(candidates)
