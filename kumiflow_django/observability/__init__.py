"""Optional integrations: OpenTelemetry traces, Prometheus metrics, JSON logs.

The engine, the outbox and cron report through the dependency-free seam
:mod:`kumiflow_django.store.telemetry`; the modules here turn the reports
into spans (:mod:`.otel`, needs ``kumiflow-django[otel]``) and metrics
(:mod:`.metrics`, needs ``kumiflow-django[metrics]``), and format log
records as JSON (:mod:`.logs`, no dependency). ``AppConfig.ready()``
installs each integration whose library is importable, unless its setting
(``KUMIFLOW_TRACING``, ``KUMIFLOW_METRICS``) switches it off.

This layer sits above the worker (the metrics endpoint of ``kumiflow_worker``
runs beside its loops) and below the management commands. Importing this
package imports neither optional library.
"""

from __future__ import annotations

import importlib.util

from kumiflow_django.conf import settings

#: The setting of each integration, and the module it needs.
LIBRARIES = {"TRACING": "opentelemetry.trace", "METRICS": "prometheus_client"}


def available(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it, where possible)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package, a blocked import
        return False


def enabled(feature: str) -> bool:
    """Whether the integration ``feature`` (``"TRACING"`` or ``"METRICS"``) is to be
    installed: its setting is not False and its library is importable."""
    return getattr(settings, feature) is not False and available(LIBRARIES[feature])
