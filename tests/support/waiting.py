"""Polling for what another process or thread does: `wait_for` says whether it happened in
time, `wait_until` fails the test when it did not."""

import time


def wait_for(predicate, timeout=30, step=0.05):
    """True as soon as `predicate()` is; False once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def wait_until(condition, timeout=30, step=0.1):
    """Return once `condition()` is true; fail the test if it is not within `timeout` seconds."""
    assert wait_for(condition, timeout, step), f"not true within {timeout} s"
