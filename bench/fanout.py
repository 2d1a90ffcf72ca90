"""Websocket fan-out: N subscribers on loopback, landings produced by the real feeder.

Starts daphne and the task cluster on a fresh database, connects N websocket clients to the
dashboard topic, then lands K convoys by closing their beads (the cluster's feeder lands
them). Reports end-to-end latency (event row written -> client receipt) p50/p99, events
lost after a final replay (must be 0), and daphne's resident memory.

    .venv/bin/python bench/fanout.py [--clients 1000] [--landings 30]
With BENCH_DATABASE_URL=postgres://… and REDIS_URL=redis://… it measures the Redis layer.
"""

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, median, percentile, setup  # noqa: E402


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def client(url, cookie, since, received, ready, finish):
    """Record first receipt of each landing; at the end ask for a replay to fill any gap."""
    import websockets

    async with websockets.connect(
        url + f"&since={since}",
        max_size=None,
        open_timeout=120,
        additional_headers={
            "Cookie": cookie,
            "Origin": url.split("/ws/")[0].replace("ws://", "http://", 1),
        },
    ) as ws:
        # Live once the initial replay (the page's catch-up after `since`) has arrived.
        while json.loads(await ws.recv()).get("type") != "replayed":
            pass
        ready.append(1)
        seen = {}
        received.append(seen)
        asked = asyncio.Event()

        async def ask():
            await finish.wait()
            await ws.send(json.dumps({"type": "replay", "since": since}))
            asked.set()

        asker = asyncio.create_task(ask())
        async for raw in ws:
            message = json.loads(raw)
            if message.get("type") == "event" and message["kind"] == "convoy.landed":
                seen.setdefault(message["seq"], time.time())
            elif message.get("type") == "replayed" and asked.is_set():
                break
        asker.cancel()


async def run(args, port, cookies, since, land):
    url = f"ws://127.0.0.1:{port}/ws/live/?topics=dashboard"
    received, ready, finish = [], [], asyncio.Event()
    tasks = []
    for i in range(args.clients):
        cookie = cookies[i % len(cookies)]
        tasks.append(asyncio.create_task(client(url, cookie, since, received, ready, finish)))
        if i % 100 == 99:
            await asyncio.sleep(0.2)
    waited = 0
    while len(ready) < args.clients:
        failed = [t for t in tasks if t.done()]
        if failed:
            raise SystemExit(f"{len(failed)} clients failed to connect: {failed[0].exception()!r}")
        await asyncio.sleep(0.1)
        waited += 1
        if waited % 100 == 0:
            print(f"{len(ready)}/{args.clients} clients live", file=sys.stderr)
    await asyncio.to_thread(land)
    await asyncio.sleep(args.settle)
    finish.set()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=300)
    return received


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--landings", type=int, default=20)
    parser.add_argument("--settle", type=float, default=15)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between landings")
    args = parser.parse_args()
    url = setup()
    from django.contrib.auth.models import User
    from django.test import Client

    from convoys.log.events import last_seq
    from convoys.models import Bead, Event
    from convoys.services import beads, convoys, rigs

    rigs.upsert_route("gt-", "gastown")
    # Ten pages per viewer: replays are bounded per user (convoys/live/consumers.py).
    cookies = []
    for n in range(max(1, args.clients // 10)):
        user = User(username=f"fan{n}", is_superuser=True, is_staff=True)
        user.set_unusable_password()
        user.save()
        web_client = Client()
        web_client.force_login(user)
        cookies.append(f"sessionid={web_client.cookies['sessionid'].value}")
    ids = []
    for i in range(args.landings):
        bead = beads.create_bead(f"Landing {i}", bead_id=f"gt-f{i:04d}")
        convoys.create(f"Fan-out {i}", [bead.id])
        ids.append(bead.id)
    Bead.objects.filter(pk__in=ids).update(status="hooked", assignee="gastown/polecats/nux")
    port = free_port()
    daphne_log = open(Path(tempfile.gettempdir()) / "convoyweb-fanout-daphne.log", "w")
    print(f"daphne log: {daphne_log.name}", file=sys.stderr)
    env = {**os.environ, "DATABASE_URL": url, "CONVOY_STRANDED_INTERVAL": "3600"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "daphne", "-p", str(port), "convoyweb.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=daphne_log,
            start_new_session=True,
        ),
        subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "cluster"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        ),
    ]
    time.sleep(4)
    since = last_seq()

    def land():
        for bead_id in ids:
            beads.close_bead(bead_id)
            time.sleep(args.every)

    try:
        received = asyncio.run(run(args, port, cookies, since, land))
        memory = rss_mb(procs[0].pid)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
    landed = {e.seq: e.created_at.timestamp() for e in Event.objects.filter(kind="convoy.landed")}
    latencies, lost = [], 0
    for seen in received:
        lost += len(set(landed) - set(seen))
        latencies += [seen[s] - landed[s] for s in seen if s in landed]
    layer = "Redis" if os.environ.get("REDIS_URL") else "in-memory (embedded default)"
    print(
        f"{layer}: {len(received)} clients x {len(landed)} landings; latency p50 "
        f"{median(latencies) * 1000:.0f} ms, p99 {percentile(latencies, 99) * 1000:.0f} ms; "
        f"lost {lost}; daphne RSS {memory:.0f} MB; target p99 < 1 s"
    )


if __name__ == "__main__":
    main()
