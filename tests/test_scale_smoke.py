"""Multi-process smoke test on PostgreSQL + Redis: two web processes, two task clusters; a
convoy launched through one web process lands, and the landing is seen over a websocket
connected to the other web process."""

import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from convoys.models import Convoy
from convoys.services.tokens import create_token

from .support.databases import is_postgres, redis_url, require_postgres
from .support.factories import bead, blocks
from .support.processes import child_env, free_port, spawn, wait_port
from .support.users import PASSWORD

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def api(port, token, method, path, body=None):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_two_web_two_clusters_land_and_push_across_processes(routes):
    require_postgres()
    url = redis_url()
    assert is_postgres()
    user = User.objects.create_user("ops", password=PASSWORD)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="convoys"))
    token = create_token(user, "smoke")
    client = Client()
    client.force_login(user)
    cookie = client.cookies["sessionid"].value
    ids = [bead(f"gt-m{i}").id for i in range(4)]
    blocks(ids[0], ids[1])
    env = child_env(REDIS_URL=url, CONVOY_FEED_INTERVAL="1", CONVOY_STRANDED_INTERVAL="2")
    ports = [free_port(), free_port()]
    procs = [spawn("web", env, port) for port in ports]
    procs += [spawn("cluster", env) for _ in range(2)]
    try:
        for port in ports:
            wait_port(port)
        received = []

        async def listen():
            import websockets

            async with websockets.connect(
                f"ws://127.0.0.1:{ports[1]}/ws/live/?topics=dashboard",
                additional_headers={
                    "Cookie": f"sessionid={cookie}",
                    "Origin": f"http://127.0.0.1:{ports[1]}",
                },
            ) as ws:
                launched = await asyncio.to_thread(
                    api, ports[0], token, "POST", "/launch", {"ids": ids, "force": True}
                )
                deadline = time.monotonic() + 60
                closed = set()
                while time.monotonic() < deadline:
                    try:
                        message = json.loads(await asyncio.wait_for(ws.recv(), timeout=1))
                    except TimeoutError:
                        message = None
                    if message and message.get("type") == "event":
                        received.append(message)
                        if message["kind"] == "convoy.landed":
                            return launched
                    # workers: close whatever is hooked, through web process 1
                    hooked = await asyncio.to_thread(
                        api, ports[0], token, "GET", "/beads?status=hooked"
                    )
                    for row in hooked:
                        if row["id"] not in closed:
                            closed.add(row["id"])
                            await asyncio.to_thread(
                                api, ports[0], token, "POST", f"/beads/{row['id']}/close", {}
                            )
                return launched

        launched = asyncio.run(listen())
        landed = [m for m in received if m["kind"] == "convoy.landed"]
        assert landed and landed[0]["convoy_id"] == launched["convoy_id"]
        assert Convoy.objects.get(pk=launched["convoy_id"]).status == "closed"
        seqs = [m["seq"] for m in received]
        assert len(seqs) == len(set(seqs))
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
