"""Operators' endpoints through HTTP: /metrics (who may read it, what it says after a launch
and a close), /healthz, /readyz (200, and 503 naming the stalled cluster or the lagging
relay), the dashboard's "feeding is stopped" banner, and `serve` restarting a cluster that
stopped ticking."""

import json
import threading
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from convoys.log.events import last_seq
from convoys.models import Convoy, Cursor, Event, Lease
from convoys.rules import causes
from convoys.services import leases, ticker

from .support.factories import chain, launched
from .support.users import signed_in

pytestmark = pytest.mark.django_db
TOKEN = "metrics-token-for-tests"


def tick(settings, ago=0.0):
    """A feed tick as the ticker takes it, `ago` seconds in the past."""
    leases.acquire("tick:catch-up", "test-cluster", ttl=settings.CONVOY_FEED_INTERVAL * 0.8)
    if ago:
        Lease.objects.filter(name="tick:catch-up").update(
            expires_at=timezone.now()
            - timedelta(seconds=ago)
            + timedelta(seconds=settings.CONVOY_FEED_INTERVAL * ticker.LEASE_SHARE)
        )


def scrape(client=None, **headers):
    client = client or Client()
    return client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}", **headers})


def samples(response):
    """{(name, ((label, value), ...)): value} of a /metrics answer."""
    assert response.status_code == 200, response.content
    found = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


# --- /metrics: who may read it -------------------------------------------------------------
def test_metrics_refused_without_token_or_allowed_address(settings):
    settings.CONVOY_METRICS_TOKEN = TOKEN
    settings.CONVOY_METRICS_ALLOW = []
    response = Client().get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert Client().get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 403
    assert Client().get("/metrics", headers={"Authorization": "Basic eDp5"}).status_code == 401
    # A signed-in user is no scraper.
    assert signed_in("viewer", "view_convoy").get("/metrics").status_code == 401


def test_metrics_without_a_configured_token_refuse_every_token(settings):
    settings.CONVOY_METRICS_TOKEN = ""
    settings.CONVOY_METRICS_ALLOW = []
    assert Client().get("/metrics", headers={"Authorization": "Bearer "}).status_code == 401
    assert Client().get("/metrics", headers={"Authorization": "Bearer x"}).status_code == 403


def test_metrics_with_the_token(settings):
    settings.CONVOY_METRICS_TOKEN = TOKEN
    response = scrape()
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]


@pytest.mark.parametrize(
    ("allow", "ok"),
    [(["127.0.0.1"], True), (["10.0.0.0/8", "127.0.0.0/8"], True), (["10.0.0.0/8"], False)],
)
def test_metrics_from_an_allowed_address(settings, allow, ok):
    settings.CONVOY_METRICS_TOKEN = ""
    settings.CONVOY_METRICS_ALLOW = allow
    response = Client(REMOTE_ADDR="127.0.0.1").get("/metrics")
    assert response.status_code == (200 if ok else 401)


def test_metrics_allow_is_checked_when_settings_load(monkeypatch):
    import importlib

    from django.core.exceptions import ImproperlyConfigured

    import convoyweb.settings as module

    monkeypatch.setenv("CONVOY_METRICS_ALLOW", "127.0.0.1, not-an-address")
    with pytest.raises(ImproperlyConfigured, match="CONVOY_METRICS_ALLOW"):
        importlib.reload(module)
    monkeypatch.delenv("CONVOY_METRICS_ALLOW")
    importlib.reload(module)


