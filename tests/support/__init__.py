"""What tests share, one module per concern: `users` (users, rights, logged-in clients),
`factories` (test data), `pages` and `admin` (pages as users get them), `live` (websocket
clients), `browser` (Chromium), `processes` (real servers and clusters), `waiting` (polling),
`sync` (a town on disk), `databases` and `paths`. Test modules import helpers from here and never
from each other; the fixtures defined here are registered in conftest.py (`pytest_plugins`)."""
