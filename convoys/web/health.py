"""Readiness for a load balancer (/readyz): the database, the channel layer, the task
cluster's last tick and the live relay's lag, each a few milliseconds, named when wrong.

The cluster rule is `ticker.stalled_since` (also the dashboard's banner and `serve`'s
restart); the relay's lag is `relay.lag`. Nothing here writes a row.
"""

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.utils import timezone

from convoys.live import relay
from convoys.services import ticker

LAYER_TIMEOUT = 2.0  # seconds a channel layer may take to answer
PROBE_GROUP = "health.probe"  # a group nobody joins: a send to it reaches the layer only

Check = dict[str, Any]  # {"ok": bool, …details}


def database() -> Check:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {"ok": True}


async def _probe_layer() -> None:
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer configured")
    await asyncio.wait_for(
        layer.group_send(PROBE_GROUP, {"type": "health.probe"}), timeout=LAYER_TIMEOUT
    )


def channel_layer() -> Check:
    async_to_sync(_probe_layer)()
    return {"ok": True}


def cluster(now: datetime) -> Check:
    stalled, tick = ticker.stalled_since(now)
    check: Check = {"ok": not stalled, "last_tick": tick.isoformat() if tick else None}
    if stalled:
        check["error"] = (
            "no task cluster has ticked"
            if tick is None
            else f"no tick for {(now - tick).total_seconds():.0f} s "
            f"(stalled after {ticker.stall_after():.0f} s)"
        )
    return check


def relay_lag(now: datetime) -> Check:
    lag = relay.lag(now)
    if lag is None:  # not a fault: a relay starts with the first websocket it serves
        return {"ok": True, "running": False, "note": "no relay yet: no page is watching live"}
    limit = float(settings.CONVOY_READY_RELAY_LAG)
    check: Check = {
        "ok": lag.seconds <= limit,
        "running": True,
        "relay": lag.relay,
        "events": lag.events,
        "seconds": round(lag.seconds, 3),
    }
    if not check["ok"]:
        check["error"] = f"{lag.events} events unrelayed, the oldest {lag.seconds:.0f} s old"
    return check


def _run(check: Callable[[], Check]) -> Check:
    started = time.monotonic()
    try:
        result = check()
    except Exception as exc:  # a check that fails names why; the others still run
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    result["ms"] = round((time.monotonic() - started) * 1000, 1)
    return result


def readiness() -> tuple[bool, dict[str, Any]]:
    """(all good, the JSON body): every check, and `failing`, the names of those that are
    not ok. Without the database the cluster and relay checks fail too, each saying so."""
    now = timezone.now()
    checks = {
        "database": _run(database),
        "channel_layer": _run(channel_layer),
        "cluster": _run(lambda: cluster(now)),
        "relay": _run(lambda: relay_lag(now)),
    }
    failing = [name for name, check in checks.items() if not check["ok"]]
    return not failing, {"ok": not failing, "failing": failing, "checks": checks}
