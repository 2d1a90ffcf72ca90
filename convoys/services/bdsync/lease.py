"""One pass per source at a time: a lease per source, taken from a holder on this host whose
process is gone rather than waited out.
"""

import hashlib
import logging
import os
import socket
import threading
from datetime import timedelta

from django.utils import timezone

from convoys.models import (
    Lease,
)

log = logging.getLogger("convoys.sync")


# A pass longer than this loses its lease to the next one (a pass is one transaction, so the
# lease cannot be renewed during it); a cluster killed mid-pass holds the source this long,
# unless the next pass runs on the same host (it sees the holder's process is gone).
LEASE_TTL = 180.0


def default_holder() -> str:
    """This thread's name as a lease holder: host, process id, thread id."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def take_from_the_dead(lease: str, holder: str) -> bool:
    """Take a source's lease from a holder on this host whose process is gone (a cluster
    killed mid-pass), rather than wait out LEASE_TTL; one conditional update, so of several
    takers one wins."""
    held = Lease.objects.filter(name=lease).values_list("holder", flat=True).first() or ""
    host, _, rest = held.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
        return False  # alive (or another's: PermissionError is an OSError too)
    except ProcessLookupError:
        pass
    except OSError:
        return False
    expires = timezone.now() + timedelta(seconds=LEASE_TTL)
    taken = Lease.objects.filter(name=lease, holder=held).update(holder=holder, expires_at=expires)
    if taken:
        log.warning("took the sync lease of %s from %s, which is gone", lease, held)
    return bool(taken)


def lease_name(source_name: str) -> str:
    """The name of a source's lease (a hash: a source's name may be long)."""
    return "sync:" + hashlib.blake2b(source_name.encode(), digest_size=16).hexdigest()
