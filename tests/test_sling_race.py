"""Container slings racing each other and the stranded scan, in real processes: every tracked
bead is dispatched exactly once (the claim), whoever wins it."""

import pytest
from django.db.models import Count

from convoys.models import Dispatch
from convoys.services import convoys

from .support.factories import bead
from .support.processes import python

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_racing_container_slings_and_scans_dispatch_each_bead_once(routes):
    ids = [bead(f"gt-s{i:02d}").id for i in range(60)]
    convoy = convoys.create("Race", ids)
    sling = f"""
        import io
        from django.core.management import call_command
        call_command("sling", "{convoy.pk}", "--json", stdout=io.StringIO())
    """
    scan = """
        from convoys.services import feeding
        for _ in range(20):
            feeding.stranded_scan()
    """
    procs = [python(sling) for _ in range(3)] + [python(scan)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outputs]
    per_bead = Dispatch.objects.values("bead_id").annotate(n=Count("id"))
    assert {row["n"] for row in per_bead} == {1}
    assert sorted(row["bead_id"] for row in per_bead) == ids
    assert set(Dispatch.objects.values_list("convoy_id", flat=True)) == {convoy.pk}
