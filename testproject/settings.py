"""Settings of the testproject: a runnable Django project around kumiflow-django.

The database comes from ``DATABASE_URL`` (django-environ); the default is a
file SQLite database in WAL mode with IMMEDIATE transactions, so the worker,
the web server and the tests see the same data.
"""

from __future__ import annotations

from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent
env = environ.Env()

# Django's Tasks framework: the immediate backend by default, django-tasks-db's
# worker ("db", a separate process: manage.py db_worker) and RQ ("rq", with
# redis-server and manage.py rqworker) where their packages are installed.
# Django 5.2 uses the django-tasks backport.
_TASKS_MODULE = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
TASKS: dict[str, dict[str, object]] = {
    "default": {"BACKEND": f"{_TASKS_MODULE}.backends.immediate.ImmediateBackend"},
}
_TASK_APPS: list[str] = [] if django.VERSION >= (6, 0) else ["django_tasks"]
try:
    import django_tasks_db  # noqa: F401
except ImportError:
    pass
else:
    _TASK_APPS.append("django_tasks_db")
    TASKS["db"] = {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default", "slow"]}
try:
    import django_rq  # noqa: F401
    import django_tasks_rq  # noqa: F401
except ImportError:
    pass
else:
    _TASK_APPS.append("django_rq")
    TASKS["rq"] = {"BACKEND": "django_tasks_rq.RQBackend", "QUEUES": ["default"]}
    RQ_QUEUES = {"default": {"URL": env.str("REDIS_URL", default="redis://127.0.0.1:6379/9")}}

SECRET_KEY = env.str("SECRET_KEY", default="testproject-insecure-key-do-not-use-in-production")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "kumiflow_django",
    "testproject.shop",
    *_TASK_APPS,
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    _db.setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    if _db["NAME"] != ":memory:":
        # A file, so that other processes (workers, subprocess tests) see the data.
        _db["TEST"] = {"NAME": str(BASE_DIR / "test_db.sqlite3")}
elif _db["ENGINE"] == "django.db.backends.postgresql":
    # A server or a worker host that is gone is noticed in seconds (docs/scaling.md).
    _db.setdefault("OPTIONS", {}).update(
        {
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            "tcp_user_timeout": 30000,
        }
    )
elif _db["ENGINE"] == "django.db.backends.mysql":
    import pymysql

    pymysql.install_as_MySQLdb()
    _db.setdefault("OPTIONS", {}).update({"charset": "utf8mb4"})
    _db["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}

# A second database, for the tests that put kumiflow-django's tables in a
# database of their own (KUMIFLOW_DATABASE = "workflows"): same server, its
# own database. Only the tests that ask for it create it; the processes the
# tests start go without it (tests/conftest.py sets TESTPROJECT_ONE_DATABASE).
if not env.bool("TESTPROJECT_ONE_DATABASE", default=False):
    DATABASES["workflows"] = {
        **_db,
        "NAME": f"{_db['NAME']}_workflows" if _db["NAME"] != ":memory:" else ":memory:",
        "TEST": {**_db.get("TEST", {}), "NAME": None},
    }
    if _db["ENGINE"] == "django.db.backends.sqlite3" and _db["NAME"] != ":memory:":
        DATABASES["workflows"]["TEST"] = {"NAME": str(BASE_DIR / "test_workflows.sqlite3")}

# The worker's LISTEN connection through another alias (tests/test_listen.py:
# the loops go through a transaction-pooling PgBouncer, LISTEN does not).
if env.str("LISTEN_DATABASE_URL", default=""):
    DATABASES["listen"] = env.db("LISTEN_DATABASE_URL")
    KUMIFLOW_LISTEN_DATABASE = "listen"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"

_EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
if django.VERSION >= (6, 1):
    MAILERS = {"default": {"BACKEND": _EMAIL_BACKEND}}
else:  # Django 5.2 LTS
    EMAIL_BACKEND = _EMAIL_BACKEND
DEFAULT_FROM_EMAIL = "hello@shop.example"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "kumiflow_django": {"handlers": ["console"], "level": env.str("KUMIFLOW_LOG", "WARNING")},
    },
}

# Where the shop's workflows send their webhooks (the demo points them at a
# receiver it starts on loopback).
SHOP_CRM_WEBHOOK_URL = env.str(
    "SHOP_CRM_WEBHOOK_URL", default="https://hooks.example.com/crm-onboarding"
)
SHOP_REPORT_WEBHOOK_URL = env.str(
    "SHOP_REPORT_WEBHOOK_URL", default="https://hooks.example.com/daily-report"
)
KUMIFLOW_WEBHOOK_SECRETS = {"crm": env.str("SHOP_CRM_SECRET", default="testproject-crm-secret")}
KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = env.list(
    "KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS", default=[]
)
KUMIFLOW_LEASE_SECONDS = env.float("KUMIFLOW_LEASE_SECONDS", default=60.0)
# The process tests of a rolling deploy shorten a worker's staleness.
KUMIFLOW_WORKER_STALE_SECONDS = env("KUMIFLOW_WORKER_STALE_SECONDS", cast=float, default=None)
# The live-stream tests start servers that poll fast, or (to prove LISTEN) never.
KUMIFLOW_SSE_POLL_INTERVAL = env.float("KUMIFLOW_SSE_POLL_INTERVAL", default=1.0)
KUMIFLOW_SSE_HEARTBEAT = env.float("KUMIFLOW_SSE_HEARTBEAT", default=15.0)
SHOP_CRON_EVERY_SECOND = env.bool("SHOP_CRON_EVERY_SECOND", default=False)
SHOP_BROKEN_CRON = env.bool("SHOP_BROKEN_CRON", default=False)
SHOP_POISON = env.bool("SHOP_POISON", default=False)
# Only for the rolling-deploy test: which release of ``rolling-deploy`` this
# process registers ("a" or "b"; empty: none).
SHOP_RELEASE = env.str("SHOP_RELEASE", default="")
