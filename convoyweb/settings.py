"""convoyweb settings: every value comes from an environment variable with a safe default.

The embedded default (nothing set) is SQLite in the project folder, django-q2 on the ORM
broker and the in-memory channel layer. `DATABASE_URL=postgres://…` and `REDIS_URL=redis://…`
switch to the scale-out stack. docs/configuration.md lists every variable.
"""

import importlib.util
import ipaddress
import logging
import os
import tempfile
from collections.abc import Callable, Collection
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

_Number = TypeVar("_Number", int, float)

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def _env_number(
    name: str, default: _Number, kind: Callable[[str], _Number], minimum: _Number | None
) -> _Number:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        number = kind(value)
    except ValueError:
        number = None
    if number is None or (minimum is not None and number < minimum):
        what = "a whole number" if kind is int else "a number"
        least = f" of at least {minimum}" if minimum is not None else ""
        raise ImproperlyConfigured(f"{name} must be {what}{least}, not {value!r}")
    return number


def env_int(name: str, default: int, minimum: int | None = None) -> int:
    return _env_number(name, default, int, minimum)


def env_float(name: str, default: float, minimum: float | None = None) -> float:
    return _env_number(name, default, float, minimum)


def env_choice(name: str, default: str, choices: Collection[str]) -> str:
    value = (os.environ.get(name) or default).strip().upper()
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)
PRODUCTION = env_bool("CONVOY_PRODUCTION", False)
# Development key: fine on a laptop, refused in production (below).
DEVELOPMENT_KEY = "convoyweb-development-key-not-for-production-use-0123456789abcdef"
SECRET_KEY = os.environ.get("SECRET_KEY", "").strip()
# Whatever DEBUG says: a production server never signs sessions with a published key.
if PRODUCTION and SECRET_KEY in ("", DEVELOPMENT_KEY):
    raise ImproperlyConfigured("SECRET_KEY must be set when CONVOY_PRODUCTION=1")
SECRET_KEY = SECRET_KEY or DEVELOPMENT_KEY

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    # The admin registers its ModelAdmins when the URLconf loads (convoyweb/urls.py), not at
    # every command's start-up; `serve` runs daphne itself, so daphne is no app either.
    "django.contrib.admin.apps.SimpleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "channels",
    "django_q",
    "csp",
    "axes",
    "convoys",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # An id per request, in X-Request-ID and on every log line it causes (and with
    # LOG_FORMAT=json the access line).
    "convoyweb.logs.RequestIds",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # After WhiteNoise: static files keep their own caching; everything else a signed-in user
    # is answered is never stored.
    "convoyweb.middleware.NoStoreWhenSignedIn",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "convoyweb.middleware.DatabaseUnavailable",
    "convoyweb.middleware.ApiMethodNotAllowed",
    # Last, as its documentation asks: it answers a locked-out login attempt.
    "axes.middleware.AxesMiddleware",
]

AUTHENTICATION_BACKENDS = [
    # First, so a locked-out username + IP is refused before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "convoyweb.urls"
ASGI_APPLICATION = "convoyweb.asgi.application"
WSGI_APPLICATION = "convoyweb.wsgi.application"

# The API docs page renders with django-ninja's own template and static Swagger UI (no CDN),
# found where ninja is installed; "ninja" is no app, so no command pays for importing it.
NINJA_FILES = Path(importlib.util.find_spec("ninja").origin or "").parent  # type: ignore[union-attr]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates", NINJA_FILES / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "convoys.web.context.unread_count",
                "convoys.web.context.browser_rules",
            ],
        },
    },
]

