"""Django settings for gymweb.

Embedded default: SQLite (WAL, busy timeout, immediate transactions) and django-q2's ORM broker.
Scale-out: set ``DATABASE_URL`` (e.g. ``postgres://postgres@127.0.0.1:5432/gymweb``) and
``GYMWEB_REDIS_URL`` (e.g. ``redis://127.0.0.1:6379/0``) in the environment.
"""

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from csp.constants import NONE, SELF
from whitenoise.compress import Compressor

from gymweb import conf as _conf

# Every GYMWEB_* variable is read once, typed, in gymweb.conf; each field ``x`` is
# ``settings.GYMWEB_X`` here. Below, only what Django and its apps name otherwise.
GYMWEB = _conf.load()
globals().update(_conf.django_settings(GYMWEB))

BASE_DIR = Path(__file__).resolve().parent.parent
# Templates and static files ship inside the package (the wheel carries them).
PACKAGE_DIR = Path(__file__).resolve().parent
# State (the SQLite database, collected static files, the demo's key and password): never the checkout.
DATA_DIR = VAR_DIR = Path(GYMWEB.data_dir).expanduser()

# The built-in key only suits local development: with DEBUG off, gymweb.wsgi and gymweb.asgi (so
# gunicorn, runserver and any other server) refuse to start on it (gymweb.checks), while commands
# that serve no pages (collect, profile, qcluster, tests) still run. ``make demo`` keeps a key of
# its own in var/.
GYMWEB_DEVELOPMENT_SECRET_KEY = "dev-insecure-change-me-gymweb"
SECRET_KEY = GYMWEB.secret_key.get_secret_value() or GYMWEB_DEVELOPMENT_SECRET_KEY
# Off by default: with DEBUG on, Django records every SQL query of long-lived worker threads
# (memory grows without bound) and spends more CPU per query than the query itself.
DEBUG = GYMWEB.debug
ALLOWED_HOSTS = GYMWEB.allowed_hosts

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
    # django-ninja as an app: /api/v1/docs renders Swagger UI from its bundled static files, not a CDN
    "ninja",
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
    # The API's 405 in JSON like its other errors (django-ninja's own is a bare text/html line).
    "rollouts.api.errors.JsonMethodNotAllowedMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "rollouts.web.sessions.SignInRedirectMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "rollouts.web.access.NoTeamMiddleware",  # a user in no team making something: a 400 saying so
    # django-axes wants to be last: it turns a locked-out sign-in into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "gymweb.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [PACKAGE_DIR / "templates"],
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
        # is a rollback-journal fsync).
        DATABASES["default"]["OPTIONS"] = {**SQLITE_OPTIONS, **DATABASES["default"].get("OPTIONS", {})}
    elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # PostgreSQL's JIT compiles a plan whose estimated cost passes jit_above_cost; the run table's
        # sorts over 100,000 rollouts spent 1.9-3.6 s of 3.7-4.1 s compiling (benchmarks/README.md).
        DATABASES["default"].setdefault("OPTIONS", {}).setdefault("options", "-c jit=off")
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": GYMWEB.sqlite_path or str(VAR_DIR / "gymweb.sqlite3"),
            "OPTIONS": dict(SQLITE_OPTIONS),
            # As for a DATABASE_URL: a long-lived thread (the dispatcher's database thread, a web
            # server's) keeps its connection instead of opening one (and running init_command) per call.
            "CONN_MAX_AGE": 60,
            # A file, not :memory:, so worker subprocesses in tests can share it; one per test
            # process so two test sessions on one machine never clobber each other.
            "TEST": {"NAME": GYMWEB.test_sqlite_path or str(VAR_DIR / f"test_gymweb_{os.getpid()}.sqlite3")},
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
AXES_FAILURE_LIMIT = GYMWEB.signin_failure_limit
AXES_COOLOFF_TIME = timedelta(minutes=GYMWEB.signin_lockout_minutes)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# The address is the client's as the trusted proxies report it (GYMWEB_TRUSTED_PROXIES), never a
# header a client could set itself.
AXES_CLIENT_IP_CALLABLE = "rollouts.web.sessions.client_address"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "rollouts.web.sessions.locked_out"
# Also refuses one address after GYMWEB_SIGNIN_ADDRESS_FAILURE_LIMIT failures over any user names.
AXES_HANDLER = "rollouts.web.signin_limits.AddressLimitedHandler"

