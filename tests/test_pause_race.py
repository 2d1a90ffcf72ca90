"""Pause racing the feeders: a close-and-feed loop, catch-up with the
stranded scan, and container slings run in real processes on one database while the convoy
is paused; the event log (gap-free, in commit order) shows no dispatch of its beads after
`convoy.paused`. Resume feeds again."""

import io
import json

import pytest
from django.core.management import call_command

from convoys.models import Bead, Convoy, Event, TrackedBead
from convoys.services import convoys, feeding, staging
from convoys.services.launch import launch_staged

from .support.factories import bead
from .support.processes import RACE_STEPS, python
from .support.waiting import wait_for

BEADS, LIMIT, AFTER_PAUSE = 24, 2, 15

# Each child loops on its path; once it has seen the pause it keeps going AFTER_PAUSE more
# rounds (so it races the pause and runs well past it), then stops.
LOOP = """
    import io, time
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from convoys.models import Bead, Convoy, Event, TrackedBead
    from convoys.services import feeding
    deadline, after = time.monotonic() + 240, 0
    while after < {after} and time.monotonic() < deadline:
        if Convoy.objects.filter(pk="{cid}", paused_at__isnull=False).exists():
            after += 1
"""
PATHS = {path: LOOP + step for path, step in RACE_STEPS.items()}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_pause_racing_closes_dispatches_nothing_after_it_commits(routes):
    ids = [bead(f"gt-p{i:02d}").id for i in range(BEADS)]  # one wide wave, fed two at a time
    plan = staging.stage(ids, actor="test")
    convoys.update_fields(plan.convoy_id, max_in_flight=LIMIT, actor="test")
    launch_staged(plan.convoy_id, force=True)
    feeding.catch_up()  # seeds the catch-up mark
    cid = plan.convoy_id
    procs = {
        name: python(code.replace("{cid}", cid).replace("{after}", str(AFTER_PAUSE)))
        for name, code in PATHS.items()
    }
    try:
        # Pause while the feeders are busy: after a few closes, mid-stream.
        assert wait_for(
            lambda: Bead.objects.filter(pk__in=ids, status="closed").count() >= 4,
            timeout=120,
            step=0.02,
        )
        call_command("convoy", "pause", cid, "--reason", "race", stdout=io.StringIO())
        outputs = {name: p.communicate(timeout=300) for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs.values()), {
        name: out[1][-2000:] for name, out in outputs.items()
    }
    paused_seq = Event.objects.get(kind="convoy.paused", convoy_id=cid).seq
    tracked = TrackedBead.objects.filter(convoy_id=cid).values("bead_id")
    dispatched = Event.objects.filter(kind="bead.dispatched", bead_id__in=tracked)
    assert dispatched.filter(seq__lt=paused_seq).count() >= 4
    assert not dispatched.filter(seq__gt=paused_seq).exists()
    still_open = Bead.objects.filter(pk__in=ids, status="open").count()
    assert still_open > 0  # the pause stopped real work, not a finished convoy
    status = io.StringIO()
    call_command("convoy", "status", cid, "--json", stdout=status)
    assert json.loads(status.getvalue())["paused"]["dispatches_since"] == 0

    call_command("convoy", "resume", cid, stdout=io.StringIO())
    assert dispatched.filter(seq__gt=paused_seq).exists()
    assert Convoy.objects.get(pk=cid).paused_at is None
