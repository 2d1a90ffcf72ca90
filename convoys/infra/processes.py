"""Process hygiene for the long-running commands (`cluster`, `serve`): children that die with
their parent, so a kill -9 of the parent leaves nothing working the queue or holding a port."""

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, sig: signal.Signals = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent exits (Linux). Returns
    False where that is not available; the caller then keeps the portable behaviour."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os.kill(os.getpid(), sig)
    return True
