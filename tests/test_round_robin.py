"""Two web processes behind a round-robin proxy (as a load balancer spreads requests): a
convoy page and the dashboard open in Chromium follow the convoy live through its events to
its landing, and after every step each page's live DOM equals a reload, whichever process
answered what."""

import asyncio
import os
import signal
import subprocess
import threading

import pytest

from convoys.models import Bead, Convoy
from convoys.services import beads, staging
from convoys.services.launch import launch_staged

from .support.browser import login, wait_live
from .support.factories import bead, blocks, child
from .support.pages import assert_live_equals_reload
from .support.processes import child_env, free_port, spawn, wait_port
from .support.users import full_staff
from .support.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class RoundRobin:
    """A TCP proxy that sends each connection to the next backend in turn, and asks the
    backend to close each plain HTTP connection after its response (a `Connection: close`
    request header), so that every request opens a connection of its own: consecutive
    requests of one page alternate between the processes. Websockets pass as they are."""

    def __init__(self, backends):
        self.backends, self.turn = backends, 0
        self.served = dict.fromkeys(backends, 0)
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self.ready.set()
        self.loop.run_forever()
        server.close()
        self.loop.run_until_complete(server.wait_closed())
        self.loop.close()

    async def _handle(self, reader, writer):
        backend = self.backends[self.turn % len(self.backends)]
        self.turn += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = head.split(b"\r\n")
        if not any(line.lower().startswith(b"upgrade:") for line in lines):
            kept = [line for line in lines if not line.lower().startswith(b"connection:")]
            head = b"\r\n".join([kept[0], b"Connection: close", *kept[1:]])
        self.served[backend] += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", backend)
        up_writer.write(head)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, source, sink):
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except ConnectionError:
            pass
        finally:
            sink.close()

    async def _stop(self):
        """Cancels the connections still open and waits for them, so that no pending task is
        left for the garbage collector to report in whichever test runs next."""
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.loop.stop()

    def close(self):
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop)
        self.thread.join(10)


@pytest.fixture
def balanced(transactional_db):
    """Two web processes and a task cluster on the test database, behind a RoundRobin."""
    env = child_env(CONVOY_FEED_INTERVAL="1", CONVOY_STRANDED_INTERVAL="2", DEBUG="1")
    ports = [free_port(), free_port()]
    procs = [spawn("web", env, port) for port in ports] + [spawn("cluster", env)]
    proxy = None
    try:
        for port in ports:
            wait_port(port)
        proxy = RoundRobin(ports)
        yield proxy
    finally:
        if proxy is not None:
            proxy.close()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_pages_behind_two_web_processes_equal_a_reload_to_the_landing(browser, balanced, routes):
    bead("gt-rr", "Balanced epic", type="epic")
    for bead_id in ("gt-r1", "gt-r2", "gt-r3"):
        bead(bead_id, f"Part {bead_id[-1]}")
        child("gt-rr", bead_id)
    blocks("gt-r1", "gt-r2")
    convoy_id = staging.stage(["gt-rr"], actor="test").convoy_id
    full_staff("rosa")
    base = f"http://127.0.0.1:{balanced.port}"
    context, dashboard = login(browser, base, "rosa")
    convoy = context.new_page()
    convoy.goto(f"{base}/convoys/{convoy_id}/")
    pages = {"dashboard": dashboard, "convoy": convoy}
    for page in pages.values():
        wait_live(page)
    assert_live_equals_reload(pages, "opening")

    launch_staged(convoy_id, force=True, actor="test")
    assert_live_equals_reload(pages, "the launch")
    beads.close_bead("gt-r1", actor="test")
    wait_until(lambda: Bead.objects.get(pk="gt-r2").status == "hooked")  # fed by the cluster
    assert_live_equals_reload(pages, "a close (the next bead fed)")
    for bead_id in ("gt-r2", "gt-r3"):
        beads.close_bead(bead_id, actor="test")
    wait_until(lambda: Convoy.objects.get(pk=convoy_id).status == "closed")
    assert_live_equals_reload(pages, "the landing")
    # Both processes answered the pages' requests (page loads, live fetches, reloads).
    assert min(balanced.served.values()) >= 5, balanced.served
    context.close()
