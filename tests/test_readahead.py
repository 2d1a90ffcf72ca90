"""The read-ahead child process that the importer parses large files in."""

import os

import pytest

from convoys.infra import readahead

pytestmark = pytest.mark.skipif(not readahead.available(), reason="needs fork (Linux)")


def numbers(count, fail_at=None):
    for n in range(count):
        if n == fail_at:
            raise ValueError(f"bad item {n}")
        yield n, os.getpid()


def test_items_arrive_in_order_from_another_process():
    items = list(readahead.in_child(numbers, 5000))
    assert [n for n, _ in items] == list(range(5000))
    assert {pid for _, pid in items} != {os.getpid()}


def test_the_generators_exception_is_raised_in_the_parent_after_its_items():
    seen = []
    with pytest.raises(ValueError, match="bad item 3"):
        for n, _ in readahead.in_child(numbers, 10, 3):
            seen.append(n)
    assert seen == [0, 1, 2]


def test_stopping_early_stops_the_child():
    items = readahead.in_child(numbers, 10**9)
    _, child = next(items)
    os.kill(child, 0)  # running
    items.close()
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def killed_after_one():
    yield 1
    os.kill(os.getpid(), 9)
    yield 2


def test_a_child_that_dies_is_an_error_not_a_hang():
    items = readahead.in_child(killed_after_one)
    assert next(items) == 1
    with pytest.raises(ChildProcessError, match=r"ended unexpectedly \(exit code -9\)"):
        next(items)


def test_a_parent_killed_with_sigkill_takes_its_child_along(tmp_path):
    """`beads import` killed mid-way must not leave its read-ahead child blocked for ever."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import itertools, os, sys, time\n"
        "from convoys.infra import readahead\n"
        "def forever():\n"
        "    for n in itertools.count():\n"
        "        yield b'x' * 65536\n"
        "items = readahead.in_child(forever)\n"
        "next(items)\n"
        "print(os.getpid(), flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    try:
        pid = int(parent.stdout.readline())
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
        assert len(children) == 1
        child = int(children[0])
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(child):
            time.sleep(0.05)
        assert not _alive(child), "the read-ahead child outlived its killed parent"
    finally:
        parent.kill()


def _alive(pid):
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
