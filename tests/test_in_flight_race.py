"""`max_in_flight` holds on every path at once: launch, close feeding,
catch-up, the stranded scan and `sling <convoy>` race in real processes on one database, and
the event log (gap-free, in commit order) never shows a convoy with a limit of 2 holding 3."""

import io
import json

import pytest
from django.core.management import CommandError, call_command

from convoys.models import Bead, Convoy, Dispatch
from convoys.services import convoys, dispatch, feeding, staging

from .support.factories import bead, most_in_flight
from .support.factories import command as cli
from .support.processes import RACE_STEPS, python

LIMIT, BEADS = 2, 16

# Each child loops on its path until the convoy lands (or a generous deadline passes).
LOOP = """
    import io, time
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from convoys.models import Convoy
    deadline = time.monotonic() + 240
    def open_(cid):
        return Convoy.objects.get(pk=cid).status != "closed" and time.monotonic() < deadline
    while Convoy.objects.get(pk="{cid}").status != "open" and time.monotonic() < deadline:
        time.sleep(0.02)
    while open_("{cid}"):
"""
PATHS = {
    "launch": """
    import io
    from django.core.management import call_command
    call_command("convoy", "launch", "{cid}", "--force", stdout=io.StringIO())
""",
    **{path: LOOP + step for path, step in RACE_STEPS.items()},
}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_max_in_flight_holds_with_every_path_racing(routes):
    ids = [bead(f"gt-m{i:02d}").id for i in range(BEADS)]  # one wide wave
    plan = staging.stage(ids, actor="test")
    convoys.update_fields(plan.convoy_id, max_in_flight=LIMIT, actor="test")
    feeding.catch_up()  # seeds the catch-up mark
    procs = {name: python(code.replace("{cid}", plan.convoy_id)) for name, code in PATHS.items()}
    outputs = {name: p.communicate(timeout=300) for name, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), {
        name: out[1][-2000:] for name, out in outputs.items()
    }
    convoy = Convoy.objects.get(pk=plan.convoy_id)
    assert convoy.status == "closed"  # every bead was fed, closed, and the convoy landed
    assert most_in_flight(convoy.pk) == LIMIT
    paths = set(Dispatch.objects.filter(convoy_id=convoy.pk).values_list("path", flat=True))
    assert "launch" in paths and paths - {"launch"}, paths  # the others fed it too
    status = io.StringIO()
    call_command("convoy", "status", convoy.pk, "--json", stdout=status)
    assert json.loads(status.getvalue())["completed"] == BEADS


def test_launch_and_every_feeder_keep_to_max_in_flight(routes):
    """Each path alone, through the CLI where it has one: launch dispatches only up to the
    limit and says why it skipped the rest; a feeder's pass, the scan, a container sling and
    a direct claim dispatch nothing more while the convoy is full."""
    ids = [bead(f"gt-l{i}").id for i in range(4)]
    plan = staging.stage(ids, actor="test")
    convoys.update_fields(plan.convoy_id, max_in_flight=LIMIT, actor="test")
    launched = json.loads(cli("convoy", "launch", plan.convoy_id, "--json"))
    assert [d["id"] for d in launched["dispatched"]] == ["gt-l0", "gt-l1"]
    assert {s["id"]: s["reason"] for s in launched["skipped"]} == {
        "gt-l2": f"convoy {plan.convoy_id} at max in flight (2)",
        "gt-l3": f"convoy {plan.convoy_id} at max in flight (2)",
    }
    convoy = Convoy.objects.get(pk=plan.convoy_id)
    assert feeding.feed_convoy(convoy, "event", limit=5) == []  # a credit round
    fed = json.loads(cli("convoy", "feed", "--once", "--json"))
    assert fed["stranded"]["dispatched"] == []
    slung = json.loads(cli("sling", convoy.pk, "--json"))
    assert {s["reason"] for s in slung["skipped"] if s["id"] in ("gt-l2", "gt-l3")} == {
        "convoy at max in flight (2)"
    }
    assert dispatch.claim(Bead.objects.get(pk="gt-l2"), path="manual") is None
    out = io.StringIO()  # no convoy named; refused, so exit status 1 after the JSON
    with pytest.raises(CommandError, match="nothing dispatched: 1 of 1 refused"):
        call_command("sling", "gt-l2", "--no-convoy", "--json", stdout=out)
    alone = json.loads(out.getvalue())
    assert alone["dispatched"][0]["error"] == f"convoy {convoy.pk} at max in flight (2)"
    assert Bead.objects.filter(pk__in=ids, status="hooked").count() == LIMIT
    cli("beads", "close", "gt-l0")
    assert [r["id"] for r in feeding.feed_convoy(convoy, "event", limit=5)] == ["gt-l2"]
