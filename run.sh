#!/usr/bin/env bash
# One command: install into .venv (once per change of the lock), migrate, load demo data, start web + task cluster + swarm.
# Arguments go to `manage.py demo`: `./run.sh --reset` wipes the demo data and loads it afresh.
set -euo pipefail
cd "$(dirname "$0")"
case "${1:-}" in -h|--help)
  cat <<'USAGE'
usage: ./run.sh [--reset]
  Installs into .venv, migrates the SQLite database, loads the demo and runs the web server,
  the task cluster and the demo swarm. Log in as demo / convoy-demo.
  --reset          wipe beads, convoys, events and notifications; load the demo afresh
environment:
  PORT=9000        another port (default 8000)
  CONVOY_SWARM=0   no simulated workers
  DATABASE_URL     another database (default: convoyweb.sqlite3 here)
  DEBUG=1          Django's debug pages (default 0)
To follow a real town instead of the demo, see README.md ("Following a real town").
USAGE
  exit 0;;
esac
requirements/install run  # from the lock, hashes checked; skipped when nothing changed
export DEBUG=${DEBUG:-0}  # the debug page only when asked (DEBUG=1); WhiteNoise serves static
.venv/bin/python manage.py demo --prepare "$@"  # migrate, collect static files, load the demo
SWARM=--swarm
[ "${CONVOY_SWARM:-1}" = "0" ] && SWARM=""
echo "Log in as demo / convoy-demo  (./run.sh --reset starts the demo afresh)"
exec .venv/bin/python manage.py serve --port "${PORT:-8000}" $SWARM
