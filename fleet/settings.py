"""Django settings, read from the environment (see .env.example for every variable)."""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from workers.broker import redis_ssl_options

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("FLEET_VAR_DIR") or BASE_DIR / "var")
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env(name: str, default: str) -> str:
    """The variable's value; unset and empty both mean the default (so a copied
    .env.example with empty lines works as it is)."""
    return os.environ.get(name) or default


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if not value:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


# Development mode is asked for (DEBUG=1; `make up` does): production is the default. Even
# then only staff see Django's technical error pages (fleet/debug.py).
DEBUG = env_bool("DEBUG", False)


def _secret_key() -> str:
    key = os.environ.get("SECRET_KEY")
    if key:
        return key
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY must be set in production (or set DEBUG=1 for development mode)."
        )
    # Development: one generated key kept under var/ so sessions survive restarts.
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = [h for h in env("ALLOWED_HOSTS", "*" if DEBUG else "").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in env("CSRF_TRUSTED_ORIGINS", "").split(",") if o]
FLEET_PORT = int(env("FLEET_PORT", "8000"))

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "axes",
    "fleet",
    "scheduler",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Next (its responses still get the security headers): every error under /api/ leaves
    # as JSON; no debug page reaches non-staff.
    "fleet.middleware.ErrorShapeMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: turns a lockout flagged by the authentication backend into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "fleet.urls"
WSGI_APPLICATION = "fleet.wsgi.application"

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

