"""A Redis database of its own for each xdist worker (`-p tests.support.redis_per_worker`):
worker gwN's REDIS_URL names database N + 1, so parallel workers share no channel-layer
group, cache key or task queue. Loaded as a plugin, before Django reads its settings, so the
worker's settings, and the servers and clusters its tests start, all see the worker's URL."""

import os
import re

worker = os.environ.get("PYTEST_XDIST_WORKER", "")
url = os.environ.get("REDIS_URL", "")
if worker.startswith("gw") and url:
    number = int(worker.removeprefix("gw")) + 1
    base = re.sub(r"/\d+$", "", url.rstrip("/"))
    os.environ["REDIS_URL"] = f"{base}/{number}"
