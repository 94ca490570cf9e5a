"""Rebound settings, read from the environment.

Defaults run on a laptop with nothing installed: SQLite under var/, an embedded
filesystem broker for Celery, DEBUG on. Production (REBOUND_DEBUG=0) refuses to
start without REBOUND_SECRET_KEY and turns on the settings `check --deploy` asks for.
"""

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from console.queues import queue_declarations

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("REBOUND_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_seconds(name: str, default: float, low: float, high: float) -> float:
    """A number of seconds from the environment, from `low` to `high`."""
    raw = os.environ.get(name) or str(default)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:  # NaN fails both
        raise ImproperlyConfigured(
            f"{name} must be a number of seconds from {low:g} to {high:g}, not {raw!r}."
        )
    return value


DEBUG = env_bool("REBOUND_DEBUG", True)

SECRET_KEY = os.environ.get("REBOUND_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "REBOUND_SECRET_KEY must be set when REBOUND_DEBUG is off (production mode)."
        )
    SECRET_KEY = "rebound-insecure-development-key-do-not-use-in-production"

ALLOWED_HOSTS = [
    h.strip()
    for h in os.environ.get(
        "REBOUND_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver" if DEBUG else ""
    ).split(",")
    if h.strip()
]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("REBOUND_CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "common",
    "jobs",
    "incidents",
    "recovery",
    "notify",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Counts ingest refusals as they leave (console.metrics.refusals): outside ErrorAnswers.
    "console.metrics.refusals.IngestRefusals",
    # Before session, CSRF and auth: what they refuse under /api/ gets the API's shape.
    "console.exceptions.ErrorAnswers",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"

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
                "console.context.badges",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'rebound.sqlite3'}",
        conn_max_age=int(os.environ.get("REBOUND_DB_CONN_MAX_AGE", "60")),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Writers take the lock up front, so two ingests never deadlock on upgrade.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 20}
    )
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # A file, not memory, so a test can share it with a real worker process.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}

# A pooler between the console and PostgreSQL (README "Deploying"). In PgBouncer's
# transaction mode one connection's transactions may each run on another server
# connection, so nothing may live in a session: no server-side cursors (they outlive the
# transaction that opened them) and no prepared statements (psycopg's, off in Django's
# default already; pinned here so that OPTIONS cannot turn them on). The code takes no
# advisory locks, SETs nothing for a session, LISTENs to nothing and creates no
# temporary tables; the time zone (Django sets it when the server's differs) is a
# parameter PgBouncer keeps per client.
REBOUND_DB_POOLER = os.environ.get("REBOUND_DB_POOLER", "").strip().lower()
if REBOUND_DB_POOLER not in ("", "session", "transaction"):
    raise ImproperlyConfigured(
        f"REBOUND_DB_POOLER must be transaction, session or unset, not {REBOUND_DB_POOLER!r}."
    )
if REBOUND_DB_POOLER == "transaction":
    if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("REBOUND_DB_POOLER=transaction needs a PostgreSQL DATABASE_URL.")
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"prepare_threshold": None, "server_side_binding": False}
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "console.staticfinders.PlotlyFinder",  # vendor/plotly.min.js from the plotly package
]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# WhiteNoise serves gzip (and brotli) copies to browsers that take them: in
# production those `collectstatic` wrote, with hashed names cached for a year; in
# debug mode, from the finders (console.staticfinders compresses plotly.js). Files
# without a hash in their name are cached this long (debug mode's 0 would have
# every page re-ask for each file).
WHITENOISE_MAX_AGE = 60

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
# Sign-in throttling (console.signin): failures within the window lock the username,
# or the client address, for the lockout. An address may be several people (an office
# behind one NAT), so it gets more tries than a username.
AUTHENTICATION_BACKENDS = ["console.signin.ThrottledModelBackend"]
REBOUND_LOGIN_MAX_FAILURES = int(os.environ.get("REBOUND_LOGIN_MAX_FAILURES", "5"))
REBOUND_LOGIN_MAX_FAILURES_PER_ADDRESS = int(
    os.environ.get("REBOUND_LOGIN_MAX_FAILURES_PER_ADDRESS", "20")
)
REBOUND_LOGIN_WINDOW_S = int(os.environ.get("REBOUND_LOGIN_WINDOW_S", "900"))
REBOUND_LOGIN_LOCKOUT_S = int(os.environ.get("REBOUND_LOGIN_LOCKOUT_S", "900"))
# Proxies in front of the console that append to X-Forwarded-For (0: clients connect
# directly); the client address is the entry the outermost of them added.
REBOUND_TRUSTED_PROXIES = int(os.environ.get("REBOUND_TRUSTED_PROXIES", "0"))