# --- /metrics: what it says -------------------------------------------------------------------
def test_metrics_after_a_launch_and_a_close(routes, settings, closing):
    settings.CONVOY_METRICS_TOKEN = TOKEN
    ids = chain(3)
    convoy = launched(ids)
    closing(ids[0])
    m = samples(scrape())

    assert m[("convoy_convoys", (("status", "open"),))] == 1
    assert m[("convoy_convoys", (("status", "closed"),))] == 0
    assert m[("convoy_beads", (("status", "closed"),))] == 1
    assert m[("convoy_beads", (("status", "hooked"),))] == 1
    assert m[("convoy_beads", (("status", "open"),))] == 1
    assert m[("convoy_beads_by_segment", (("segment", "done"),))] == 1
    assert m[("convoy_beads_by_cause", (("cause", "working"),))] == 1
    assert m[("convoy_beads_by_cause", (("cause", "blocked"),))] == 1
    assert m[("convoy_beads_by_cause", (("cause", "ready"),))] == 0
    assert m[("convoy_in_flight", ())] == 1
    assert m[("convoy_in_flight_cap", ())] == 0
    assert ("convoy_task_queue_length", ()) in m
    assert m[("convoy_dispatches_total", (("outcome", "ok"), ("path", "launch")))] == 1
    assert m[("convoy_dispatches_total", (("outcome", "ok"), ("path", "event")))] == 1
    assert m[("convoy_dispatches_total", (("outcome", "failed"), ("path", "event")))] == 0
    assert m[("convoy_close_to_dispatch_seconds_count", ())] == 1
    assert m[("convoy_close_to_dispatch_seconds_bucket", (("le", "+Inf"),))] == 1
    assert m[("convoy_close_to_dispatch_seconds_bucket", (("le", "60.0"),))] == 1
    assert 0 <= m[("convoy_close_to_dispatch_seconds_sum", ())] < 60
    assert m[("convoy_websockets_open", ())] == 0
    assert m[("convoy_cluster_stalled", ())] == 1  # no cluster ticks in a unit test
    assert ("convoy_relay_lag_events", ()) in m
    assert ("convoy_notification_emails_sent_total", ()) in m
    assert ("process_resident_memory_bytes", ()) in m

    # The town's counts agree with the causes the convoy page shows.
    page = dict(causes.counts(causes.for_convoy(convoy)))
    town = {k: n for k, n in causes.town_counts().items() if n}
    assert town == page == {"working": 1, "blocked": 1}

    closing(ids[1])
    closing(ids[2])
    m = samples(scrape())
    assert Convoy.objects.get().status == "closed"
    assert m[("convoy_convoys", (("status", "closed"),))] == 1
    assert m[("convoy_dispatches_total", (("outcome", "ok"), ("path", "event")))] == 2
    assert m[("convoy_close_to_dispatch_seconds_count", ())] == 2
    assert m[("convoy_in_flight", ())] == 0
    assert all(n == 0 for (name, _), n in m.items() if name == "convoy_beads_by_cause")


def test_metrics_cause_counts_match_the_causes_module(routes, settings):
    """Paused, gated, parked rig and not-slingable, as the convoy page decides them."""
    from convoys.services import beads, controls, rigs

    from .support.factories import bead, blocks

    settings.CONVOY_METRICS_TOKEN = TOKEN
    ids = chain(2, prefix="gt-p")
    paused = launched(ids)
    controls.pause(paused.pk, actor="test", reason="wait")
    bead("gt-gate", type="decision")
    bead("gt-gated")
    blocks("gt-gate", "gt-gated")
    bead("bd-parked")
    bead("gt-chore", type="message")
    other = launched(["gt-gated", "bd-parked", "gt-chore"])
    rigs.set_rig_state("beads", "parked", actor="test")
    beads.update_bead("gt-chore", status="deferred", actor="test")
    town = {k: n for k, n in causes.town_counts().items() if n}
    page = dict(causes.counts({**causes.for_convoy(paused), **causes.for_convoy(other)}))
    assert town == page
    m = samples(scrape())
    for kind, n in page.items():
        assert m[("convoy_beads_by_cause", (("cause", kind),))] == n


def test_metrics_show_the_sync_sources(settings):
    from convoys.models import SyncSource

    settings.CONVOY_METRICS_TOKEN = TOKEN
    SyncSource.objects.create(
        name="/srv/beads.jsonl", last_pass_at=timezone.now() - timedelta(seconds=30), seconds=1.5
    )
    SyncSource.objects.create(name="cmd:bd export", error="boom", failing_since=timezone.now())
    m = samples(scrape())
    label = (("source", "/srv/beads.jsonl"),)
    assert m[("convoy_sync_pass_seconds", label)] == 1.5
    assert 29 <= m[("convoy_sync_lag_seconds", label)] < 60
    assert m[("convoy_sync_failing", label)] == 0
    assert m[("convoy_sync_failing", (("source", "cmd:bd export"),))] == 1


# --- /healthz and /readyz -------------------------------------------------------------------
def test_healthz_answers_without_login_or_database(django_assert_num_queries):
    with django_assert_num_queries(0):
        response = Client().get("/healthz")
    assert response.status_code == 200 and response.content == b"ok\n"


