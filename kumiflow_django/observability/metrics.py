"""Prometheus metrics through ``prometheus-client`` (``kumiflow-django[metrics]``).

Two kinds of figures:

- **counters and histograms** of the work this process did (runs started,
  segments, deliveries, task attempts...): :class:`PrometheusMeter`
  receives them from the seam (:mod:`kumiflow_django.store.telemetry`,
  whose ``METRICS`` names them all). They are per process: scrape every
  process that does work (each worker, and the web processes, which run
  inline segments);
- **gauges of the database** (due backlog, oldest due age, waiting runs,
  the outbox): :class:`DatabaseCollector` reads them at scrape time with a
  few indexed queries, so every process reports the same, right figures
  whatever the number of workers.

:func:`install` (called by ``AppConfig.ready()``) registers both with
``prometheus_client``'s global registry; :func:`metrics_view` serves it in
your ``urls.py``, :class:`MetricsServer` from ``kumiflow_worker
--metrics-port``. Both need ``KUMIFLOW_METRICS_TOKEN`` as a bearer token
when it is set; the view also lets in a signed-in user with the
``kumiflow.view_workflowrun`` permission.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import urlsplit

from django.db import DatabaseError
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils.crypto import constant_time_compare
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kumiflow_django.conf import settings
from kumiflow_django.engine import unserved
from kumiflow_django.projections.dispatches import DELIVERABLE, Dispatch, DispatchStatus
from kumiflow_django.projections.runs import SUSPENDED, WorkflowRun
from kumiflow_django.store import clock, db, telemetry
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.metrics")

NAMESPACE = "kumiflow"
#: Who may read the metrics in the web view without a token.
PERMISSION = "kumiflow.view_workflowrun"


class PrometheusMeter:
    """The seam's meter: one ``prometheus_client`` counter or histogram per
    entry of ``telemetry.METRICS``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._metrics: dict[str, Counter | Histogram] = {}
        # The labelled children, found once: ``labels()`` checks and locks every time.
        self._children: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        for name, spec in telemetry.METRICS.items():
            if spec.kind == "counter":
                self._metrics[name] = Counter(
                    name, spec.help, spec.labels, namespace=NAMESPACE, registry=registry
                )
            else:
                self._metrics[name] = Histogram(
                    name,
                    spec.help,
                    spec.labels,
                    namespace=NAMESPACE,
                    registry=registry,
                    buckets=spec.buckets,
                )

    def _child(self, metric: str, labels: Mapping[str, str]) -> Any:
        key = (metric, tuple(labels.items()))
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._metrics[metric].labels(**labels)
        return child

    def count(self, metric: str, value: float, labels: Mapping[str, str]) -> None:
        self._child(metric, labels).inc(value)

    def observe(self, metric: str, value: float, labels: Mapping[str, str]) -> None:
        self._child(metric, labels).observe(value)


_UP = "Whether this scrape could read kumiflow-django's database."


def _age(now: datetime, since: datetime | None) -> float:
    return max((now - since).total_seconds(), 0.0) if since is not None else 0.0