# Ingest bodies may be up to 5 MiB; the view answers 413 past that itself.
INGEST_MAX_EVENTS = 5000
INGEST_MAX_BYTES = 5 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = INGEST_MAX_BYTES + 64 * 1024

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["console.permissions.HasRequiredRole"],
    # JSON only: people read the API at /api/v1/docs; the browsable API's pages
    # would answer errors as HTML and render for principals the console does not know.
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "common.api.FormatNegotiation",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "console.schema.ReboundAutoSchema",
    "EXCEPTION_HANDLER": "common.api.api_exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Rebound API",
    "DESCRIPTION": "Ingest training-job events; read goodput, attempts and checkpoints.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI from our own static files: consoles often run air-gapped.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Names for the choice sets that share a field name with another app's.
    "ENUM_NAME_OVERRIDES": {
        "AlertStatusEnum": "incidents.models.Alert.Status",
        # The jobs' own name, kept: the alerts' status shares the field name.
        "StatusEnum": "jobs.models.TrainingJob.Status",
        "ActionKindEnum": "recovery.models.Action.Kind",
        "ActionStateEnum": "recovery.models.Action.State",
        "IncidentStateEnum": "incidents.models.Incident.State",
        "SeverityEnum": "incidents.models.Incident.Severity",
        "CauseEnum": "incidents.models.Incident.Cause",
        "NodeStateEnum": "jobs.models.Node.State",
    },
}

# Celery: Redis when REDIS_URL is set, otherwise an embedded broker on the
# filesystem so a fresh machine still runs real workers with no server.
REDIS_URL = os.environ.get("REDIS_URL", "")
BROKER_DIR = VAR_DIR / "broker"
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # Never wait long on a broker that is away: ingest's sends fail fast and
        # the outbox (common.outbox) keeps the work until the broker is back.
        "socket_connect_timeout": 2,
        "socket_timeout": 10,  # above the BRPOP wait (1 s)
        # No retry inside redis-py (retry_on_timeout would turn it on, for every
        # connection error too): a pub/sub read it retried after a broker restart
        # reconnects and then blocks with no timeout, and the worker's event loop with
        # it. A connection error reaches Celery, which reconnects.
        "health_check_interval": 10,
        # An unacknowledged task (its worker died) is delivered again after this;
        # above the longest task time limit (120 s).
        "visibility_timeout": 300,
        # A send that finds the broker away gives up after one quick retry (kombu's
        # default_channel otherwise keeps reconnecting for broker_connection_timeout).
        "max_retries": 1,
        "interval_start": 0,
        "interval_step": 0.2,
        "interval_max": 0.5,
    }
else:
    for sub in ("out", "processed"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://localhost/"
    CELERY_BROKER_TRANSPORT = "console.broker:Transport"  # message files appear whole
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "out"),
        "data_folder_out": str(BROKER_DIR / "out"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),  # not ./control of the working dir
        "store_processed": False,
    }
