"""Test data: beads, dependencies, epics and convoys built through the services, and the shapes
several test modules build on (chains, big convoys, generated times)."""

import re
from datetime import datetime, timedelta
from datetime import timezone as utc_offset

import pytest
from django.utils import timezone
from hypothesis import strategies as st

from convoys.infra import bulk
from convoys.models import (
    Bead,
    Convoy,
    Dependency,
    Dispatch,
    Event,
    TrackedBead,
)
from convoys.read import projection
from convoys.services import (
    beads,
    escalation,
    staging,
)
from convoys.services.launch import launch_staged


def bead(bead_id, title=None, *, type="task", status="open", priority=2, assignee=""):
    created = beads.create_bead(
        title or f"Bead {bead_id}",
        bead_id=bead_id,
        issue_type=type,
        priority=priority,
        assignee=assignee,
        actor="test",
    )
    if status != "open":
        created = beads.update_bead(bead_id, status=status, actor="test")
    return created


def blocks(blocker, blocked, dep_type="blocks"):
    """`blocker` blocks `blocked` (blocked depends on blocker)."""
    return beads.add_dependency(blocked, blocker, dep_type, actor="test")


def imported_blocks(blocker, blocked):
    """A blocking dependency as an import of a bd export may bring it: unchecked (a cycle,
    which the services refuse and staging must catch)."""
    from django.utils import timezone

    from convoys.models import Dependency

    return Dependency.objects.create(
        issue_id=blocked, depends_on_id=blocker, type="blocks", created_at=timezone.now()
    )


def child(parent, kid):
    return beads.add_dependency(kid, parent, "parent-child", actor="test")


def epic_of(epic_id, kids, title="Epic"):
    """An epic with task children."""
    bead(epic_id, title, type="epic")
    for kid in kids:
        bead(kid)
        child(epic_id, kid)


def staged_on_parked_rig():
    """gt-epic (gt-x blocks gt-y) staged while gastown is parked: a staged_warnings plan."""
    from convoys.services import rigs, staging

    epic_of("gt-epic", ["gt-x", "gt-y"])
    blocks("gt-x", "gt-y")
    rigs.set_rig_state("gastown", "parked", actor="test")
    return staging.stage(["gt-epic"], actor="test")


def command(*args):
    """A management command's stdout (call_command)."""
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


offsets = st.integers(min_value=-14 * 60, max_value=14 * 60).map(
    lambda minutes: utc_offset(timedelta(minutes=minutes))
)


moments = st.datetimes(
    min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=offsets
)


def rfc3339(moment, digits, zulu):
    text = moment.isoformat(timespec="microseconds")
    stamp, offset = text[:26], text[26:]
    fraction = stamp[20:] + "789"[: max(0, digits - 6)]
    body = stamp[:19] + (f".{fraction[:digits]}" if digits else "")
    if zulu and moment.utcoffset() == timedelta(0):
        return body + "Z"
    return body + offset


def stage(ids):
    plan = staging.stage(ids, actor="test")
    assert not plan.errors, plan.errors
    return plan.convoy_id


STUCK = timedelta(seconds=1800)


def started(convoy):
    """When the convoy's clock started (its `convoy.created` event, here)."""
    return escalation.last_progress([convoy])[convoy.pk]


@pytest.fixture
def closing(django_capture_on_commit_callbacks):
    """Close a bead and run what its commit triggers (the event feeder task, in sync mode)."""

    def close(bead_id, reason="done"):
        with django_capture_on_commit_callbacks(execute=True):
            beads.close_bead(bead_id, reason=reason)

    return close


def chain(n, prefix="gt-c"):
    ids = [bead(f"{prefix}{i}").id for i in range(n)]
    for a, b in zip(ids, ids[1:], strict=False):
        blocks(a, b)
    return ids


def launched(ids):
    plan = staging.stage(ids, actor="test")
    launch_staged(plan.convoy_id, force=True)
    return Convoy.objects.get(pk=plan.convoy_id)


def hooked():
    return sorted(Bead.objects.filter(status="hooked").values_list("id", flat=True))


RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)")


def most_in_flight(convoy_id=None):
    """Replay the event log in order: the most beads of the convoy (without one: of the whole
    town) hooked at one time."""
    events = Event.objects.order_by("seq")
    if convoy_id is not None:
        tracked = Dispatch.objects.filter(convoy_id=convoy_id).values_list("bead_id", flat=True)
        events = events.filter(bead_id__in=set(tracked))
    in_flight, most = set(), 0
    for kind, bead_id in events.values_list("kind", "bead_id"):
        if kind == "bead.dispatched":
            in_flight.add(bead_id)
        elif kind in ("bead.closed", "dispatch.failed"):
            in_flight.discard(bead_id)
        most = max(most, len(in_flight))
    return most


def big_convoy(size=700, done=140, convoy_id="hq-cv-ov", prefix="gt-ov"):
    """An epic shaped like bench/browser.py's: bead i blocked by i-7, i-14 and i-21 (each
    when (i + k) % 2 == 0, so the chains are uneven); the first `done` beads closed."""
    now = timezone.now()
    seed = bead(prefix + "seed")  # made by the services: its rig is the route's
    ids = [f"{prefix}{i:05d}" for i in range(size)]
    bulk.insert(
        Bead,
        [
            {
                "id": bead_id,
                "title": f"Overview {i}",
                "status": "closed" if i < done else "open",
                "issue_type": "task",
                "priority": 2,
                "created_at": now,
                "updated_at": now,
                "closed_at": now if i < done else None,
                "rig_id": seed.rig_id,
            }
            for i, bead_id in enumerate(ids)
        ],
    )
    bulk.insert(
        Dependency,
        [
            {"issue_id": ids[i], "depends_on_id": ids[i - 7 * k], "type": "blocks"}
            for i in range(size)
            for k in (1, 2, 3)
            if i - 7 * k >= 0 and (i + k) % 2 == 0
        ],
    )
    Convoy.objects.create(
        id=convoy_id, title="Overview", status="open", created_at=now, updated_at=now
    )
    bulk.insert(
        TrackedBead,
        [{"convoy_id": convoy_id, "bead_id": b, "position": n} for n, b in enumerate(ids)],
    )
    projection.rebuild([convoy_id])  # bulk-inserted past the log, as an import settles it
    return convoy_id, ids


def drawn_ids(html):
    start = html.index('<svg class="dag"')
    svg = html[start : html.index("</svg>", start)]
    return set(re.findall(r'<g class="node [^"]*" data-id="([^"]+)"', svg))
