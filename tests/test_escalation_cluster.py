"""Escalation in real task clusters: two clusters' tickers run the stranded-scan task (which
escalates) and the digest job; a stuck convoy's owner is told three times in all (the first
and two re-escalations), never twice for one step."""

import pytest
from django.contrib.auth.models import Permission, User
from django.db.models import Count
from django_q.models import Success

from convoys.models import Escalation, Notification
from convoys.services import convoys

from .support.factories import bead, blocks
from .support.processes import start_cluster, stop
from .support.waiting import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("real_cluster"),
]


def test_two_clusters_escalate_each_step_once(routes):
    owner = User.objects.create_user("owner")
    owner.user_permissions.add(Permission.objects.get(codename="view_convoy"))
    bead("gt-gate", type="decision")
    bead("gt-w")
    blocks("gt-gate", "gt-w")
    convoy = convoys.create("Stuck", ["gt-w"], owner="owner")
    env = {
        "CONVOY_STUCK_AFTER": "1",
        "CONVOY_REESCALATE_AFTER": "2",
        "CONVOY_STRANDED_INTERVAL": "0.5",
    }
    clusters = [start_cluster(**env), start_cluster(**env)]

    def scans():
        return Success.objects.filter(func="convoys.tasks.stranded_scan", success=True).count()

    def told():
        return Notification.objects.filter(user=owner, kind="escalation").count()

    try:
        assert wait_for(lambda: told() >= 3, timeout=90)
        seen = scans()
        assert wait_for(lambda: scans() >= seen + 6, timeout=60)  # more scans: no fourth
        assert wait_for(
            lambda: Success.objects.filter(func="convoys.tasks.send_digests").exists(), timeout=30
        )
    finally:
        for cluster in clusters:
            stop(cluster)
    notes = Notification.objects.filter(user=owner, kind="escalation")
    assert told() == 3
    assert sorted(n.subject for n in notes) == [
        "⚠ Convoy still stuck (notice 2 of 3): Stuck",
        "⚠ Convoy still stuck (notice 3 of 3): Stuck",
        "⚠ Convoy stuck: Stuck",
    ]
    assert not notes.values("subject").annotate(n=Count("id")).filter(n__gt=1).exists()
    assert Escalation.objects.get(pk=convoy.pk).count == 3