CACHES = {
    "default": (
        {
            "BACKEND": "common.cache.FailSoftRedisCache",
            "LOCATION": REDIS_URL,
            # The cache only saves work: a Redis that is away must not hold a request up.
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 2},
        }
        if REDIS_URL
        else {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(VAR_DIR / "cache"),
        }
    )
}
# Queues (console.queues): REBOUND_CELERY_QUEUE names the default queue and prefixes
# the others (`rebound.detect`, ...). A worker started without -Q consumes them all;
# `-Q rebound.recovery` (say) starts one on a subset.
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("REBOUND_CELERY_QUEUE", "rebound")
CELERY_TASK_QUEUES = queue_declarations(CELERY_TASK_DEFAULT_QUEUE)
CELERY_TASK_ROUTES = ("console.queues.route_task",)
# Each task's queue, by role (a name, or an app's "<app>.*"; unnamed: the default queue).
REBOUND_TASK_QUEUES = {
    # Ingest's follow-up and detection: work per job and batch, which a burst of events
    # can pile up. Nothing else waits behind it.
    "jobs.*": "detect",
    "incidents.*": "detect",
    # Acting on the cluster: never behind a detection backlog. An action may run for
    # minutes (its kind's time limit), so the periodic work below is not here either.
    "recovery.*": "recovery",
    # Long and rare (compaction): alone, so that it delays nothing.
    "incidents.storage_upkeep": "upkeep",
    # The periodic control work, on the default queue: short, and what brings lost work
    # back. The drain sends again what the broker lost (recovery's tasks among it); the
    # sweep is the only detection of a job gone silent (it sends no events, so no
    # detection work); the reconciler re-sends stuck actions; approvals expire on time.
    # Behind a detection backlog or a long action, each would come too late.
    "common.outbox_drain": "default",
    "incidents.sweep": "default",
    "recovery.actions_reconcile": "default",
    "recovery.approvals_expire": "default",
    "recovery.approvals_retire": "default",
    "recovery.maintenance_pre_actions": "default",
    # Notifications (notify): short HTTP posts with short timeouts; the pager must not
    # wait behind a detection backlog or a long action.
    "notify.*": "default",
}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env_bool("REBOUND_CELERY_EAGER", False)
# The worker outlives a broker restart: it reconnects for as long as it takes (the
# default gives up after 100 tries), on startup too.
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# Reconnects within 2 s of the broker's return and drains the outbox (console.celery).
CELERY_WORKER_CONSUMER = "console.celery:ReconnectingConsumer"
# A send from a web request or a task tries briefly; what fails waits in the outbox.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
# Periodic work, run by the worker started with --beat (scripts/run does).
CELERY_BEAT_SCHEDULE = {
    "incidents-sweep": {"task": "incidents.sweep", "schedule": 15.0},  # SWEEP_EVERY_S
    # Actions stuck in queued or running past their deadline; approvals not given in time.
    "recovery-reconcile": {"task": "recovery.actions_reconcile", "schedule": 30.0},
    "recovery-expire-approvals": {"task": "recovery.approvals_expire", "schedule": 60.0},
    "recovery-retire-approvals": {"task": "recovery.approvals_retire", "schedule": 60.0},
    # Maintenance windows about to start: their pre-maintenance proposals, once each.
    "recovery-pre-maintenance": {"task": "recovery.maintenance_pre_actions", "schedule": 60.0},
    # Work whose send failed or whose message the broker lost (common.outbox).
    "outbox-drain": {"task": "common.outbox_drain", "schedule": 5.0},
    # Approvals about to expire unapproved; notifications whose message was lost.
    "notify-approvals-expiring": {"task": "notify.approvals_expiring", "schedule": 60.0},
    "notify-resend": {"task": "notify.resend", "schedule": 60.0},
}
# The driver of a cluster with no recovery settings of its own (recovery.drivers).
REBOUND_RECOVERY_DRIVER = os.environ.get("REBOUND_RECOVERY_DRIVER", "local")
# How far apart a job's detection passes and ledger refreshes are, at least, while its
# events keep coming (seconds; the worker reads them, since it asks for that work).
REBOUND_DETECT_DEBOUNCE_S = float(os.environ.get("REBOUND_DETECT_DEBOUNCE_S", "5"))
REBOUND_LEDGER_DEBOUNCE_S = float(os.environ.get("REBOUND_LEDGER_DEBOUNCE_S", "5"))
# A running job the console has received nothing from for longer than this (seconds)
# shows as silent, with that age, in the API and the pages (jobs.selectors.job_activity).
# Its reporters send something every few seconds (heartbeats every 5-10 s, a retry at
# most 30 s after a failed send), so two minutes of silence is no gap between sends.
try:
    REBOUND_JOB_SILENT_S = float(os.environ.get("REBOUND_JOB_SILENT_S") or "120")
except ValueError:
    REBOUND_JOB_SILENT_S = float("nan")
if not 0 < REBOUND_JOB_SILENT_S < 1e9:  # NaN fails both
    raise ImproperlyConfigured(
        "REBOUND_JOB_SILENT_S must be a number of seconds above 0 (and below 1e9),"
        f" not {os.environ.get('REBOUND_JOB_SILENT_S')!r}."
    )

# A node's `last_heartbeat_at` and `last_heard_at` are rewritten only once they are this
# far behind (seconds): at thousands of nodes, updating every node on every batch left
# a dead row version per node and batch. Readers allow for values this stale.
try:
    REBOUND_NODE_LIVENESS_S = float(os.environ.get("REBOUND_NODE_LIVENESS_S") or "5")
except ValueError:
    REBOUND_NODE_LIVENESS_S = float("nan")
if not 0 <= REBOUND_NODE_LIVENESS_S <= 60:  # NaN fails both
    raise ImproperlyConfigured(
        "REBOUND_NODE_LIVENESS_S must be a number of seconds from 0 to 60,"
        f" not {os.environ.get('REBOUND_NODE_LIVENESS_S')!r}."
    )