def test_readyz_200_when_the_cluster_ticks(settings, django_assert_max_num_queries):
    tick(settings)
    with django_assert_max_num_queries(6):
        response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["ok"] is True and body["failing"] == []
    assert set(body["checks"]) == {"database", "channel_layer", "cluster", "relay"}
    assert body["checks"]["cluster"]["last_tick"]


def test_readyz_503_when_the_cluster_stopped_ticking(settings, caplog):
    tick(settings, ago=ticker.stall_after() + 1)
    response = Client().get("/readyz")
    assert response.status_code == 503
    # Polled each second: no django.request ERROR line for each answer.
    assert not [r for r in caplog.records if r.name == "django.request"]
    body = response.json()
    assert body["failing"] == ["cluster"]
    assert "no tick for" in body["checks"]["cluster"]["error"]
    # Within three feed intervals it is still fine.
    tick(settings, ago=ticker.stall_after() - 2)
    assert Client().get("/readyz").status_code == 200


def test_readyz_503_when_no_cluster_ever_ticked():
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["cluster"]["error"] == "no task cluster has ticked"


def test_readyz_503_when_the_relay_lags(settings, routes):
    from .support.factories import bead

    tick(settings)
    settings.CONVOY_READY_RELAY_LAG = 5
    bead("gt-a")
    bead("gt-b")
    first = Event.objects.order_by("seq").first()
    # A shared relay (Redis) holds its lease and has relayed nothing since the first event.
    leases.acquire("relay", "web-1:relay", ttl=5)
    Cursor.objects.create(name="relay", position=first.seq)
    assert Client().get("/readyz").status_code == 200  # behind, but by less than 5 s
    Event.objects.filter(seq__gt=first.seq).update(created_at=timezone.now() - timedelta(minutes=1))
    response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["relay"]
    assert body["checks"]["relay"]["events"] == Event.objects.count() - 1
    # A relay that stopped (its lease ran out) is not lagging: nobody has a socket open.
    Lease.objects.filter(name="relay").update(expires_at=timezone.now())
    assert Client().get("/readyz").status_code == 200


def test_readyz_names_a_channel_layer_that_fails(settings, monkeypatch):
    from convoys.web import health

    tick(settings)

    async def broken():
        raise ConnectionError("layer away")

    monkeypatch.setattr(health, "_probe_layer", broken)
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["channel_layer"]
    assert "layer away" in response.json()["checks"]["channel_layer"]["error"]


# --- the dashboard's banner -----------------------------------------------------------------
BANNER = "Feeding is stopped since"


def test_dashboard_says_feeding_is_stopped(settings):
    client = signed_in("viewer", "view_convoy", "view_bead")
    tick(settings, ago=ticker.stall_after() + 1)
    page = client.get("/").content.decode()
    assert BANNER in page and 'id="feeding-stopped"' in page
    live = client.get("/", headers={"X-Live": "1"}).json()
    assert BANNER in live["fragments"]["feeding-stopped"]
    tick(settings)
    page = client.get("/").content.decode()
    assert BANNER not in page and 'id="feeding-stopped"' in page


def test_dashboard_says_when_serve_started_a_process_again(settings):
    client = signed_in("viewer", "view_convoy", "view_bead")
    tick(settings)
    assert 'id="process-restarted"' not in client.get("/").content.decode()
    seq = last_seq()
    event = ticker.record_restart("tasks", -9, 1.0)
    live = client.get("/", headers={"X-Live": "1", "X-Live-Since": str(seq)}).json()
    assert (
        "The task cluster exited (code -9) and was started again"
        in live["fragments"]["feeding-stopped"]
    )
    assert "The task cluster exited (code -9)" in client.get("/").content.decode()
    # Ten minutes on, it is news no more.
    Event.objects.filter(pk=event.pk).update(
        created_at=event.created_at - timedelta(seconds=ticker.RESTART_SHOWN + 1)
    )
    assert 'id="process-restarted"' not in client.get("/").content.decode()


def test_dashboard_says_feeding_never_started():
    client = signed_in("viewer", "view_convoy", "view_bead")
    assert (
        "No task cluster has ticked yet: nothing feeds convoys" in client.get("/").content.decode()
    )


# --- serve restarts a cluster that stopped ticking ------------------------------------------
class FakeChild:
    def __init__(self, number):
        self.number, self.pid, self.returncode, self.signals = number, 10**6 + number, None, []

    def poll(self):
        return self.returncode

    def send_signal(self, sig):
        self.signals.append(sig)
        self.returncode = -sig


