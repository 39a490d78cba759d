"""The benchmark runs the testproject with one more app: the benchmark's workflows."""

import os

from testproject.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench"]  # noqa: F405
LOGGING = {"version": 1, "disable_existing_loggers": False}
KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
KUMIFLOW_MAX_INTERVAL = 1.0
# Tracing and metrics only in W1-observed (the others measure the core as before,
# whether or not the optional libraries are installed).
KUMIFLOW_TRACING = KUMIFLOW_METRICS = os.environ.get("BENCH_OBSERVED") == "1"
# The testproject's second database is for its tests; the benchmark has one.
DATABASES.pop("workflows", None)  # noqa: F405
# W14's floor views next to the testproject's URLs (bench/urls.py).
ROOT_URLCONF = "bench.urls"
# W14's WSGI server (bench/wsgi.py) keeps each thread's connection this long;
# under ASGI each request's thread is new, and so is its connection.
if os.environ.get("BENCH_CONN_MAX_AGE"):
    DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ["BENCH_CONN_MAX_AGE"])  # noqa: F405