class DatabaseCollector(Collector):
    """Gauges read from the database at each scrape, each with one indexed query:

    - ``kumiflow_runs_due``, ``kumiflow_runs_oldest_due_age_seconds``: the
      range of ``kumiflow_run_due_idx`` up to now (finished runs have no
      wake time: they are not in it);
    - ``kumiflow_runs_waiting{status}``: ``kumiflow_run_status_idx``;
    - ``kumiflow_runs_waiting_for_definition``: the due range again, less the
      runs on a definition a live worker process serves (its heartbeat rows);
    - ``kumiflow_outbox_pending``, ``kumiflow_outbox_dead``:
      ``kumiflow_dispatch_status_idx``;
    - ``kumiflow_outbox_due``, ``kumiflow_outbox_oldest_due_age_seconds``:
      ``kumiflow_dispatch_due_idx``;
    - ``kumiflow_database_up``: 0 when the queries failed (then the others
      are left out of the scrape rather than reported wrong).
    """

    def describe(self) -> Iterable[Metric]:
        # Without it, registering would run the queries (prometheus_client
        # collects once to learn the names): not at start-up.
        return [*self._families({}), _gauge("database_up", _UP, None)]

    def collect(self) -> Iterable[Metric]:
        now = clock.now()
        connection = db.connection()
        # A connection this scrape opened is closed again: a server that answers
        # each scrape in a new thread (prometheus_client's own) would leak one.
        opened_here = connection.connection is None
        try:
            figures = self.read(now)
        except DatabaseError:
            logger.warning("metrics: reading the database failed", exc_info=True)
            figures = None
        finally:
            if opened_here and not connection.in_atomic_block:
                connection.close()
        if figures is None:
            yield _gauge("database_up", _UP, 0)
            return
        yield from self._families(figures)
        yield _gauge("database_up", _UP, 1)

    def read(self, now: datetime) -> dict[str, Any]:
        runs = WorkflowRun.objects
        due_runs = runs.due(now)
        dispatches = Dispatch.objects
        waiting = dict(
            runs.filter(status__in=SUSPENDED)
            .order_by()
            .values("status")
            .annotate(n=Count("*"))
            .values_list("status", "n")
        )
        outbox = dict(
            dispatches.filter(status__in=[*DELIVERABLE, DispatchStatus.DEAD])
            .order_by()
            .values("status")
            .annotate(n=Count("*"))
            .values_list("status", "n")
        )
        due_dispatches = dispatches.due(now)
        return {
            "runs_due": due_runs.count(),
            "runs_oldest_due": _age(
                now, due_runs.order_by("wake_at").values_list("wake_at", flat=True).first()
            ),
            "runs_waiting": {status: waiting.get(status, 0) for status in SUSPENDED},
            "runs_waiting_for_definition": unserved.waiting(now).count(),
            "outbox_pending": sum(outbox.get(status, 0) for status in DELIVERABLE),
            "outbox_dead": outbox.get(DispatchStatus.DEAD, 0),
            "outbox_due": due_dispatches.count(),
            "outbox_oldest_due": _age(
                now,
                due_dispatches.order_by("next_attempt_at")
                .values_list("next_attempt_at", flat=True)
                .first(),
            ),
        }

    def _families(self, figures: Mapping[str, Any]) -> Iterator[Metric]:
        get = figures.get
        yield _gauge(
            "runs_due", "Runs whose wake time has come: the resume backlog.", get("runs_due")
        )
        yield _gauge(
            "runs_oldest_due_age_seconds",
            "How long the longest-due run has been due (0: none is due).",
            get("runs_oldest_due"),
        )
        waiting = GaugeMetricFamily(
            f"{NAMESPACE}_runs_waiting",
            "Suspended runs: pending (a deferred start), waiting (a timer), "
            "waiting_event, retry_scheduled.",
            labels=["status"],
        )
        for status, n in (get("runs_waiting") or {}).items():
            waiting.add_metric([str(status)], n)
        yield waiting
        yield _gauge(
            "runs_waiting_for_definition",
            "Due runs whose definition no live worker process serves (a rolling deploy "
            "in progress, or a release without its workers): they fail after "
            "KUMIFLOW_UNKNOWN_DEFINITION_GRACE.",
            get("runs_waiting_for_definition"),
        )
        yield _gauge(
            "outbox_pending",
            "Dispatches not delivered yet that will be tried (pending, or failed and "
            "waiting for a retry).",
            get("outbox_pending"),
        )
        yield _gauge("outbox_dead", "Dispatches given up (dead).", get("outbox_dead"))
        yield _gauge("outbox_due", "Dispatches whose next attempt is due now.", get("outbox_due"))
        yield _gauge(
            "outbox_oldest_due_age_seconds",
            "How long the longest-due dispatch has been due (0: none is due).",
            get("outbox_oldest_due"),
        )


def _gauge(name: str, documentation: str, value: float | None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"{NAMESPACE}_{name}", documentation)
    if value is not None:
        family.add_metric([], value)
    return family


# -- installing ----------------------------------------------------------

_meters: dict[CollectorRegistry, PrometheusMeter] = {}
_registry: CollectorRegistry | None = None