@pytest.mark.slow  # about 2 s: the supervisor's own pace
@pytest.mark.django_db(transaction=True)
def test_serve_restarts_a_cluster_that_stopped_ticking(settings, monkeypatch):
    import io

    from convoys.management.commands import serve

    settings.CONVOY_FEED_INTERVAL = 0.1  # stalled after 0.3 s without a tick
    command = serve.Command(stdout=io.StringIO(), stderr=io.StringIO())
    command.lock = threading.Lock()
    started = []

    def start(label, argv):
        child = FakeChild(len(started) + 1)
        started.append(child)
        return child

    monkeypatch.setattr(command, "_start", start)
    first = start("tasks", [])
    stopping = threading.Event()
    threading.Timer(5, stopping.set).start()

    def watch():
        while len(started) < 2 and not stopping.is_set():
            time.sleep(0.05)
        stopping.set()

    threading.Thread(target=watch).start()
    command._supervise([("tasks", first)], {"tasks": ["cluster"]}, stopping)
    assert first.signals, "the stalled cluster was not stopped"
    assert len(started) == 2, "the stalled cluster was not started again"
    assert "stopped ticking" in command.stderr.getvalue()


@pytest.mark.slow  # about 2 s: the supervisor's own pace
@pytest.mark.django_db(transaction=True)
def test_serve_leaves_a_ticking_cluster_alone(settings, monkeypatch):
    import io

    from convoys.management.commands import serve

    settings.CONVOY_FEED_INTERVAL = 0.1
    command = serve.Command(stdout=io.StringIO(), stderr=io.StringIO())
    command.lock = threading.Lock()
    child = FakeChild(1)
    stopping = threading.Event()

    def keep_ticking():
        from django.db import connection

        try:
            while not stopping.is_set():
                leases.acquire("tick:catch-up", "c", ttl=0.08)
                time.sleep(0.05)
        finally:
            connection.close()

    ticking = threading.Thread(target=keep_ticking)
    ticking.start()
    threading.Timer(2, stopping.set).start()
    command._supervise([("tasks", child)], {"tasks": ["cluster"]}, stopping)
    ticking.join()
    assert child.signals == []


def test_readyz_body_is_json_for_a_load_balancer(settings):
    tick(settings)
    response = Client().get("/readyz")
    assert response["Content-Type"] == "application/json"
    json.loads(response.content)


# --- docs: the Grafana dashboard and docs/metrics.md name the metrics that exist -------------
def test_grafana_dashboard_and_docs_name_only_exported_metrics(settings):
    import re

    from .support.paths import ROOT

    settings.CONVOY_METRICS_TOKEN = TOKEN
    exported = set()
    for family in text_string_to_metric_families(scrape().content.decode()):
        exported |= {s.name for s in family.samples} | {family.name}
        if family.type == "counter":  # named with _total even while it has no sample
            exported.add(family.name + "_total")
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(?:convoy|process)_[a-z_]+", target["expr"])
    }
    assert used and used <= exported, used - exported
    text = (ROOT / "docs" / "metrics.md").read_text()
    documented = {d.removesuffix("_total") for d in re.findall(r"`(convoy_[a-z_]+)`", text)}
    convoy_families = {n for n in exported if n.startswith("convoy_")}
    # every family is documented (samples of a histogram or counter by their family's name)
    missing = {
        n for n in convoy_families if not any(n == d or n.startswith(d + "_") for d in documented)
    }
    assert missing == set()


# --- the per-process gauge: open websockets -------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_metrics_count_this_process_open_websockets(settings, routes):
    from asgiref.sync import async_to_sync, sync_to_async

    from convoys.web import metrics

    from .support.live import communicator, has, receive_until
    from .support.users import session_cookie, viewer

    settings.CONVOY_METRICS_TOKEN = TOKEN
    cookie = session_cookie(viewer("alice"))
    before = metrics.WEBSOCKETS._value.get()

    def gauge():
        return samples(scrape())[("convoy_websockets_open", ())]

    async def go():
        comm = communicator("/ws/live/?topics=dashboard", cookie)
        connected, _ = await comm.connect()
        assert connected
        await receive_until(comm, has("hello"))
        assert await sync_to_async(gauge)() == before + 1
        await comm.disconnect()

    async_to_sync(go)()
    assert gauge() == before
