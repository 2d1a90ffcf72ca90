"""Real processes: the task cluster, the ticker, kill -9, two clusters, racing dispatchers and
concurrent event writers. Runs on SQLite and, in the CI PostgreSQL pass, on PostgreSQL."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db.models import Count

from convoys.models import Bead, Convoy, Dispatch, Event
from convoys.services import convoys, staging, ticker
from convoys.services.launch import launch_staged

from .support.factories import bead, blocks
from .support.processes import (
    FAST,
    _answers,
    log,
    output,
    python,
    start,
    start_cluster,
    stop,
    survivors,
)
from .support.waiting import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("real_cluster"),
]


def test_cluster_feeds_the_next_wave_after_a_close(routes):
    ids = [bead(f"gt-c{i}").id for i in range(4)]
    for a, b in zip(ids, ids[1:], strict=False):
        blocks(a, b)
    plan = staging.stage(ids, actor="test")
    launch_staged(plan.convoy_id, force=True)
    cluster = start_cluster()
    try:
        assert wait_for(lambda: "ticker started" in output(cluster), timeout=60)
        for current, following in zip(ids, ids[1:], strict=False):
            from convoys.services import beads

            beads.close_bead(current)
            assert wait_for(lambda f=following: Bead.objects.get(pk=f).status == "hooked"), (
                f"{following} was not dispatched"
            )
        beads.close_bead(ids[-1])
        assert wait_for(lambda: Convoy.objects.get(pk=plan.convoy_id).status == "closed")
    finally:
        stop(cluster)
    # each following bead was dispatched once (by its blocker's close or by a catch-up pass)
    per_bead = Dispatch.objects.filter(bead_id__in=ids[1:]).values_list("bead_id")
    assert dict(per_bead.annotate(n=Count("id"))) == dict.fromkeys(ids[1:], 1)
    assert Event.objects.filter(kind="convoy.landed", convoy_id=plan.convoy_id).count() == 1


def test_the_cluster_ticker_runs_both_periodic_jobs(routes):
    """The cluster's ticker keeps enqueueing the catch-up feeder and the stranded scan, and the
    cluster runs them. The intervals themselves are checked on a fake clock (test_ticker)."""
    from django_q.models import Success

    cluster = start_cluster(CONVOY_FEED_INTERVAL="1", CONVOY_STRANDED_INTERVAL="2")

    def ran(func):
        return Success.objects.filter(func=func, success=True).count()

    try:
        assert wait_for(
            lambda: ran("convoys.tasks.stranded_scan") >= 3 and ran("convoys.tasks.catch_up") >= 3,
            timeout=60,
        )
    finally:
        stop(cluster)


def test_interval_defaults():
    from django.conf import settings

    assert settings.CONVOY_FEED_INTERVAL == 5 and settings.CONVOY_STRANDED_INTERVAL == 30


def test_kill_9_mid_dispatch_then_restart(routes, tmp_path):
    """Every bead ends with exactly one successful dispatch; nothing is left stranded."""
    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(0.25)\n")
    env = {
        "CONVOY_DISPATCHER": "command",
        "CONVOY_DISPATCH_COMMAND": f"{sys.executable} {script} {{bead}}",
        "CONVOY_WORKER_TIMEOUT": "3",
        "CONVOY_DISPATCH_TIMEOUT": "2",
        "CONVOY_TASK_TIMEOUT": "8",
        "CONVOY_TASK_RETRY": "10",
    }
    bead("gt-root")
    ids = [bead(f"gt-k{i:02d}").id for i in range(12)]
    for bead_id in ids:
        blocks("gt-root", bead_id)
    convoy = convoys.create("Kill", ["gt-root", *ids], max_in_flight=12)
    Bead.objects.filter(pk="gt-root").update(status="closed")
    first = start_cluster(**env)
    from convoys.services import beads as bead_service

    bead_service.update_bead("gt-root", status="open")
    bead_service.close_bead("gt-root")
    assert wait_for(lambda: Dispatch.objects.filter(ok=True).count() >= 2, timeout=20)
    stop(first, signal.SIGKILL, group=True)
    # the cluster's processes die with it, so nothing keeps working the queue
    assert wait_for(lambda: not survivors(first), timeout=10), survivors(first)
    second = start_cluster(**env)
    try:

        def progress():
            # workers that really started report in; the one killed mid-dispatch never does
            for worker in Dispatch.objects.filter(ok=True).values_list("worker", flat=True):
                bead_service.heartbeat(worker)
            return Dispatch.objects.filter(ok=True).values("bead_id").distinct().count() == 12

        done = wait_for(progress, timeout=60, step=0.5)
    finally:
        stop(second)
    assert done
    per_bead = Dispatch.objects.filter(ok=True).values("bead_id").annotate(n=Count("id"))
    assert {row["n"] for row in per_bead} == {1}
    assert set(Bead.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"hooked"}
    assert Convoy.objects.get(pk=convoy.pk).status == "open"


def test_two_clusters_never_double_dispatch(routes):
    count = int(os.environ.get("CONVOY_FAULT_CLOSES", "150"))
    ids = [bead(f"gt-d{i:04d}").id for i in range(count)]
    for lane in range(10):  # ten convoys feed in parallel
        convoys.create(f"Two clusters {lane}", ids[lane::10])
    clusters = [start_cluster(), start_cluster()]
    from convoys.services import beads as bead_service

    closed = set()
    try:

        def close_hooked():
            for bead_id in Bead.objects.filter(status="hooked").values_list("id", flat=True):
                if bead_id not in closed:
                    bead_service.close_bead(bead_id)
                    closed.add(bead_id)
            return len(closed) == count

        ok = wait_for(close_hooked, timeout=240, step=0.02)
        assert ok, f"closed {len(closed)}/{count}"
    finally:
        for cluster in clusters:
            stop(cluster)
    per_bead = (
        Event.objects.filter(kind="bead.dispatched").values("bead_id").annotate(n=Count("seq"))
    )
    assert per_bead.count() == count and {row["n"] for row in per_bead} == {1}


def test_racing_dispatchers_claim_each_bead_once(routes):
    ids = [bead(f"gt-r{i:03d}").id for i in range(120)]
    code = """
        from convoys.models import Bead
        from convoys.services import dispatch
        won = 0
        for bead in list(Bead.objects.filter(id__startswith="gt-r").order_by("id")):
            if dispatch.dispatch(bead, path="batch"):
                won += 1
        print(won)
    """
    procs = [python(code) for _ in range(4)]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outputs]
    per_bead = Dispatch.objects.values("bead_id").annotate(n=Count("id"))
    assert sum(int(o[0].strip()) for o in outputs) == len(ids)
    assert {row["n"] for row in per_bead} == {1} and per_bead.count() == len(ids)


def test_event_sequence_is_gap_free_under_concurrent_writers(routes, tmp_path):
    for i in range(4):
        bead(f"gt-e{i}")
    start = Event.objects.order_by("-seq").values_list("seq", flat=True)[0]
    writer = """
        import sys
        from convoys.services import beads
        bead_id = os.environ["BEAD"]
        for i in range(60):
            beads.update_bead(bead_id, priority=i % 5)
    """
    # the reader tails the log until the writers are done (the stop file) and it has read
    # everything after that
    reader = f"""
        import time
        from pathlib import Path
        from convoys.models import Event
        stop = Path(os.environ["STOP"])
        last, seen = {start}, []
        while True:
            done = stop.exists()
            rows = list(Event.objects.filter(seq__gt=last).order_by("seq").values_list("seq", flat=True))
            if rows:
                seen += rows
                last = rows[-1]
            elif done:
                break
            else:
                time.sleep(0.02)
        print(",".join(map(str, seen)))
    """
    stop_file = tmp_path / "writers-done"
    tail = python(reader, STOP=stop_file)
    writers = [python(writer, BEAD=f"gt-e{i}") for i in range(4)]
    for proc in writers:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-2000:]
    stop_file.touch()
    out, err = tail.communicate(timeout=60)
    assert tail.returncode == 0, err[-2000:]
    seqs = list(Event.objects.filter(seq__gt=start).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(start + 1, start + 1 + len(seqs)))
    assert len(seqs) >= 4 * 48  # updates that change nothing write no event
    seen = [int(s) for s in out.strip().split(",") if s]
    assert seen == seqs  # the tailing reader skipped nothing


STOP_TIMEOUT = 20  # CONVOY_TASK_TIMEOUT in the stop tests: the bound on a clean stop
SIGNALS = [
    pytest.param(signal.SIGTERM, False, id="SIGTERM-main"),
    pytest.param(signal.SIGTERM, True, id="SIGTERM-group"),
    pytest.param(signal.SIGINT, False, id="SIGINT-main"),
    pytest.param(signal.SIGINT, True, id="SIGINT-group"),
]


def send(proc, sig, group):
    if group:  # systemd KillMode=control-group, supervisord stopasgroup, Ctrl-C in a terminal
        os.killpg(proc.pid, sig)
    else:  # KillMode=mixed, kill PID
        proc.send_signal(sig)


def assert_stops(proc, sig, group):
    send(proc, sig, group)
    try:
        proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        log(proc)
        for pid in [proc.pid, *survivors(proc)]:
            os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"still running {STOP_TIMEOUT}s after {sig!r}") from None
    text = log(proc)
    # the parent has exited; its children go with it (reparented ones may need a moment)
    assert wait_for(lambda: not survivors(proc), timeout=10), survivors(proc)
    assert proc.returncode == 0, proc.returncode
    return text


def waiting_tasks():
    """The functions of the tasks in the broker that no cluster has pulled."""
    from django.utils import timezone
    from django_q.brokers import get_broker
    from django_q.conf import Conf
    from django_q.models import OrmQ
    from django_q.signing import SignedPackage

    broker = get_broker()
    if Conf.ORM:
        rows = OrmQ.objects.filter(key=broker.list_key, lock__lte=timezone.now())
        return [row.task["func"] for row in rows]
    return [
        SignedPackage.loads(p)["func"] for p in broker.connection.lrange(broker.list_key, 0, -1)
    ]


def slow_dispatch(tmp_path, seconds):
    script = tmp_path / "slow.py"
    script.write_text(f"import time\ntime.sleep({seconds})\n")
    return {
        "CONVOY_DISPATCHER": "command",
        "CONVOY_DISPATCH_COMMAND": f"{sys.executable} {script} {{bead}}",
        "CONVOY_DISPATCH_TIMEOUT": str(STOP_TIMEOUT),
    }


@pytest.mark.parametrize(("sig", "group"), SIGNALS)
def test_cluster_stops_cleanly_with_work_in_flight(routes, tmp_path, sig, group):
    """One worker: A's close-handling task is dispatching when the signal comes, B's has been
    pulled from the broker and waits behind it. The cluster exits within the task timeout,
    leaves no process behind, finishes A's dispatch exactly once, hands B's task back to the
    broker unstarted, and a restarted cluster runs it once."""
    from convoys.services import beads as bead_service

    env = {
        **slow_dispatch(tmp_path, 3),
        "CONVOY_WORKERS": "1",
        "CONVOY_TASK_TIMEOUT": str(STOP_TIMEOUT),
        "CONVOY_TASK_RETRY": str(STOP_TIMEOUT + 5),
        "CONVOY_FEED_INTERVAL": "3600",  # only the close events dispatch here
        "CONVOY_STRANDED_INTERVAL": "3600",
    }
    for lane in "ab":
        bead(f"gt-{lane}root")
        bead(f"gt-{lane}next")
        blocks(f"gt-{lane}root", f"gt-{lane}next")
        convoys.create(f"Stop {lane}", [f"gt-{lane}root", f"gt-{lane}next"])
    cluster = start_cluster(**env)
    from django_q.models import Success

    # Every job's first tick ran (catch-up, stranded scan, digest): the one worker is idle.
    ticked = lambda: Success.objects.filter(group="ticker").count() == len(ticker.JOBS)  # noqa: E731
    assert wait_for(ticked, timeout=60), "the cluster did not start"
    bead_service.close_bead("gt-aroot")
    assert wait_for(lambda: Dispatch.objects.filter(bead_id="gt-anext").exists(), timeout=30)
    bead_service.close_bead("gt-broot")
    assert wait_for(lambda: not waiting_tasks(), timeout=30), "B's task was not pulled"
    assert Dispatch.objects.get(bead_id="gt-anext").ok is None  # still running

    text = assert_stops(cluster, sig, group)

    assert "has stopped" in text and "handed 1 queued task(s) back" in text
    assert list(Dispatch.objects.filter(bead_id="gt-anext").values_list("ok", flat=True)) == [True]
    assert not Dispatch.objects.filter(bead_id="gt-bnext").exists()
    assert waiting_tasks() == ["convoys.tasks.handle_close"]
    again = start_cluster(**env)
    try:
        assert wait_for(
            lambda: Dispatch.objects.filter(bead_id="gt-bnext", ok=True).exists(), timeout=60
        )
    finally:
        stop(again)
    per_bead = Dispatch.objects.filter(bead_id__endswith="next").values("bead_id")
    per_bead = per_bead.annotate(n=Count("id"))
    assert {row["bead_id"]: row["n"] for row in per_bead} == {"gt-anext": 1, "gt-bnext": 1}
    assert set(Bead.objects.filter(id__endswith="next").values_list("status", flat=True)) == {
        "hooked"
    }


@pytest.mark.parametrize(("sig", "group"), SIGNALS)
def test_serve_stops_cleanly(routes, sig, group):
    """`serve` (daphne + cluster + swarm) stops on every signal, leaving no process behind."""
    import urllib.request

    from django.contrib.auth import get_user_model

    from .support.processes import free_port

    get_user_model().objects.create_user("demo")  # the swarm's account
    port = free_port()
    serve = start(
        "serve",
        "--port",
        str(port),
        "--swarm",
        env={**FAST, "CONVOY_TASK_TIMEOUT": str(STOP_TIMEOUT)},
    )

    def ready():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=2):
                pass
        except OSError:
            return False
        text = output(serve)
        return "ticker started" in text and "swarm: working" in text

    assert wait_for(ready, timeout=60, step=0.2), "serve did not start"
    text = assert_stops(serve, sig, group)
    # every child stopped cleanly, the swarm too (it said -15 before it handled SIGTERM)
    assert "stopped (web: 0, tasks: 0, swarm: 0)" in text and "swarm: stopped after" in text


def test_an_interrupted_dispatch_releases_its_claim(routes):
    """The task timeout raises SystemExit inside the dispatcher: the bead goes back to open
    (nothing stranded on a worker that never got it) and the interruption propagates."""
    from convoys.services import dispatch

    class Interrupted:
        def dispatch(self, bead_id, rig, convoy_id, worker):
            raise SystemExit("Task exceeded maximum timeout value (60 seconds)")

    claimed = dispatch.claim(bead("gt-slow"), path="event")
    with pytest.raises(SystemExit):
        dispatch.run(claimed, Interrupted())
    released = Bead.objects.get(pk="gt-slow")
    assert (released.status, released.assignee) == ("open", "")
    attempt = Dispatch.objects.get(bead_id="gt-slow")
    assert attempt.ok is False and attempt.error.startswith("interrupted: SystemExit")
    assert Event.objects.filter(kind="dispatch.failed", bead_id="gt-slow").exists()


def _children_of(pid):
    """{"web" | "tasks" | "swarm": pid} of `serve`'s children that run their own program, by
    their arguments: a child not yet past exec shows serve's own (`--swarm`), a reaped one none."""
    found = {}
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        for label, word in (
            ("web", b"convoyweb.webserver"),
            ("swarm", b"swarm"),
            ("tasks", b"cluster"),
        ):
            if word in argv:
                found[label] = int(child)
    return found


