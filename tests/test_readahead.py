"""The read-ahead child process that the importer parses large files in."""

import os

import pytest

from convoys import readahead

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
