"""Time-bounded locks taken with one conditional update; safe across processes and databases."""

import time
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from convoys.models import Lease


def acquire(name: str, holder: str, ttl: float) -> bool:
    """Take `name` for `ttl` seconds if it is free, expired or already ours."""
    now = timezone.now()
    expires = now + timedelta(seconds=ttl)
    taken = (
        Lease.objects.filter(name=name)
        .filter(Q(expires_at__lte=now) | Q(holder=holder))
        .update(holder=holder, expires_at=expires)
    )
    if taken:
        return True
    try:
        with transaction.atomic():
            Lease.objects.create(name=name, holder=holder, expires_at=expires)
        return True
    except IntegrityError:
        return False


def release(name: str, holder: str) -> None:
    Lease.objects.filter(name=name, holder=holder).update(expires_at=timezone.now())


def acquire_waiting(name: str, holder: str, ttl: float, wait: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + wait
    while True:
        if acquire(name, holder, ttl):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)
