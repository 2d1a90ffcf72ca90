#!/usr/bin/env bash
# One command: install into .venv (with test tools) and run the whole test suite.
# Browser tests need Debian's chromium; as root this installs it when it is missing.
set -euo pipefail
cd "$(dirname "$0")"
requirements/install test  # from the lock with the test tools; skipped when nothing changed
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "warning: could not install chromium; browser tests will skip" >&2
fi
.venv/bin/python manage.py collectstatic --noinput -v0
exec .venv/bin/python -m pytest "$@"