# --- Database ---------------------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'convoyweb.sqlite3'}"
_db = dj_database_url.parse(DATABASE_URL, conn_max_age=0)
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # WAL + IMMEDIATE transactions: the only combination with zero "database is locked"
    # under concurrent writers.
    _db["OPTIONS"] = {
        # Other modes exist only for bench/soak.py's negative control.
        "transaction_mode": env_choice(
            "SQLITE_TRANSACTION_MODE", "IMMEDIATE", ("IMMEDIATE", "DEFERRED", "EXCLUSIVE")
        ),
        "timeout": env_int("SQLITE_TIMEOUT", 20),
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file, not memory: fault and race tests run real processes against the test database.
    # One per test run (the process id), so two test runs on one machine never share it.
    _db["TEST"] = {
        "NAME": os.environ.get("SQLITE_TEST_NAME")
        or os.path.join(tempfile.gettempdir(), f"convoyweb-test-{os.getpid()}.sqlite3")
    }
elif _db["ENGINE"] == "django.db.backends.postgresql":
    # A connection attempt gives up after this long instead of waiting forever (a thread
    # stuck in connect held a test run open after its last test).
    connect_timeout = env_int("DATABASE_CONNECT_TIMEOUT", 10, minimum=1)
    _db["OPTIONS"] = {"connect_timeout": connect_timeout}
    # Persistent connections leak under ASGI: CONN_MAX_AGE stays 0; use the pool instead.
    if env_bool("DATABASE_POOL", False):
        _db["OPTIONS"]["pool"] = {
            "min_size": 1,
            "max_size": env_int("DATABASE_POOL_SIZE", 10),
            # A request waits for a connection no longer than a connection attempt may take
            # (the pool's own default is 30 s): a database outage is a prompt 503.
            "timeout": connect_timeout,
        }
        # Each connection is checked as the pool hands it out: after an outage the dead ones
        # are replaced, not handed to the next requests.
        _db["CONN_HEALTH_CHECKS"] = True
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static", NINJA_FILES / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if not DEBUG and PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}
WHITENOISE_USE_FINDERS = True

# --- Security: on by default in production (each can be turned off by its own variable) --------
# Behind a proxy that terminates TLS, set SECURE_PROXY_SSL_HEADER=1 (the proxy sends
# X-Forwarded-Proto) or SECURE_SSL_REDIRECT=0: the redirect would otherwise loop.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", PRODUCTION)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", PRODUCTION)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", PRODUCTION)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 365 * 24 * 3600 if PRODUCTION else 0, 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", PRODUCTION)
# Never by default: a preload list entry is a months-long commitment for the whole domain
# that only its operator can make, so the check asking for it (W021) is silenced.
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SILENCED_SYSTEM_CHECKS = ["security.W021"]
if env_bool("SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
USE_X_FORWARDED_HOST = env_bool("USE_X_FORWARDED_HOST", False)
# Error pages (the debug page included) never show a database or Redis URL or password.
DEFAULT_EXCEPTION_REPORTER_FILTER = "convoyweb.reporting.HideConnectionSecrets"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Content Security Policy (django-csp 4): only our own scripts, styles and connections; no
# inline <script>, style="..." or on*= attributes anywhere (scripts set element.style instead).
# 'self' covers the same-origin websocket (ws:/wss:) in CSP Level 3 browsers.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        # data: for the favicon badge (canvas.toDataURL) and Swagger UI's icons.
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

# Login throttling (django-axes): 10 failures for one username from one IP lock that pair for
# AXES_COOLOFF_MINUTES; another user, or the same user elsewhere, is not locked.
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 10)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("AXES_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# The page says when the pair may try again (the lock runs from the last counted failure).
AXES_LOCKOUT_CALLABLE = "convoyweb.lockout.locked_out"
AXES_USERNAME_CALLABLE = "convoyweb.lockout.attempted_username"

EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "convoyweb@localhost")

# --- Channels and django-q2 -------------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # redis-py 8 caps the async pool at 100 and raises beyond it.
                "hosts": [{"address": REDIS_URL, "max_connections": 2000}],
                "capacity": 200,
                # Members of a crashed web process expire instead of slowing every send.
                "group_expiry": 300,
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "convoys.live.layers.InMemoryChannelLayer"}}
# Content-addressed results (a graph's layout, keyed by its fingerprint) are shared by every
# process through Redis when there is one; the embedded default keeps them per process.
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "convoyweb",
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# A task must finish before `retry`, or the ORM broker hands it out again.
CONVOY_TASK_TIMEOUT = env_int("CONVOY_TASK_TIMEOUT", 60)
Q_CLUSTER = {
    "name": "convoyweb",
    "workers": env_int("CONVOY_WORKERS", 2),
    "timeout": CONVOY_TASK_TIMEOUT,
    "retry": env_int("CONVOY_TASK_RETRY", 90),
    "max_attempts": 3,
    "ack_failures": True,
    "catch_up": False,
    "save_limit": 100,
    "queue_limit": 20,
    "recycle": 500,
    "poll": 0.1,
    "label": "Tasks",
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
else:
    Q_CLUSTER["orm"] = "default"

# --- convoyweb behaviour ------------------------------------------------------------------------
CONVOY_DISPATCHER = os.environ.get("CONVOY_DISPATCHER", "builtin")
CONVOY_DISPATCH_COMMAND = os.environ.get("CONVOY_DISPATCH_COMMAND", "")
CONVOY_DISPATCH_TIMEOUT = env_float("CONVOY_DISPATCH_TIMEOUT", 30.0)
# With CONVOY_DISPATCHER=command: run to tell a worker it lost a bead (release, reassign).
CONVOY_RELEASE_COMMAND = os.environ.get("CONVOY_RELEASE_COMMAND", "")
# The most beads one bead action (`POST /api/beads/actions`, `beads skip A B …`) takes.
CONVOY_ACTION_MAX_BEADS = env_int("CONVOY_ACTION_MAX_BEADS", 500, minimum=1)
# A claim whose process has not called the dispatcher within this many seconds (or, once
# called, not recorded its answer within CONVOY_DISPATCH_TIMEOUT plus this) is settled by the
# next catch-up: released back to ready, unless its worker reported (services/dispatch.py).
CONVOY_CLAIM_GRACE = env_float("CONVOY_CLAIM_GRACE", 30.0, minimum=1)
# A dispatch command that runs a shell (sh -c, ssh …) is refused unless this is on; then every
# value substituted into it is shell-quoted (convoys/infra/dispatchers.py).
CONVOY_DISPATCH_SHELL = env_bool("CONVOY_DISPATCH_SHELL", False)
CONVOY_FEED_INTERVAL = env_float("CONVOY_FEED_INTERVAL", 5.0)
# `serve` prints what the town did (convoys moving, landed, in flight, errors) this often.
CONVOY_STATUS_EVERY = env_float("CONVOY_STATUS_EVERY", 60.0, minimum=1)
# A close feeds every bead it made ready, up to max in flight and the town cap (FILL); ONE
# feeds one per close, as the original does, and leaves the rest to the scans.
CONVOY_FEED = env_choice("CONVOY_FEED", "FILL", ("FILL", "ONE"))
CONVOY_STRANDED_INTERVAL = env_float("CONVOY_STRANDED_INTERVAL", 30.0)
CONVOY_RETRY_COOLDOWN = env_float("CONVOY_RETRY_COOLDOWN", 60.0)
CONVOY_MAX_DISPATCH_FAILURES = env_int("CONVOY_MAX_DISPATCH_FAILURES", 3)  # then the bead is parked
# Beads in flight across all convoys, 0 = unlimited (convoys/rules/capacity.py);
# `convoy capacity --set N` overrides it at run time.
CONVOY_MAX_IN_FLIGHT = env_int("CONVOY_MAX_IN_FLIGHT", 0, minimum=0)
CONVOY_WORKER_TIMEOUT = env_float("CONVOY_WORKER_TIMEOUT", 600.0)
# ?all=1 (every bead drawn and listed) is honoured up to this many tracked beads.
CONVOY_SHOW_ALL_MAX = env_int("CONVOY_SHOW_ALL_MAX", 2000, minimum=0)
CONVOY_EMPTY_GRACE = env_float("CONVOY_EMPTY_GRACE", 300.0)
# Escalation (convoys/services/escalation.py): no progress this long raises an action-needed
# notification; unacknowledged, it is raised again after CONVOY_REESCALATE_AFTER (twice at most).
CONVOY_STUCK_AFTER = env_float("CONVOY_STUCK_AFTER", 1800.0)
CONVOY_REESCALATE_AFTER = env_float("CONVOY_REESCALATE_AFTER", 4 * 3600.0)
# The daily digest e-mail of receipts goes out at this hour (UTC); the ticker checks every
# CONVOY_DIGEST_INTERVAL seconds whether one is due.
CONVOY_DIGEST_HOUR = env_int("CONVOY_DIGEST_HOUR", 7)
CONVOY_DIGEST_INTERVAL = env_float("CONVOY_DIGEST_INTERVAL", 300.0)
CONVOY_DISCOVERED_JOINS = env_bool("CONVOY_DISCOVERED_JOINS", True)
CONVOY_RELAY_INTERVAL = env_float("CONVOY_RELAY_INTERVAL", 0.1)
# The live websocket's limits (convoys/live/consumers.py): open sockets per user in each web process,
# topics per socket, frames a client may send a second (in bursts of up to 10 s' worth), and
# how often each socket checks its session and rights afresh: a backstop, since a revocation
# reaches open sockets at once (convoys/live/revocation.py).
CONVOY_WS_SOCKETS_PER_USER = env_int("CONVOY_WS_SOCKETS_PER_USER", 50, minimum=1)
CONVOY_WS_TOPICS = env_int("CONVOY_WS_TOPICS", 20, minimum=1)
CONVOY_WS_FRAMES_PER_S = env_float("CONVOY_WS_FRAMES_PER_S", 5.0, minimum=0.1)
CONVOY_WS_RECHECK = env_float("CONVOY_WS_RECHECK", 60.0, minimum=1.0)
CONVOY_IMPORT_MAX_LINE = env_int("CONVOY_IMPORT_MAX_LINE", 8 * 1024 * 1024)
# A worker's log (convoys/services/worklog.py): the longest line kept (longer ones are cut), and
# how many lines and bytes one bead keeps before its oldest lines are dropped.
CONVOY_LOG_LINE_CHARS = env_int("CONVOY_LOG_LINE_CHARS", 2000, minimum=1)
CONVOY_LOG_LINES = env_int("CONVOY_LOG_LINES", 1000, minimum=1)
CONVOY_LOG_BYTES = env_int("CONVOY_LOG_BYTES", 256 * 1024, minimum=1)
# `beads sync` sources the task cluster syncs continuously (a bd JSONL path or `cmd:<command>`)
CONVOY_SYNC_SOURCES = env_list("CONVOY_SYNC_SOURCES", [])
CONVOY_SYNC_INTERVAL = env_float("CONVOY_SYNC_INTERVAL", 10.0)
CONVOY_SYNC_TIMEOUT = env_float("CONVOY_SYNC_TIMEOUT", 120.0)  # a `cmd:` source's time limit

# --- Operations: /metrics, /healthz, /readyz (convoys/web/ops_views.py, docs/metrics.md) ----------
# /metrics answers a request bearing this token (Authorization: Bearer …) or coming from an
# address in CONVOY_METRICS_ALLOW (IPs or CIDRs, comma-separated); by default nobody.
CONVOY_METRICS_TOKEN = os.environ.get("CONVOY_METRICS_TOKEN", "").strip()
CONVOY_METRICS_ALLOW = env_list("CONVOY_METRICS_ALLOW", [])
try:
    _metrics_networks = [ipaddress.ip_network(a, strict=False) for a in CONVOY_METRICS_ALLOW]
except ValueError as exc:
    raise ImproperlyConfigured(f"CONVOY_METRICS_ALLOW: {exc}") from None
# /readyz answers 503 when the live relay is this many seconds behind the event log.
CONVOY_READY_RELAY_LAG = env_float("CONVOY_READY_RELAY_LAG", 30.0, minimum=0.1)
# Landed means merged: a convoy merging by `mr` counts a closed bead done only once its change
# is merged (a convoy's own `--merge` wins; `direct` and `local` count the close).
CONVOY_MERGE_STRATEGY = env_choice(
    "CONVOY_MERGE_STRATEGY", "DIRECT", ("DIRECT", "MR", "LOCAL")
).lower()
# Case-insensitive regular expressions (comma-separated) searched in a merge request's close
# reason; the abandoned ones are tried first (convoys/core/merges.py).
CONVOY_MERGED_REASONS = env_list(
    "CONVOY_MERGED_REASONS",
    [
        r"^merged\b",
        r"^direct merge to ",
        r"^manually merged",
        r"^branch(es)? (already )?merged",
        r"already merged",
        r"^(work |all commits |commits )?already (on|in) main",
    ],
)
CONVOY_ABANDONED_REASONS = env_list(
    "CONVOY_ABANDONED_REASONS",
    [
        r"^stale",
        r"^rejected",
        r"no longer exists?",
        r"does not exist",
        r"not found",
        r"unverifiable",
        r"superseded",
        r"^conflicts with",
        r"no new commits",
        r"abandoned",
        r"closed without merg",
    ],
)
# Forge webhooks (/hooks/github, /hooks/gitlab, /hooks/gitea): each forge is refused until its
# secret is set.
CONVOY_GITHUB_SECRET = os.environ.get("CONVOY_GITHUB_SECRET", "")
CONVOY_GITLAB_TOKEN = os.environ.get("CONVOY_GITLAB_TOKEN", "")
CONVOY_GITEA_SECRET = os.environ.get("CONVOY_GITEA_SECRET", "")
# Outbound webhooks and chat (convoys/services/hooks.py): a failed delivery is tried again after
# CONVOY_WEBHOOK_RETRY_BASE seconds, then twice as long each time, for 24 hours; each attempt may
# take CONVOY_WEBHOOK_TIMEOUT seconds. Targets on loopback, link-local or private addresses are
# refused unless CONVOY_WEBHOOK_ALLOW_PRIVATE. CONVOY_PUBLIC_URL is the site's address, for the
# links in what is sent.
CONVOY_WEBHOOK_RETRY_BASE = env_float("CONVOY_WEBHOOK_RETRY_BASE", 30.0, minimum=0.001)
CONVOY_WEBHOOK_TIMEOUT = env_float("CONVOY_WEBHOOK_TIMEOUT", 10.0, minimum=0.1)
CONVOY_WEBHOOK_ALLOW_PRIVATE = env_bool("CONVOY_WEBHOOK_ALLOW_PRIVATE", False)
CONVOY_PUBLIC_URL = os.environ.get("CONVOY_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
# A load balancer probes over plain HTTP, straight to the process.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]


def _one_line_for_client_errors(record: logging.LogRecord) -> bool:
    """A 4xx (a 403 for a user without permission, a 404) is one log line: the traceback of
    the PermissionDenied or Http404 behind it says nothing and would hide real errors; and a
    long path in it is cut to 300 characters."""
    if getattr(record, "status_code", 500) < 500:
        record.exc_info = record.exc_text = None
    if isinstance(record.args, tuple):  # "Not Found: <a 16 KB path>": the path cut short
        record.args = tuple(
            a[:300] + "…" if isinstance(a, str) and len(a) > 300 else a for a in record.args
        )
    return True


def _sync_ticks_at_debug(record: logging.LogRecord) -> bool:
    """django-q's line for each sync task the ticker runs (one every CONVOY_SYNC_INTERVAL) is
    at DEBUG: a pass that changed something logs its own line (convoys.sync, INFO)."""
    if record.levelno == logging.INFO and "services.bdsync.sync_configured" in record.getMessage():
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
    return True


LOG_FORMAT = os.environ.get(
    "LOG_FORMAT", "text"
)  # "json": one JSON object a line (convoyweb/logs.py)
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be text or json, not {LOG_FORMAT!r}")
# The access line of every request; without it, workers' heartbeats and live pages' fetches
# that succeed are not logged (convoyweb/logs.py).
LOG_ACCESS = env_bool("LOG_ACCESS", False)
# django-q2 gives its logger a handler and this level of its own when nothing else handles it
# (the text format): "[Q] INFO Enqueued" would follow every close made from the command line.
Q_CLUSTER["log_level"] = "INFO" if LOG_ACCESS else "WARNING"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "convoyweb.logs.Json"},
    },
    "filters": {
        "client_errors": {
            "()": "django.utils.log.CallbackFilter",
            "callback": _one_line_for_client_errors,
        },
        "sync_ticks": {"()": "django.utils.log.CallbackFilter", "callback": _sync_ticks_at_debug},
        "ids": {"()": "convoys.core.logids.WithIds"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
            "filters": ["ids"],
        }
    },
    "loggers": {
        # Not propagated: daphne gives the root logger a handler of its own, and every line
        # would be printed twice.
        "convoys": {
            "handlers": ["console"],
            "level": os.environ.get("LOG_LEVEL", "INFO"),
            "propagate": False,
        },
        "convoyweb": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "django.request": {"filters": ["client_errors"]},
        # The cluster's line for each task it takes and finishes is chatter (LOG_ACCESS=1).
        "django-q": {"filters": ["sync_ticks"], "level": "INFO" if LOG_ACCESS else "WARNING"},
    },
}
if LOG_FORMAT == "json":
    # Every logger's lines through the one JSON handler: the root takes what Django, daphne,
    # django-q, axes and the access log write; nothing keeps a text handler of its own.
    LOGGING["root"] = {"handlers": ["console"], "level": "INFO"}
    LOGGING["loggers"] = {
        "convoys": {"handlers": [], "level": os.environ.get("LOG_LEVEL", "INFO")},
        "convoyweb": {"handlers": [], "level": "INFO"},
        "django": {"handlers": [], "level": "INFO"},
        "django.request": {"filters": ["client_errors"]},
        "django-q": {
            "handlers": ["console"],
            "filters": ["sync_ticks"],
            "propagate": False,
            "level": "INFO" if LOG_ACCESS else "WARNING",
        },
    }