DATABASES = {
    "default": dj_database_url.parse(
        env("DATABASE_URL", f"sqlite:///{VAR_DIR / 'fleet.sqlite3'}"),
        conn_max_age=int(env("DATABASE_CONN_MAX_AGE", "60")),
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Several processes (web, control worker, beat) share the file: wait for locks.
    options = DATABASES["default"].setdefault("OPTIONS", {})
    options["timeout"] = 20
    # Take the write lock when a transaction begins: a transaction that reads and then
    # writes cannot then fail midway with "database is locked".
    options["transaction_mode"] = "IMMEDIATE"
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis is the cache and the broker. Its password goes in the URL; `rediss://` means TLS,
# with the server's certificate checked (FLEET_REDIS_CA_FILE, FLEET_REDIS_CERT_REQS:
# workers/broker.py, which the agent reads too).
REDIS_URL = env("REDIS_URL", "redis://127.0.0.1:6379/0")
REDIS_SSL_OPTIONS = redis_ssl_options(REDIS_URL)
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "fleet",
        "TIMEOUT": 300,
        "OPTIONS": REDIS_SSL_OPTIONS,
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Brute-force protection of the two login forms (/login/ and /admin/login/): after
# FLEET_LOGIN_FAILURE_LIMIT wrong passwords for one user name from one address, that pair is
# locked out for FLEET_LOGIN_COOLOFF_MINUTES (each further try restarts the wait). Attempts
# are kept in the database, so every web process sees them; `manage.py axes_reset` unlocks.
AUTHENTICATION_BACKENDS = [
    "fleet.auth_backends.LockoutBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(env("FLEET_LOGIN_FAILURE_LIMIT", "10"))
AXES_COOLOFF_TIME = timedelta(minutes=float(env("FLEET_LOGIN_COOLOFF_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_LOCKOUT_CALLABLE = "fleet.auth_backends.lockout_response"
AXES_RESET_ON_SUCCESS = True
# Behind a reverse proxy, the client address is the one it appends to X-Forwarded-For.
AXES_IPWARE_PROXY_COUNT = int(env("FLEET_PROXY_COUNT", "0")) or None
AXES_IPWARE_META_PRECEDENCE_ORDER = (
    ["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"] if AXES_IPWARE_PROXY_COUNT else ["REMOTE_ADDR"]
)

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env("TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Serve from the app folders directly as well, so `collectstatic` is optional in development.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Sessions read from the cache (written through to the database): live views poll often.
SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

# HTTPS in production: cookies only over TLS, plain http redirected (except /healthz and
# /readyz, for probes inside the cluster), HSTS. Behind a proxy that terminates TLS, set
# FLEET_PROXY_SSL_HEADER=1 so X-Forwarded-Proto: https counts as a secure request.
SESSION_COOKIE_SECURE = env_bool("FLEET_SECURE_COOKIES", not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = env_bool("FLEET_SSL_REDIRECT", not DEBUG)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
SECURE_HSTS_SECONDS = int(env("FLEET_HSTS_SECONDS", "0" if DEBUG else str(365 * 86400)))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("FLEET_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("FLEET_HSTS_PRELOAD", True)
if env_bool("FLEET_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# A 500 in development mode: the technical page for staff, the plain one for everyone else.
DEFAULT_EXCEPTION_REPORTER = "fleet.debug.StaffOnlyExceptionReporter"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "fleet.api.auth.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["fleet.api.permissions.IsTeamMemberOrStaff"],
    "DEFAULT_PAGINATION_CLASS": "fleet.api.pagination.Pagination",
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "fleet.api.pagination.StrictOrderingFilter",
    ],
    # JSON in and out: errors included, whatever the client accepts (the browsable docs are
    # at /api/v1/docs/); another body type is a 415.
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "DEFAULT_SCHEMA_CLASS": "fleet.api.schema.AutoSchema",
    # Token creation is throttled per user (a stolen session cannot mint keys in a loop);
    # the rates live in the cache, so every web process counts together.
    "DEFAULT_THROTTLE_RATES": {"tokens": env("FLEET_TOKEN_RATE", "10/hour")},
    "EXCEPTION_HANDLER": "fleet.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "fleet API",
    "DESCRIPTION": "Submit and manage GPU jobs, inspect nodes, teams and the queue.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["fleet.api.permissions.IsTeamMemberOrStaff"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "fleet.models.jobs.JobState",
        "NodeStateEnum": "fleet.models.nodes.NodeState",
    },
}

# Celery: JSON only, explicit limits, the control queue for the control side and one
# queue per GPU host ("node.<name>").
CELERY_BROKER_URL = env("CELERY_BROKER_URL", REDIS_URL)
# Without these kombu would accept any certificate on a rediss:// broker.
CELERY_BROKER_USE_SSL = redis_ssl_options(CELERY_BROKER_URL) or None
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_TASK_TIME_LIMIT = int(env("FLEET_TASK_TIME_LIMIT", "120"))
CELERY_TASK_SOFT_TIME_LIMIT = int(env("FLEET_TASK_SOFT_TIME_LIMIT", "100"))
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A message taken by a worker that died before acknowledging it goes back to the queue after
# this many seconds. Only agent messages are acknowledged late, and they run for at most
# 60 s, so two minutes redeliver promptly without ever running a live one twice.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": int(env("FLEET_REDELIVER_AFTER", "120"))}
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = TIME_ZONE

# Seconds a stopped job gets between SIGTERM and SIGKILL (to checkpoint); its GPUs stay
# reserved for it meanwhile.
FLEET_JOB_GRACE = float(env("FLEET_JOB_GRACE", "30"))

# Webhooks may reach loopback, private and link-local addresses only when this is set: a
# team account must not be able to make the control side POST into its own network.
FLEET_WEBHOOK_ALLOW_PRIVATE = env_bool("FLEET_WEBHOOK_ALLOW_PRIVATE", False)
# Where notification emails come from and how they leave (Django's mail backends).
EMAIL_BACKEND = env("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env("EMAIL_HOST", "localhost")
EMAIL_PORT = int(env("EMAIL_PORT", "25"))
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", "fleet@localhost")

# Seconds the control side keeps a finished job's stored output (30 days).
FLEET_LOG_RETENTION = float(env("FLEET_LOG_RETENTION", str(30 * 86400)))

# Submission limits (see fleet/services/jobs.py).
FLEET_MAX_COMMAND_BYTES = int(env("FLEET_MAX_COMMAND_BYTES", "16384"))
FLEET_MAX_ENV_BYTES = int(env("FLEET_MAX_ENV_BYTES", "32768"))
FLEET_MAX_ENV_VARS = int(env("FLEET_MAX_ENV_VARS", "128"))
# Tasks of one job array, and job specs of one bulk submit (docs/arrays.md).
FLEET_MAX_ARRAY_SIZE = int(env("FLEET_MAX_ARRAY_SIZE", "10000"))
FLEET_MAX_BULK_JOBS = int(env("FLEET_MAX_BULK_JOBS", "10000"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", "INFO")},
}

# The control side's private key: it signs every message to agents (workers/wire.py), and
# agents hold its public key (`manage.py add_node` prints it). Every process that sends to
# agents (web, control worker, beat) must have the same key: set FLEET_CONTROL_KEY or
# FLEET_CONTROL_KEY_FILE; unset, one is generated under the var folder.
FLEET_CONTROL_KEY = env("FLEET_CONTROL_KEY", "")
FLEET_CONTROL_KEY_FILE = env("FLEET_CONTROL_KEY_FILE", str(VAR_DIR / "control.key"))
