"""What tests share, one module per concern: `users` (users, rights, logged-in clients),
`factories` (test data), `pages` and `admin` (pages as users get them), `live` (websocket
clients), `browser` (Chromium), `processes` (real servers and clusters), `waiting` (polling),
`sync` (a town on disk), `databases`, `paths` and `redis_per_worker` (a plugin for parallel runs
on Redis). Test modules import helpers from here and never
from each other; the fixtures defined here are registered in conftest.py (`pytest_plugins`)."""
