"""A graph's layout is content-addressed and shared: with Redis configured, the layout one web
process computed is there for every other (Django's cache framework); without it, each
process keeps its own."""

import os

import pytest
from django.conf import settings
from django.core.cache import cache

from convoys.services import convoys

from .support.databases import redis_url
from .support.factories import bead, blocks
from .support.users import signed_in


@pytest.mark.redis
def test_a_layout_computed_once_is_in_the_shared_cache(routes):
    import redis

    url = redis_url()
    assert settings.CACHES["default"]["BACKEND"].endswith("RedisCache")
    for i in range(4):
        bead(f"gt-l{i}")
    blocks("gt-l0", "gt-l1")
    blocks("gt-l1", "gt-l2")
    convoy = convoys.create("Laid out", ["gt-l0", "gt-l1", "gt-l2", "gt-l3"], actor="test")
    client = signed_in("viewer", "view_convoy", "view_bead")
    assert client.get(f"/convoys/{convoy.pk}/").status_code == 200
    # Another process's view of the store: a connection of its own, not this process's client.
    other = redis.Redis.from_url(url)
    keys = other.keys(f"convoyweb:1:dag:{convoy.pk}:*")
    assert len(keys) == 1
    assert cache.get(keys[0].decode().removeprefix("convoyweb:1:")) is not None


def test_without_redis_each_process_keeps_its_own(settings):
    if os.environ.get("REDIS_URL"):
        pytest.skip("runs where REDIS_URL is unset")
    assert settings.CACHES["default"]["BACKEND"].endswith("LocMemCache")
