"""What /metrics shows (Prometheus' text format; docs/metrics.md lists every name).

Two kinds, so that no multiprocess registry is needed:
- town metrics, read from the database at each scrape by `TownCollector` with aggregate
  queries (no bead is read into Python): every web process answers the same values, for the
  task clusters too (what a cluster does lands in rows: dispatches, ticks, sync passes);
- process metrics, kept in memory by the process that serves the scrape: its open websockets
  and the standard process_* figures. Scrape every web process for these and sum them.
"""

from collections.abc import Iterator
from datetime import datetime, timedelta

from django.db.models import Count, Q, Sum
from django.utils import timezone
from prometheus_client import CollectorRegistry, Gauge, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from convoys.live import relay
from convoys.log import queue
from convoys.models import Bead, BeadFacts, Convoy, Dispatch, Notification, SyncSource
from convoys.rules import capacity, causes
from convoys.services import ticker

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Close -> dispatch latency buckets, in seconds (the feeder answers a close in well under one).
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
UNSENT_AFTER = 60.0  # seconds: an e-mail still not sent this long after its notification
SOURCE_LABEL_MAX = 120  # characters of a sync source's name in its label


def _convoys() -> Iterator[Metric]:
    family = GaugeMetricFamily("convoy_convoys", "Convoys by status.", labels=["status"])
    counts = dict(Convoy.objects.values_list("status").annotate(n=Count("pk")))
    for status in sorted(set(counts) | {"open", "closed", "staged_ready", "staged_warnings"}):
        family.add_metric([status], counts.get(status, 0))
    yield family
    paused = Convoy.objects.filter(status="open", paused_at__isnull=False).count()
    yield GaugeMetricFamily("convoy_convoys_paused", "Open convoys paused.", value=paused)


def _beads(now: datetime) -> Iterator[Metric]:
    family = GaugeMetricFamily("convoy_beads", "Beads by status.", labels=["status"])
    for status, n in sorted(Bead.objects.values_list("status").annotate(n=Count("pk"))):
        family.add_metric([status], n)
    yield family
    family = GaugeMetricFamily(
        "convoy_beads_by_segment",
        "Beads by summary segment (done, active, failed, ready, blocked): the kept read model.",
        labels=["segment"],
    )
    for segment, n in sorted(BeadFacts.objects.values_list("segment").annotate(n=Count("pk"))):
        family.add_metric([segment], n)
    yield family
    family = GaugeMetricFamily(
        "convoy_beads_by_cause",
        "Unfinished beads tracked by open convoys, by why they are not moving.",
        labels=["cause"],
    )
    for cause, n in causes.town_counts(now).items():
        family.add_metric([cause], n)
    yield family


def _capacity(now: datetime) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "convoy_in_flight", "Beads in flight across the town.", value=capacity.in_flight(now)
    )
    yield GaugeMetricFamily(
        "convoy_in_flight_cap", "The town's cap on beads in flight (0: none).", value=capacity.cap()
    )
    yield GaugeMetricFamily(
        "convoy_task_queue_length",
        "Tasks waiting in the task broker's queue.",
        value=queue.length(),
    )


def _dispatches() -> Iterator[Metric]:
    family = CounterMetricFamily(
        "convoy_dispatches",
        "Dispatch attempts by path and outcome (ok, failed, running).",
        labels=["path", "outcome"],
    )
    rows = Dispatch.objects.values_list("path", "ok").annotate(n=Count("pk"))
    totals: dict[tuple[str, str], int] = {}
    for path, ok, n in rows:
        outcome = "running" if ok is None else ("ok" if ok else "failed")
        totals[(path, outcome)] = totals.get((path, outcome), 0) + n
    for path in Dispatch.PATHS:
        for outcome in ("ok", "failed"):
            totals.setdefault((path, outcome), 0)
    for (path, outcome), n in sorted(totals.items()):
        family.add_metric([path, outcome], n)
    yield family
    timed = Dispatch.objects.filter(since_close_ms__isnull=False)
    wanted = {
        f"le_{i}": Count("pk", filter=Q(since_close_ms__lte=b * 1000))
        for i, b in enumerate(LATENCY_BUCKETS)
    }
    got = timed.aggregate(count=Count("pk"), total=Sum("since_close_ms"), **wanted)
    buckets = [(str(b), got[f"le_{i}"]) for i, b in enumerate(LATENCY_BUCKETS)]
    buckets.append(("+Inf", got["count"]))
    yield HistogramMetricFamily(
        "convoy_close_to_dispatch_seconds",
        "From a close event to the claim of each bead its feed dispatched.",
        buckets=buckets,
        sum_value=(got["total"] or 0.0) / 1000,
    )