# -- production switches (README, "Production") ------------------------------------------------
# Behind a TLS-terminating proxy: the header it sets to "https" (e.g. X-Forwarded-Proto), so
# Django knows the request was secure (CSRF's origin check and SSL redirect depend on it). Only
# set it when the proxy always sets or strips that header.
_proxy_ssl_header = GYMWEB.secure_proxy_ssl_header.strip()
if _proxy_ssl_header:
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https")
# Origins (scheme://host[:port]) whose form posts are trusted, e.g. https://gymweb.example.com.
CSRF_TRUSTED_ORIGINS = GYMWEB.csrf_trusted_origins
SECURE_SSL_REDIRECT = GYMWEB.ssl_redirect
# A load balancer's probes and Prometheus may speak plain http to the instance itself.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = GYMWEB.secure_cookies
SECURE_HSTS_SECONDS = GYMWEB.hsts_seconds
SECURE_HSTS_INCLUDE_SUBDOMAINS = GYMWEB.hsts_include_subdomains
SECURE_HSTS_PRELOAD = GYMWEB.hsts_preload

# Content-Security-Policy (django-csp): only this origin's scripts and styles, no inline code, no
# framing. htmx's own indicator <style> is off (base.html's htmx-config; app.css has the rules).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        # data: for the images an agent saw (base64 input_image parts; rollouts/web/rendering.py
        # inlines only PNG, JPEG, GIF and WebP); remote image URLs are links, never loaded
        "img-src": [SELF, "data:"],
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
STATICFILES_DIRS = [PACKAGE_DIR / "static"]
# ``manage.py collectstatic`` writes here; WhiteNoise serves it, compressed, under hashed names
# (cached forever by browsers). With DEBUG off, pages need it: run collectstatic after each update.
STATIC_ROOT = Path(GYMWEB.static_root or VAR_DIR / "staticfiles")
# Source maps (django-ninja's Swagger UI and ReDoc bundles, 5 MB) are served uncompressed: compressing
# them took most of collectstatic's CPU.
WHITENOISE_SKIP_COMPRESS_EXTENSIONS = [*Compressor.SKIP_COMPRESS_EXTENSIONS, "map"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# Uploads (bytes). Every upload (/runs/new/, /import/) goes through one handler that stops storing
# a file once it passes GYMWEB_MAX_UPLOAD_BYTES; a request whose declared size passes
# GYMWEB_MAX_REQUEST_BYTES is refused (413) before its body is read. Dataset and rollouts files are
# read line by line; one line may hold at most GYMWEB_MAX_LINE_BYTES.
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
# The import form takes two files (rollouts and failures), plus the other fields.
GYMWEB_MAX_REQUEST_BYTES = GYMWEB.max_request_bytes or 2 * GYMWEB.max_upload_bytes + DATA_UPLOAD_MAX_MEMORY_SIZE
FILE_UPLOAD_HANDLERS = [
    "rollouts.web.uploads.SizeLimitUploadHandler",
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]

# The other GYMWEB_* settings (target policy, reply cap, worker tuning, page caches, display limits)
# are only read as settings.GYMWEB_*: their types, defaults and descriptions are in gymweb/conf.py.

# Django's cache (the run page's and profile's aggregates, the live table): per process by default,
# so each gunicorn worker computes its own. With several web workers or machines, point
# GYMWEB_CACHE_URL at a Redis database of its own (e.g. redis://127.0.0.1:6379/1; not the
# GYMWEB_REDIS_URL one: clearing the cache empties the whole database) so they share one copy.
# While Redis does not answer the cache fails open (gymweb.cache): pages are slower, never broken.
_cache_url = GYMWEB.cache_url.strip()
if _cache_url:
    CACHES: dict[str, dict[str, Any]] = {
        "default": {"BACKEND": "gymweb.cache.FailOpenRedisCache", "LOCATION": _cache_url, "KEY_PREFIX": "gymweb"}
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "OPTIONS": {"MAX_ENTRIES": 1000}}}

_redis_url = GYMWEB.redis_url
# django-q2 tasks are short bookkeeping jobs (rollouts run in the dispatcher threads, not in
# tasks), so ordinary bounds fit.
_q_timeout = 600
Q_CLUSTER = {
    "name": GYMWEB.q_name,
    "workers": GYMWEB.q_workers,
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
    "log_level": GYMWEB.q_log_level,
}
if _redis_url:
    Q_CLUSTER["redis"] = _redis_url
else:
    Q_CLUSTER["orm"] = "default"

# Every line carries time, level and logger (GYMWEB_LOG_FORMAT=json: one JSON object per line;
# gymweb.logs). Django's default sends request errors to the console only with DEBUG on; in
# production a 500 must leave its traceback in the server's log (django.request logs it with
# exc_info), and 4xx warnings (not found, CSRF refusals) land there too.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "gymweb.logs.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": GYMWEB.log_format}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "gymweb": {"handlers": ["console"], "level": GYMWEB.log_level, "propagate": False},
        "rollouts": {"handlers": ["console"], "level": GYMWEB.log_level, "propagate": False},
        "django-q": {"handlers": ["console"], "level": GYMWEB.q_log_level, "propagate": False},
        "django_q": {"handlers": ["console"], "level": GYMWEB.q_log_level, "propagate": False},
        "django": {"handlers": ["console"], "level": "WARNING", "propagate": False},
        # runserver's access lines, in the same format.
        "django.server": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