def test_nothing_a_user_does_brings_serve_down(routes):
    """A bead in progress with nobody assigned (an admin edit) makes the swarm skip it with
    one line, not exit; kill -9 of each child of `serve` in turn: it is started again and the
    others keep answering."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    from .support.processes import free_port

    swarm_user = get_user_model().objects.create_user("demo")  # the swarm's account
    swarm_user.user_permissions.add(*Permission.objects.filter(content_type__app_label="convoys"))
    bead("gt-odd")
    Bead.objects.filter(pk="gt-odd").update(status="in_progress", assignee="")  # as the admin did
    port = free_port()
    serve = start("serve", "--port", str(port), "--swarm", env={**FAST, "CONVOY_STATUS_EVERY": "2"})
    try:
        ready = lambda: _answers(port) and "swarm: working" in output(serve)  # noqa: E731
        assert wait_for(ready, timeout=60, step=0.2), "serve did not start"
        skipped = lambda: "swarm: skipped gt-odd: in_progress with nobody assigned" in output(serve)  # noqa: E731
        assert wait_for(skipped, timeout=30), output(serve)
        time.sleep(3)  # several polls later: still one line, and the swarm still works
        assert output(serve).count("swarm: skipped gt-odd") == 1
        for label in ("swarm", "tasks", "web"):
            assert wait_for(lambda: len(_children_of(serve.pid)) == 3, timeout=15), output(serve)
            before = _children_of(serve.pid)
            os.kill(before[label], signal.SIGKILL)
            said = f"[{label:<5}] exited with code -9; starting it again in 1 s"
            assert wait_for(lambda said=said: said in output(serve), timeout=10), output(serve)
            if label != "web":
                assert _answers(port), f"the web server stopped answering when {label} died"
            again = lambda label=label, before=before: (  # noqa: E731
                _children_of(serve.pid).get(label, before[label]) != before[label]
            )
            assert wait_for(again, timeout=15), output(serve)
            assert wait_for(lambda: _answers(port), timeout=30), f"no answer after {label}"
            assert serve.poll() is None
        # Each restart is in the log, where the dashboard reads it.
        restarted = Event.objects.filter(kind="process.restarted").values_list("data", flat=True)
        assert {d["process"] for d in restarted} == {"swarm", "tasks", "web"}
        # serve's line every CONVOY_STATUS_EVERY: what the town did, the restarts among errors
        line = re.compile(
            r"^status: \d+ convoys? moving, \d+ landed, \d+ in flight, \d+ errors?", re.M
        )
        assert wait_for(lambda: len(line.findall(output(serve))) >= 3, timeout=10), output(serve)
        assert re.search(
            r"^status: .*\d+ crash(es)?, \d+ child(ren)? started again\)$", output(serve), re.M
        ), output(serve)
    finally:
        stop(serve)
