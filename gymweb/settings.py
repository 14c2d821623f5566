"""Django settings for gymweb.

Embedded default: SQLite (WAL, busy timeout, immediate transactions) and django-q2's ORM broker.
Scale-out: set ``DATABASE_URL`` (e.g. ``postgres://postgres@127.0.0.1:5432/gymweb``) and
``GYMWEB_REDIS_URL`` (e.g. ``redis://127.0.0.1:6379/0``) in the environment.
"""
import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("GYMWEB_VAR_DIR", BASE_DIR / "var"))


def _env_flag(name: str, default: bool = False) -> bool:
    """An on/off switch from the environment: ``1``/``true``/``yes``/``on`` (any case) is on."""
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


def _env_list(name: str, default: str = "") -> list[str]:
    """A comma-separated list from the environment, blanks dropped."""
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# The built-in key only suits local development: with DEBUG off, gymweb.wsgi and gymweb.asgi (so
# gunicorn, runserver and any other server) refuse to start on it (gymweb.checks), while commands
# that serve no pages (collect, profile, qcluster, tests) still run. ``make demo`` keeps a key of
# its own in var/.
GYMWEB_DEVELOPMENT_SECRET_KEY = "dev-insecure-change-me-gymweb"
SECRET_KEY = os.environ.get("GYMWEB_SECRET_KEY") or GYMWEB_DEVELOPMENT_SECRET_KEY
# Off by default: with DEBUG on, Django records every SQL query of long-lived worker threads
# (memory grows without bound) and spends more CPU per query than the query itself.
DEBUG = os.environ.get("GYMWEB_DEBUG", "0") == "1"
ALLOWED_HOSTS = _env_list("GYMWEB_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # WhiteNoise serves static files in every server (runserver included), so runserver's own
    # static view must step aside.
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    # Before django_q: its `qcluster` command is gymweb's (rollouts/management/commands/qcluster.py,
    # a stop that cannot hang); the first app that has a command wins.
    "rollouts",
    "django_q",
    "axes",
    "csp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "csp.middleware.CSPMiddleware",
    # Before anything reads the body (CSRF reads the POST): refuses an oversized request unread.
    "rollouts.web.uploads.RequestSizeLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "rollouts.web.sessions.SignInRedirectMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # django-axes wants to be last: it turns a locked-out sign-in into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "gymweb.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "gymweb.wsgi.application"
ASGI_APPLICATION = "gymweb.asgi.application"

# Several worker processes and the web server write at once: WAL lets readers go on while one
# writes, the busy timeout waits instead of raising "database is locked", and IMMEDIATE
# transactions take the write lock up front so two writers never deadlock upgrading a read lock
# (DESIGN.md, known pitfalls). synchronous=NORMAL: in WAL mode a commit is not synced to disk
# (checkpoints are), so the dispatcher's frequent small commits cost no fsync each.
SQLITE_OPTIONS = {
    "timeout": 30,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=30000;",
}

_database_url = os.environ.get("DATABASE_URL")
if _database_url:
    DATABASES = {"default": dj_database_url.parse(_database_url, conn_max_age=60)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        # A sqlite:// URL gets the embedded default's options too (without them every commit
        # was a rollback-journal fsync: issue 14's profile showed 11% of `collect` in commit).
        DATABASES["default"]["OPTIONS"] = {**SQLITE_OPTIONS, **DATABASES["default"].get("OPTIONS", {})}
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("GYMWEB_SQLITE_PATH", str(VAR_DIR / "gymweb.sqlite3")),
            "OPTIONS": dict(SQLITE_OPTIONS),
            # A file, not :memory:, so worker subprocesses in tests can share it; one per test
            # process so two test sessions on one machine never clobber each other.
            "TEST": {"NAME": os.environ.get("GYMWEB_TEST_SQLITE_PATH", str(VAR_DIR / f"test_gymweb_{os.getpid()}.sqlite3"))},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "runs"
LOGOUT_REDIRECT_URL = "login"
# A form posted with a stale CSRF token gets a page that says what happened and links back.
CSRF_FAILURE_VIEW = "rollouts.web.sessions.csrf_failure"

# Sign-in throttling (django-axes): after GYMWEB_SIGNIN_FAILURE_LIMIT wrong passwords for one user
# name from one address, that pair is refused (429, the lockout page) for
# GYMWEB_SIGNIN_LOCKOUT_MINUTES; the admin sign-in is covered too. ``manage.py axes_reset`` unlocks.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("GYMWEB_SIGNIN_FAILURE_LIMIT", 10))
AXES_COOLOFF_TIME = timedelta(minutes=float(os.environ.get("GYMWEB_SIGNIN_LOCKOUT_MINUTES", 15)))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "rollouts.web.sessions.locked_out"

# -- production switches (README, "Production") ------------------------------------------------
# Behind a TLS-terminating proxy: the header it sets to "https" (e.g. X-Forwarded-Proto), so
# Django knows the request was secure (CSRF's origin check and SSL redirect depend on it). Only
# set it when the proxy always sets or strips that header.
_proxy_ssl_header = os.environ.get("GYMWEB_SECURE_PROXY_SSL_HEADER", "").strip()
if _proxy_ssl_header:
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https")
# Origins (scheme://host[:port]) whose form posts are trusted, e.g. https://gymweb.example.com.
CSRF_TRUSTED_ORIGINS = _env_list("GYMWEB_CSRF_TRUSTED_ORIGINS")
SECURE_SSL_REDIRECT = _env_flag("GYMWEB_SSL_REDIRECT")
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _env_flag("GYMWEB_SECURE_COOKIES")
SECURE_HSTS_SECONDS = int(os.environ.get("GYMWEB_HSTS_SECONDS", 0))
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_flag("GYMWEB_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = _env_flag("GYMWEB_HSTS_PRELOAD")

# Content-Security-Policy (django-csp): only this origin's scripts and styles, no inline code, no
# framing. htmx's own indicator <style> is off (base.html's htmx-config; app.css has the rules).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF],
        "connect-src": [SELF],
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# ``manage.py collectstatic`` writes here; WhiteNoise serves it, compressed, under hashed names
# (cached forever by browsers). With DEBUG off, pages need it: run collectstatic after each update.
STATIC_ROOT = Path(os.environ.get("GYMWEB_STATIC_ROOT", VAR_DIR / "staticfiles"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# Uploads (bytes). Every upload (/runs/new/, /import/) goes through one handler that stops storing
# a file once it passes GYMWEB_MAX_UPLOAD_BYTES; a request whose declared size passes
# GYMWEB_MAX_REQUEST_BYTES is refused (413) before its body is read. Dataset and rollouts files are
# read line by line; one line may hold at most GYMWEB_MAX_LINE_BYTES.
GYMWEB_MAX_UPLOAD_BYTES = int(os.environ.get("GYMWEB_MAX_UPLOAD_BYTES", 200 * 1024 * 1024))
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
# The import form takes two files (rollouts and failures), plus the other fields.
GYMWEB_MAX_REQUEST_BYTES = int(
    os.environ.get("GYMWEB_MAX_REQUEST_BYTES", 2 * GYMWEB_MAX_UPLOAD_BYTES + DATA_UPLOAD_MAX_MEMORY_SIZE)
)
GYMWEB_MAX_LINE_BYTES = int(os.environ.get("GYMWEB_MAX_LINE_BYTES", 64 * 1024 * 1024))
FILE_UPLOAD_HANDLERS = [
    "rollouts.web.uploads.SizeLimitUploadHandler",
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]

# Pre-filled on the new-run form (and the agent check): the services this instance usually runs
# against. ``make demo`` sets them to its example agent and env.
GYMWEB_DEFAULT_AGENT_URL = os.environ.get("GYMWEB_DEFAULT_AGENT_URL", "")
GYMWEB_DEFAULT_ENV_URL = os.environ.get("GYMWEB_DEFAULT_ENV_URL", "")

# Which hosts a run may reach (rollouts.engine.targets; README, "Which hosts a run may reach"),
# enforced at connection time on every request gymweb sends to an agent or an env.
# GYMWEB_ALLOWED_TARGET_HOSTS: comma-separated `host`, `host:port`, IP, CIDR (`10.0.0.0/8`) or any of
# those with a port (`10.0.0.0/8:8000`, `[fd00::/8]:8000`); when not empty only listed targets are
# allowed. Empty: public addresses, plus loopback/private ones with GYMWEB_ALLOW_LOCAL_TARGETS=1
# (a local single-user set-up; `make demo` sets it). Link-local and cloud-metadata addresses are
# refused unless listed explicitly.
GYMWEB_ALLOWED_TARGET_HOSTS = [h.strip() for h in os.environ.get("GYMWEB_ALLOWED_TARGET_HOSTS", "").split(",") if h.strip()]
GYMWEB_ALLOW_LOCAL_TARGETS = os.environ.get("GYMWEB_ALLOW_LOCAL_TARGETS", "").strip().lower() in ("1", "true", "yes", "on")
# Every reply read from an agent or an env is capped (bytes; streamed with a running count, never
# buffered past the cap). Over it the rollout fails with failure kind `reply_too_large`.
GYMWEB_MAX_REPLY_BYTES = int(os.environ.get("GYMWEB_MAX_REPLY_BYTES", 64 * 1024 * 1024))

# Worker tuning (seconds). A claim's lease must be renewed within GYMWEB_LEASE_S or the attempt
# counts as interrupted and its key runs again (crash recovery); dispatchers renew every
# GYMWEB_HEARTBEAT_S and notice a cancel then. Tests shorten these.
GYMWEB_LEASE_S = float(os.environ.get("GYMWEB_LEASE_S", 30))
GYMWEB_HEARTBEAT_S = float(os.environ.get("GYMWEB_HEARTBEAT_S", 2))
GYMWEB_POLL_S = float(os.environ.get("GYMWEB_POLL_S", 0.5))
GYMWEB_FLUSH_S = float(os.environ.get("GYMWEB_FLUSH_S", 0.25))
# First threshold of Python's garbage collector while a dispatcher runs (rollouts.collection.dispatch.
# collector_tuned; 0 = Python's default of 700): with thousands of rollouts in flight the default
# made the collector walk the whole heap again and again (issue 14).
GYMWEB_GC_THRESHOLD = int(os.environ.get("GYMWEB_GC_THRESHOLD", 200000))
GYMWEB_CONNECT_RETRY_PAUSE_S = float(os.environ.get("GYMWEB_CONNECT_RETRY_PAUSE_S", 0.5))
# Each django-q2 worker process runs one dispatcher thread that serves every running run
# (rollouts.collection.dispatch). It keeps at most this many rollouts in flight (a memory bound).
GYMWEB_PROCESS_CAPACITY = int(os.environ.get("GYMWEB_PROCESS_CAPACITY", 2000))
GYMWEB_DISPATCH_IN_WORKERS = os.environ.get("GYMWEB_DISPATCH_IN_WORKERS", "1") == "1"
# On SIGTERM a worker releases its in-flight rollouts; this bounds how long that may take.
GYMWEB_RELEASE_TIMEOUT_S = float(os.environ.get("GYMWEB_RELEASE_TIMEOUT_S", 20))
# The run page caches aggregates over finished attempts (keyed by their counts, so never stale).
GYMWEB_SUMMARY_CACHE_S = float(os.environ.get("GYMWEB_SUMMARY_CACHE_S", 600))
# While a run is running its finished counts change on every poll, so count-keyed caches never
# hit: a running run's page reuses its aggregates over finished attempts (reward statistics,
# histogram, failure kinds, tokens) and its rollout table's automatic refresh for at most
# GYMWEB_LIVE_CACHE_S, and its profile page and charts for at most GYMWEB_LIVE_ANALYSIS_CACHE_S.
# Progress counts, workers and status are always read fresh; a final run's caches are exact. 0 =
# no such reuse. (benchmarks/README.md, "A busy team")
GYMWEB_LIVE_CACHE_S = float(os.environ.get("GYMWEB_LIVE_CACHE_S", 2))
GYMWEB_LIVE_ANALYSIS_CACHE_S = float(os.environ.get("GYMWEB_LIVE_ANALYSIS_CACHE_S", 15))
# /aggregate_metrics is called once a run completes, with at most this many rows (stripped as NeMo
# Gym strips them: a few hundred bytes each) and this timeout; past the limit the file is computed
# locally instead.
GYMWEB_AGGREGATE_MAX_ROWS = int(os.environ.get("GYMWEB_AGGREGATE_MAX_ROWS", 200000))
GYMWEB_AGGREGATE_TIMEOUT_S = float(os.environ.get("GYMWEB_AGGREGATE_TIMEOUT_S", 60))
# Reverify from the run page runs in the request; larger runs use `manage.py reverify`.
GYMWEB_REVERIFY_WEB_MAX_ROWS = int(os.environ.get("GYMWEB_REVERIFY_WEB_MAX_ROWS", 2000))
# Archived runs (rollouts.collection.archive): their NeMo Gym files, zstd-compressed, go in
# GYMWEB_ARCHIVE_DIR/run-<id>/. Delete, archive and restore change at most GYMWEB_DELETE_BATCH
# rollouts (with everything under them) per transaction, so no write lock lasts long
# (benchmarks/README.md, bench-archive).
GYMWEB_ARCHIVE_DIR = Path(os.environ.get("GYMWEB_ARCHIVE_DIR", VAR_DIR / "archive"))
GYMWEB_DELETE_BATCH = int(os.environ.get("GYMWEB_DELETE_BATCH", 200))
# ... and at most this many trajectory items (a rollout with more makes a transaction of its own).
GYMWEB_DELETE_BATCH_ITEMS = int(os.environ.get("GYMWEB_DELETE_BATCH_ITEMS", 500))
# Pause between two such transactions (seconds), so writers waiting for the lock get it.
GYMWEB_DELETE_PAUSE_S = float(os.environ.get("GYMWEB_DELETE_PAUSE_S", 0.05))
# Most (task, rollout) keys in one run: a run is created in one transaction (all or nothing),
# which holds SQLite's write lock while it lasts (200,000 keys: a few seconds).
GYMWEB_MAX_KEYS_PER_RUN = int(os.environ.get("GYMWEB_MAX_KEYS_PER_RUN", 200_000))
# The largest run_timeout_s a run may have (form and CLI check it).
GYMWEB_MAX_RUN_TIMEOUT_S = float(os.environ.get("GYMWEB_MAX_RUN_TIMEOUT_S", 24 * 3600))
# The trajectory page shows at most this many characters of one item's text (message, arguments,
# tool output, reasoning, JSON; a note links to the raw JSON) and this many items of one step.
GYMWEB_DISPLAY_MAX_CHARS = int(os.environ.get("GYMWEB_DISPLAY_MAX_CHARS", 20_000))
GYMWEB_DISPLAY_MAX_ITEMS_PER_STEP = int(os.environ.get("GYMWEB_DISPLAY_MAX_ITEMS_PER_STEP", 500))

# Django's cache (the run page's and profile's aggregates, the live table): per process by default,
# so each gunicorn worker computes its own. With several web workers or machines, point
# GYMWEB_CACHE_URL at a Redis database of its own (e.g. redis://127.0.0.1:6379/1; not the
# GYMWEB_REDIS_URL one: clearing the cache empties the whole database) so they share one copy.
_cache_url = os.environ.get("GYMWEB_CACHE_URL", "").strip()
if _cache_url:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _cache_url, "KEY_PREFIX": "gymweb"}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "OPTIONS": {"MAX_ENTRIES": 1000}}}

_redis_url = os.environ.get("GYMWEB_REDIS_URL")
# How often (minutes) the supervisor revives runs whose workers died (rollouts.collection.dispatch.supervise).
GYMWEB_SUPERVISE_MINUTES = int(os.environ.get("GYMWEB_SUPERVISE_MINUTES", 1))
# django-q2 tasks are short bookkeeping jobs (rollouts run in the dispatcher threads, not in
# tasks), so ordinary bounds fit.
_q_timeout = 600
Q_CLUSTER = {
    "name": os.environ.get("GYMWEB_Q_NAME", "gymweb"),
    "workers": int(os.environ.get("GYMWEB_Q_WORKERS", 2)),
    "timeout": _q_timeout,
    "retry": _q_timeout + 60,
    "max_attempts": 1,
    "ack_failures": True,
    "catch_up": False,
    "label": "Django Q2",
    "poll": 0.2,
    "save_limit": 500,
    # A recycled worker process would take its dispatcher (and in-flight rollouts) with it.
    "recycle": 10**9,
    "log_level": os.environ.get("GYMWEB_Q_LOG_LEVEL", "WARNING"),
}
if _redis_url:
    Q_CLUSTER["redis"] = _redis_url
else:
    Q_CLUSTER["orm"] = "default"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "gymweb": {"handlers": ["console"], "level": os.environ.get("GYMWEB_LOG_LEVEL", "INFO")},
        "django_q": {"handlers": ["console"], "level": "WARNING"},
        # Django's default sends request errors to the console only with DEBUG on; in production a
        # 500 must leave its traceback in the server's log (django.request logs it with exc_info).
        # 4xx warnings (not found, CSRF refusals) land there too. runserver's own access log
        # (django.server) keeps Django's default handler.
        "django": {"handlers": ["console"], "level": "WARNING"},
    },
}