def _live(now: datetime) -> Iterator[Metric]:
    lag = relay.lag(now)
    yield GaugeMetricFamily(
        "convoy_relay_lag_events",
        "Events the live relay has not sent yet (0 when no relay runs).",
        value=lag.events if lag else 0,
    )
    yield GaugeMetricFamily(
        "convoy_relay_lag_seconds",
        "Age of the oldest event the live relay has not sent yet.",
        value=lag.seconds if lag else 0.0,
    )
    stalled, tick = ticker.stalled_since(now)
    yield GaugeMetricFamily(
        "convoy_cluster_last_tick_timestamp_seconds",
        "When a task cluster last took a feed tick (0: never).",
        value=tick.timestamp() if tick else 0.0,
    )
    yield GaugeMetricFamily(
        "convoy_cluster_stalled",
        "1 when no task cluster ticked for three feed intervals: feeding is stopped.",
        value=1 if stalled else 0,
    )


def _sync(now: datetime) -> Iterator[Metric]:
    seconds = GaugeMetricFamily(
        "convoy_sync_pass_seconds",
        "Duration of each source's last good sync pass.",
        labels=["source"],
    )
    lag = GaugeMetricFamily(
        "convoy_sync_lag_seconds",
        "Seconds since each source's last good sync pass.",
        labels=["source"],
    )
    failing = GaugeMetricFamily(
        "convoy_sync_failing", "1 while a source's sync passes fail.", labels=["source"]
    )
    for name, at, took, error in SyncSource.objects.values_list(
        "name", "last_pass_at", "seconds", "error"
    ):
        label = [name[:SOURCE_LABEL_MAX]]
        seconds.add_metric(label, took)
        if at is not None:
            lag.add_metric(label, max((now - at).total_seconds(), 0.0))
        failing.add_metric(label, 1 if error else 0)
    yield from (seconds, lag, failing)


def _notifications(now: datetime) -> Iterator[Metric]:
    family = CounterMetricFamily(
        "convoy_notifications", "Notifications delivered in the app, by kind.", labels=["kind"]
    )
    for kind, n in sorted(Notification.objects.values_list("kind").annotate(n=Count("pk"))):
        family.add_metric([kind], n)
    yield family
    late = now - timedelta(seconds=UNSENT_AFTER)
    got = Notification.objects.aggregate(
        sent=Count("pk", filter=Q(emailed_at__isnull=False)),
        unsent=Count(
            "pk", filter=Q(email_wanted=True, emailed_at__isnull=True, created_at__lt=late)
        ),
    )
    yield CounterMetricFamily(
        "convoy_notification_emails_sent", "Notification e-mails sent.", value=got["sent"]
    )
    yield GaugeMetricFamily(
        "convoy_notification_emails_failed",
        f"Notification e-mails wanted and not sent {UNSENT_AFTER:.0f} s on (failed).",
        value=got["unsent"],
    )


class TownCollector(Collector):
    """The town's figures, read afresh at each scrape (about twenty aggregate queries)."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        yield from _convoys()
        yield from _beads(now)
        yield from _capacity(now)
        yield from _dispatches()
        yield from _live(now)
        yield from _sync(now)
        yield from _notifications(now)


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(TownCollector())
ProcessCollector(registry=REGISTRY)
WEBSOCKETS = Gauge("convoy_websockets_open", "Websockets open in this process.", registry=REGISTRY)


def render() -> bytes:
    return generate_latest(REGISTRY)