# Storage upkeep (jobs.services.upkeep, README "Storage"): how long each stream keeps
# its detail, in seconds. Heartbeat buckets and raw rank windows go by the job's clock,
# the raw events of rank windows by the console's.
REBOUND_UPKEEP_EVERY_S = env_seconds("REBOUND_UPKEEP_EVERY_S", 600, 10, 86400)
REBOUND_KEEP_HEARTBEAT_BUCKETS_S = env_seconds("REBOUND_KEEP_HEARTBEAT_BUCKETS_S", 3600, 60, 1e9)
# Buckets this close merge into one span (never more than the job's dead-node timeout
# apart, so every silence that detector would see stays).
REBOUND_HEARTBEAT_SPAN_GAP_S = env_seconds("REBOUND_HEARTBEAT_SPAN_GAP_S", 60, 0, 3600)
# Raw windows are most of a large job's stream (16,384 ranks: about 0.25 GB an hour);
# past this they are kept per launch, node and hour. An hour's partition goes once all
# of it is past: up to one hour more is held (bench/storage_day.py).
REBOUND_KEEP_RANK_WINDOWS_S = env_seconds("REBOUND_KEEP_RANK_WINDOWS_S", 3600, 60, 1e9)
# On PostgreSQL, how far ahead of the clock upkeep makes the raw windows' hourly partitions.
REBOUND_PARTITIONS_AHEAD_S = env_seconds("REBOUND_PARTITIONS_AHEAD_S", 86400, 3600, 30 * 86400)
# A resend later than this is still told by the window's own key (launch, rank, first
# step), only counted as accepted.
REBOUND_KEEP_WINDOW_EVENTS_S = env_seconds("REBOUND_KEEP_WINDOW_EVENTS_S", 900, 0, 1e9)
CELERY_BEAT_SCHEDULE["storage-upkeep"] = {
    "task": "incidents.storage_upkeep",
    "schedule": REBOUND_UPKEEP_EVERY_S,
}

# Prometheus metrics at /metrics (console.metrics, docs/monitoring.md). Who may scrape:
# a bearer token (any API token, or REBOUND_METRICS_TOKEN, a secret for the scraper
# alone), a signed-in user with a role, or a client in REBOUND_METRICS_ALLOW_FROM
# (comma-separated CIDRs, e.g. 10.0.0.0/8,127.0.0.1/32; default none).
REBOUND_METRICS_TOKEN = os.environ.get("REBOUND_METRICS_TOKEN", "").strip()


def _networks(name: str) -> list:
    import ipaddress

    out = []
    for part in os.environ.get(name, "").split(","):
        if part.strip():
            try:
                out.append(ipaddress.ip_network(part.strip(), strict=False))
            except ValueError as exc:
                raise ImproperlyConfigured(
                    f"{name} must be comma-separated CIDRs (10.0.0.0/8,::1/128): {exc}"
                ) from exc
    return out


REBOUND_METRICS_ALLOW_FROM = _networks("REBOUND_METRICS_ALLOW_FROM")
# A job's goodput and badput series are exported while it runs and for this long after
# it was last heard from or finished, so that old jobs do not grow the series forever.
REBOUND_METRICS_JOB_HORIZON_S = env_seconds("REBOUND_METRICS_JOB_HORIZON_S", 86400, 0, 1e9)
# The totals over every job, incident and finished action are read at most this often
# (a snapshot in the cache, shared by every web process), not at each scrape; 0 reads
# them at each scrape.
REBOUND_METRICS_TOTALS_MAX_AGE_S = env_seconds("REBOUND_METRICS_TOTALS_MAX_AGE_S", 60, 0, 3600)
# Notifications (notify, docs/notifications.md). The console's external base URL: every
# message links to an incident's or the approvals page under it.
REBOUND_PUBLIC_URL = os.environ.get("REBOUND_PUBLIC_URL") or "http://127.0.0.1:8000"
if not REBOUND_PUBLIC_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(
        f"REBOUND_PUBLIC_URL must be an http:// or https:// URL, not {REBOUND_PUBLIC_URL!r}."
    )
# Each HTTP post's timeout; a failed delivery is tried again after base, 2 x base, ...
# up to the cap (6 attempts in all); an approval still waiting this long before it
# expires is announced.
REBOUND_NOTIFY_HTTP_TIMEOUT_S = env_seconds("REBOUND_NOTIFY_HTTP_TIMEOUT_S", 5, 0.1, 60)
REBOUND_NOTIFY_RETRY_BASE_S = env_seconds("REBOUND_NOTIFY_RETRY_BASE_S", 10, 0.1, 3600)
REBOUND_NOTIFY_RETRY_MAX_S = env_seconds("REBOUND_NOTIFY_RETRY_MAX_S", 300, 1, 86400)
REBOUND_NOTIFY_APPROVAL_WARN_S = env_seconds("REBOUND_NOTIFY_APPROVAL_WARN_S", 600, 0, 86400)
# E-mail channels send through this SMTP server.
EMAIL_HOST = os.environ.get("REBOUND_EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("REBOUND_EMAIL_PORT") or "25")
EMAIL_HOST_USER = os.environ.get("REBOUND_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("REBOUND_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env_bool("REBOUND_EMAIL_TLS", False)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = os.environ.get("REBOUND_EMAIL_FROM", "rebound@localhost")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("REBOUND_LOG_LEVEL", "INFO")},
}

if not DEBUG:
    SECURE_SSL_REDIRECT = env_bool("REBOUND_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = int(os.environ.get("REBOUND_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