def install(registry: CollectorRegistry = REGISTRY) -> PrometheusMeter:
    """Count into ``registry`` (default: ``prometheus_client``'s global one) and
    add the database gauges to it; the metric endpoints serve it. Installing
    into a registry again reuses what is there."""
    global _registry
    meter = _meters.get(registry)
    if meter is None:
        meter = _meters[registry] = PrometheusMeter(registry)
        registry.register(DatabaseCollector())
    telemetry.set_meter(meter)
    _registry = registry
    return meter


@contextlib.contextmanager
def isolated(registry: CollectorRegistry | None = None) -> Iterator[CollectorRegistry]:
    """Count into ``registry`` (a new one by default) inside the block only: for tests."""
    global _registry
    saved = _registry
    registry = registry or CollectorRegistry()
    with telemetry.isolated():
        try:
            install(registry)
            yield registry
        finally:
            _registry = saved


def uninstall() -> None:
    global _registry
    telemetry.set_meter(None)
    _registry = None


def installed_registry() -> CollectorRegistry | None:
    """The registry the metric endpoints serve (None: metrics are not installed)."""
    return _registry


# -- serving -------------------------------------------------------------


def tokens() -> list[str]:
    value = settings.METRICS_TOKEN
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def token_allowed(authorization: str | None) -> bool:
    """Whether an ``Authorization`` header holds one of ``KUMIFLOW_METRICS_TOKEN``."""
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return False
    return any(constant_time_compare(given.strip(), token) for token in tokens())


def exposition(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The registry's metrics in the format the scraper accepts, and its content type."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


def _unauthorized() -> HttpResponse:
    response = HttpResponse("a bearer token or a signed-in user is needed\n", status=401)
    response["WWW-Authenticate"] = 'Bearer realm="kumiflow metrics"'
    return response


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """``/metrics`` in your ``urls.py``: ``path("metrics", metrics_view)``.

    Lets in a request with ``Authorization: Bearer <KUMIFLOW_METRICS_TOKEN>``,
    or a signed-in user with the ``kumiflow.view_workflowrun`` permission.
    """
    if not token_allowed(request.headers.get("Authorization")):
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return _unauthorized()
        if not user.has_perm(PERMISSION):
            return HttpResponse("permission denied\n", status=403)
    registry = installed_registry()
    if registry is None:
        return HttpResponse(
            "kumiflow-django's metrics are switched off (KUMIFLOW_METRICS)\n", status=404
        )
    body, content_type = exposition(registry, request.headers.get("Accept"))
    return HttpResponse(body, content_type=content_type)


class _Server(HTTPServer):
    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.registry = registry
        super().__init__((host, port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - the http.server convention
        if urlsplit(self.path).path not in ("/", "/metrics"):
            self._send(404, b"not found\n", "text/plain")
            return
        if tokens() and not token_allowed(self.headers.get("Authorization")):
            self._send(401, b"a bearer token is needed\n", "text/plain")
            return
        try:
            body, content_type = exposition(self.server.registry, self.headers.get("Accept"))
        except Exception:
            logger.exception("metrics: the scrape failed")
            self._send(500, b"the scrape failed\n", "text/plain")
            return
        self._send(200, body, content_type)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="kumiflow metrics"')
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        logger.debug("metrics: %s", format % args)


class MetricsServer:
    """``/metrics`` over HTTP beside the worker's loops (``--metrics-port``).

    One thread answers one request at a time (the database gauges open and
    close their connection in each scrape); the worker stops it with its
    loops. The port is bound when the server is made, so a port in use fails
    at once.
    """

    def __init__(self, host: str, port: int, registry: CollectorRegistry | None = None) -> None:
        registry = registry or installed_registry()
        if registry is None:
            raise RuntimeError("kumiflow-django's metrics are switched off (KUMIFLOW_METRICS)")
        self._httpd = _Server(host, port, registry)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        address = self._httpd.server_address
        host, port = str(address[0]), int(address[1])
        return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="kumiflow-metrics", daemon=True)
        self._thread.start()
        logger.info("metrics: serving %s", self.url)

    def _serve(self) -> None:
        try:
            self._httpd.serve_forever(poll_interval=0.5)
        finally:
            db.connection().close()

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()
