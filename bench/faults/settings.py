"""Settings of the fault suite's workers and harness: the testproject with the
suite's workflows and a short lease, so that a fault resolves in seconds."""

import os

from testproject.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench.faults"]  # noqa: F405
DATABASES.pop("workflows", None)  # noqa: F405
# pg_stat_activity names each worker's backends (the forwarder hides client_addr).
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":  # noqa: F405
    DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = os.environ.get(  # noqa: F405
        "FAULTS_ROLE", "faults-harness"
    )
# The failover run: libpq's multi-host form, the primary being whichever accepts writes.
if os.environ.get("FAULTS_PG_HOSTS"):
    DATABASES["default"].update(  # noqa: F405
        HOST=os.environ["FAULTS_PG_HOSTS"],
        PORT=os.environ["FAULTS_PG_PORTS"],
        NAME=os.environ["FAULTS_PG_NAME"],
        USER="postgres",
    )
    DATABASES["default"]["OPTIONS"].update(  # noqa: F405
        target_session_attrs="read-write", connect_timeout=3
    )
KUMIFLOW_LEASE_SECONDS = float(os.environ.get("FAULTS_LEASE", "4"))
KUMIFLOW_MAX_INTERVAL = 0.5
KUMIFLOW_RESUME_THREADS = 2
KUMIFLOW_TASK_THREADS = 2
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"kumiflow_django": {"handlers": ["console"], "level": "INFO"}},
}
