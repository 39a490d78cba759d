"""The benchmark's project as a WSGI application: W14's server whose threads
keep their database connections (``BENCH_CONN_MAX_AGE``), which ASGI cannot."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

application = get_wsgi_application()
