"""The whole loop with real processes: `manage.py serve` (daphne and the task
cluster) syncs a test town's bd JSONL every second; the town's dispatcher command answers at
once and a detached worker rewrites the bead closed in that file a moment later, as gt and a
polecat would. An epic staged and launched through the API lands with no manual step; the
cluster is killed (kill -9) mid-run and serve starts it again, and nothing is lost and nothing
dispatched twice."""

import json
import os
import signal
import sys
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db.models import Count

from convoys.models import Bead, Convoy, Dispatch
from convoys.services.tokens import create_token

from .support.processes import FAST, free_port, log_file, output, start, stop, survivors
from .support.sync import FIXTURE
from .support.waiting import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("real_cluster"),
]

EPIC = "gt-ep"
# The epic's tasks and what blocks each: four waves, up to three beads in one.
TASKS = {
    "gt-w0": [],
    "gt-w1": ["gt-w0"],
    "gt-w2": ["gt-w0"],
    "gt-w3": ["gt-w0"],
    "gt-w4": ["gt-w1", "gt-w2"],
    "gt-w5": ["gt-w3"],
    "gt-w6": ["gt-w4", "gt-w5"],
    "gt-w7": ["gt-w3"],
}
WORK_SECONDS = 0.5


def town_of(tmp_path):
    """The epic and its tasks as a bd JSONL file."""
    at = "2026-11-30T09:00:00Z"

    def record(bead_id, title, issue_type, deps):
        return {
            "id": bead_id,
            "title": title,
            "status": "open",
            "priority": 2,
            "issue_type": issue_type,
            "created_at": at,
            "updated_at": at,
            "dependencies": [
                {"issue_id": bead_id, "depends_on_id": target, "type": kind, "created_at": at}
                for target, kind in deps
            ],
        }

    records = [record(EPIC, "Ship the line", "epic", [])]
    for bead_id, blockers in TASKS.items():
        deps = [(EPIC, "parent-child"), *((b, "blocks") for b in blockers)]
        records.append(record(bead_id, f"Work {bead_id}", "task", deps))
    path = tmp_path / "town.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


class Serve:
    """`manage.py serve` on a free port, with the town configured."""

    def __init__(self, env):
        self.port = free_port()
        self.proc = start("serve", "--port", str(self.port), env=env)

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def ready(self):
        try:
            with urllib.request.urlopen(self.url("/login/"), timeout=2):
                pass
        except OSError:
            return False
        return "ticker started" in output(self.proc)

    def cluster_pid(self):
        """The task cluster serve started: a session leader running `manage.py cluster`."""
        for pid in survivors(self.proc):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"cluster" in argv and os.getsid(pid) == pid:
                return pid
        return None

    def post(self, path, token, body):
        request = urllib.request.Request(
            self.url(path),
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())


def test_a_launched_epic_lands_through_the_town_across_a_cluster_kill(routes, tmp_path):
    town = town_of(tmp_path)
    work_log = log_file("town-work")
    work_log.close()
    worker = FIXTURE.with_name("sync_worker.py")
    env = {
        **FAST,
        "CONVOY_FEED_INTERVAL": "5",  # the sync's close events feed; the catch-up is a backstop
        "CONVOY_SYNC_SOURCES": str(town),
        "CONVOY_SYNC_INTERVAL": "1",
        "CONVOY_DISPATCHER": "command",
        "CONVOY_DISPATCH_COMMAND": (
            f"{sys.executable} {worker} {town} {{bead}} --after {WORK_SECONDS} "
            f"--log {work_log.name}"
        ),
    }
    token = create_token(User.objects.create_superuser("mayor", "m@example.com", "pw"), "town")
    ids = sorted(TASKS)

    def closed():
        return Bead.objects.filter(pk__in=ids, status="closed").count()

    first = Serve(env)
    try:
        assert wait_for(first.ready, timeout=90, step=0.2), "serve did not start"
        assert wait_for(lambda: Bead.objects.filter(pk__in=ids).count() == len(ids), timeout=30)
        plan = first.post("/api/stage", token, {"ids": [EPIC]})
        assert plan["status"] == "staged_ready", plan["warnings"]
        convoy_id = plan["convoy_id"]
        launched = first.post("/api/launch", token, {"ids": [convoy_id]})
        assert launched, launched
        assert wait_for(lambda: closed() >= 3, timeout=90), f"{closed()} closed before the kill"
        assert closed() < len(ids), "the run ended before the kill"
        cluster = first.cluster_pid()
        assert cluster, "no task cluster under serve"
        os.killpg(cluster, signal.SIGKILL)
        # serve starts its task cluster again; the web server kept answering meanwhile
        said = "[tasks] exited with code -9; starting it again"
        assert wait_for(lambda: said in output(first.proc), timeout=30), output(first.proc)
        killed_at = closed()
        assert wait_for(lambda: first.cluster_pid() not in (None, cluster), timeout=30)
        assert wait_for(lambda: Convoy.objects.get(pk=convoy_id).status == "closed", timeout=120), (
            f"landed {closed()} of {len(ids)} ({killed_at} before the kill)"
        )
        assert first.proc.poll() is None
    finally:
        stop(first.proc)
    assert closed() == len(ids)
    assert wait_for(lambda: not survivors(first.proc), timeout=30)

    dispatched = Dispatch.objects.values("bead_id").annotate(n=Count("id"))
    assert sorted((row["bead_id"], row["n"]) for row in dispatched) == [(i, 1) for i in ids]
    assert not Dispatch.objects.filter(ok=False).exists()
    slung = [
        line.split("slung ", 1)[1].split(":")[0]
        for line in Path(work_log.name).read_text().splitlines()
        if " slung " in line
    ]
    assert sorted(slung) == ids, "each bead reaches the town exactly once"
