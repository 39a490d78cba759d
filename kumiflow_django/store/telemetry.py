"""The instrumentation seam: spans, metrics and log fields, with no dependency.

The code that does work worth watching (the segment runner, the steps, the
outbox delivery, cron, task attempts) reports it here and imports nothing
else for it. What becomes of a report depends on what is registered:

- nothing (the default, and always without the optional extras): every
  call returns at once, the hot path pays a function call;
- a :class:`Tracer` (:mod:`kumiflow_django.observability.otel`): spans;
- a :class:`Meter` (:mod:`kumiflow_django.observability.metrics`):
  counters and histograms (:data:`METRICS` names them all).

The integrations live in :mod:`kumiflow_django.observability`, above every
layer that reports, and ``AppConfig.ready()`` registers them. The log fields
need no integration: every logger of the package (:func:`get_logger`) adds
the run id, workflow, tenant and step path of the work at hand to its
records, fed by :func:`run_fields` and :class:`StepScope`.

Attributes are given as keyword arguments with plain names (``run_id``,
``step_path``); values may be UUIDs and path lists: the integration turns
them into text, so that nothing is formatted while nobody listens.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, Self

#: A W3C trace context, as stored in an event's metadata and sent in webhook
#: headers: ``{"traceparent": "00-<trace id>-<span id>-<flags>"}``, with
#: ``"tracestate"`` when there is one.
Carrier = Mapping[str, str]
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"


class Span(Protocol):
    """What a caller may do with an open span."""

    def set(self, **attributes: Any) -> None:
        """Add attributes (``outcome="suspended"``, ...)."""

    def fail(self, error: BaseException | str) -> None:
        """Mark the span failed (outcome ``failed``, error status): by an
        exception (recorded on the span), or for a reason given as text."""


class Tracer(Protocol):
    """A tracing integration."""

    def span(
        self,
        operation: str,
        attributes: dict[str, Any],
        parent: Carrier | None,
        links: Sequence[Carrier],
    ) -> contextlib.AbstractContextManager[Span]:
        """A span of ``operation`` (``segment``, ``step``, ``delivery``, ``cron``,
        ``task``), current while it is open. ``parent`` is a stored context to
        continue (None: the current span's, if any); ``links`` stored
        contexts the span links to."""

    def carrier(self) -> dict[str, str] | None:
        """The trace context of the current span; None when no trace is active."""


class Meter(Protocol):
    """A metrics integration. ``metric`` is a key of :data:`METRICS`; the
    labels are exactly the ones it declares."""

    def count(self, metric: str, value: float, labels: Mapping[str, str]) -> None: ...

    def observe(self, metric: str, value: float, labels: Mapping[str, str]) -> None: ...


class _NoSpan:
    """The span of nobody listening: also its own context manager."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, **attributes: Any) -> None:
        pass

    def fail(self, error: BaseException | str) -> None:
        pass


NO_SPAN = _NoSpan()

_tracer: Tracer | None = None
_meter: Meter | None = None


def set_tracer(tracer: Tracer | None) -> Tracer | None:
    """Register ``tracer`` (None: none) and return the one before."""
    global _tracer
    previous, _tracer = _tracer, tracer
    return previous


def set_meter(meter: Meter | None) -> Meter | None:
    """Register ``meter`` (None: none) and return the one before."""
    global _meter
    previous, _meter = _meter, meter
    return previous


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Registrations made inside the block are undone when it ends (for tests)."""
    tracer, meter = _tracer, _meter
    try:
        yield
    finally:
        set_tracer(tracer)
        set_meter(meter)


def tracing() -> bool:
    """Whether spans are recorded: callers skip work that only spans need."""
    return _tracer is not None


def span(
    operation: str,
    /,
    *,
    parent: Carrier | None = None,
    links: Sequence[Carrier] = (),
    **attributes: Any,
) -> contextlib.AbstractContextManager[Span]:
    """A span of ``operation`` around a block: ``with span("delivery", kind=k) as s:``."""
    tracer = _tracer
    if tracer is None:
        return NO_SPAN
    try:
        return tracer.span(operation, attributes, parent, links)
    except Exception:  # an integration's bug never fails the work it watches
        _logger.exception("telemetry: the %s span could not be started", operation)
        return NO_SPAN


def carrier() -> dict[str, str] | None:
    """The trace context of the current span, when a trace is active."""
    tracer = _tracer
    if tracer is None:
        return None
    try:
        return tracer.carrier()
    except Exception:
        _logger.exception("telemetry: the trace context could not be read")
        return None


def carried(metadata: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The trace context an event's metadata holds, if any."""
    if not metadata:
        return None
    parent = metadata.get(TRACEPARENT)
    if not isinstance(parent, str) or not parent:
        return None
    found = {TRACEPARENT: parent}
    state = metadata.get(TRACESTATE)
    if isinstance(state, str) and state:
        found[TRACESTATE] = state
    return found


def stamp(metadata: dict[str, Any]) -> dict[str, Any]:
    """Add the current trace context to an event's ``metadata`` (in place), when
    a trace is active and the metadata does not name a context of its own."""
    if _tracer is not None and TRACEPARENT not in metadata:
        current = carrier()
        if current:
            metadata.update(current)
    return metadata


def count(metric: str, value: float = 1, /, **labels: str) -> None:
    """Add ``value`` to the counter ``metric`` (a key of :data:`METRICS`)."""
    meter = _meter
    if meter is not None:
        try:
            meter.count(metric, value, labels)
        except Exception:  # an integration's bug never fails the work it counts
            _logger.exception("telemetry: %s could not be counted", metric)


def observe(metric: str, value: float, /, **labels: str) -> None:
    """Record ``value`` in the histogram ``metric`` (a key of :data:`METRICS`)."""
    meter = _meter
    if meter is not None:
        try:
            meter.observe(metric, value, labels)
        except Exception:
            _logger.exception("telemetry: %s could not be recorded", metric)


def measuring() -> bool:
    """Whether metrics are recorded: callers skip work that only metrics need."""
    return _meter is not None


# -- the metrics ---------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """A counter or histogram the package reports, as the integrations declare it."""

    kind: str  # "counter" or "histogram"
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


RUNS_STARTED = "runs_started"
RUNS_COMPLETED = "runs_completed"
RUNS_FAILED = "runs_failed"
RUNS_CANCELLED = "runs_cancelled"
DEFINITION_SWITCHES = "definition_switches"
SEGMENTS = "segments"
SEGMENT_DURATION = "segment_duration_seconds"
WAKE_LATENESS = "wake_lateness_seconds"
DELIVERIES = "deliveries"
DELIVERY_DURATION = "delivery_duration_seconds"
DELIVERY_LATENCY = "delivery_latency_seconds"
TASK_ATTEMPTS = "task_attempts"
TASK_DURATION = "task_duration_seconds"
CRON_OCCURRENCES = "cron_occurrences"

_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LATE = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
_SLOW = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)

#: Every counter and histogram, by name (the Prometheus name is
#: ``kumiflow_<name>``, counters with ``_total``).
METRICS: dict[str, Metric] = {
    RUNS_STARTED: Metric("counter", "Runs started.", ("workflow",)),
    RUNS_COMPLETED: Metric("counter", "Runs completed.", ("workflow",)),
    RUNS_FAILED: Metric("counter", "Runs failed, by reason.", ("workflow", "reason")),
    RUNS_CANCELLED: Metric("counter", "Runs cancelled.", ("workflow",)),
    DEFINITION_SWITCHES: Metric(
        "counter",
        "Runs a deploy carried on to another definition (a compatible change), by classification.",
        ("workflow", "classification"),
    ),
    SEGMENTS: Metric(
        "counter",
        "Segments run, by outcome (completed, suspended, failed, deferred, refused, skipped).",
        ("workflow", "outcome"),
    ),
    SEGMENT_DURATION: Metric(
        "histogram", "Duration of a segment, its transaction included.", ("workflow",), _FAST
    ),
    WAKE_LATENESS: Metric(
        "histogram",
        "How late a suspended run resumed: now minus its wake time, by why it woke.",
        ("workflow", "reason"),
        _LATE,
    ),
    DELIVERIES: Metric(
        "counter",
        "Delivery attempts of the outbox, by outcome (delivered, retry, dead, lost).",
        ("kind", "outcome"),
    ),
    DELIVERY_DURATION: Metric(
        "histogram", "Duration of one delivery attempt.", ("kind", "outcome"), _FAST
    ),
    DELIVERY_LATENCY: Metric(
        "histogram",
        "From the request (the segment that asked) to the delivery.",
        ("kind",),
        _SLOW,
    ),
    TASK_ATTEMPTS: Metric("counter", "Task attempts, by outcome.", ("workflow", "task", "outcome")),
    TASK_DURATION: Metric(
        "histogram", "Duration of one task attempt.", ("workflow", "task", "outcome"), _LATE
    ),
    CRON_OCCURRENCES: Metric(
        "counter", "Cron occurrences, fired or skipped.", ("workflow", "outcome")
    ),
}


# -- log fields ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogFields:
    """What every log line of the package says about the work at hand (the run
    id as given: made text only when a line is logged)."""

    run_id: object = None
    workflow: str | None = None
    tenant: str | None = None


_NO_FIELDS = LogFields()
_fields: ContextVar[LogFields] = ContextVar("kumiflow_log_fields", default=_NO_FIELDS)
_step_path: ContextVar[Sequence[Any] | None] = ContextVar("kumiflow_step_path", default=None)


class run_fields:  # noqa: N801 - used like a function: ``with run_fields(...):``
    """The run a block works for, in the log fields of every line it logs (no
    step yet: a run started by a step of another is not at that step)."""

    __slots__ = ("_fields", "_path_token", "_token")

    def __init__(self, run_id: object, workflow: str | None, tenant: str | None) -> None:
        self._fields = LogFields(run_id, workflow, tenant)

    def __enter__(self) -> None:
        self._token = _fields.set(self._fields)
        self._path_token = _step_path.set(None)

    def __exit__(self, *exc: object) -> None:
        _step_path.reset(self._path_token)
        _fields.reset(self._token)


def current_fields() -> dict[str, Any]:
    """The log fields of the work at hand (the step path as text)."""
    fields = _fields.get()
    path = _step_path.get()
    return {
        "run_id": None if fields.run_id is None else str(fields.run_id),
        "workflow": fields.workflow,
        "tenant": fields.tenant,
        "step_path": path if path is None or isinstance(path, str) else _path_text(path),
    }


def _path_text(path: Sequence[Any]) -> str:
    return ".".join(str(p) for p in path)


def log_fields(
    *,
    run_id: object = None,
    workflow: str | None = None,
    tenant: str | None = None,
    step_path: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """Fields for ``extra=``: for a line about a run logged outside its
    segment, or about a step that is over. Fields not given come from the
    work at hand."""
    found: dict[str, Any] = {}
    if run_id is not None:
        found["run_id"] = str(run_id)
    if workflow is not None:
        found["workflow"] = workflow
    if tenant is not None:
        found["tenant"] = tenant
    if step_path is not None:
        found["step_path"] = step_path if isinstance(step_path, str) else _path_text(step_path)
    return found


class RunRow(Protocol):
    @property
    def id(self) -> Any: ...
    @property
    def workflow(self) -> str: ...
    @property
    def tenant_id(self) -> str: ...


def run_log_fields(run: RunRow) -> dict[str, Any]:
    """:func:`log_fields` of a run row."""
    return log_fields(run_id=run.id, workflow=run.workflow, tenant=run.tenant_id)


class RunFieldsFilter(logging.Filter):
    """Adds ``run_id``, ``workflow``, ``tenant`` and ``step_path`` to each
    record (None outside a run); a field given in ``extra=`` is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in current_fields().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


_FILTER = RunFieldsFilter()


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with the run's fields on every record: the
    package's modules take their loggers from here."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger


_logger = get_logger("kumiflow_django.telemetry")


class RunLike(Protocol):
    """What a step's span says about its run (the steps' ``ctx.run``)."""

    @property
    def id(self) -> Any: ...
    @property
    def workflow(self) -> str: ...
    @property
    def version(self) -> str | None: ...
    @property
    def tenant(self) -> str: ...


class StepScope:
    """One step while it runs: its path in the log fields, and its span
    (whose attributes are only gathered while someone listens)."""

    __slots__ = ("_kind", "_name", "_path", "_run", "_scope", "_token")

    def __init__(
        self,
        path: Sequence[Any],
        *,
        kind: str | None = None,
        name: str | None = None,
        run: RunLike | None = None,
    ) -> None:
        self._path = path
        self._kind = kind
        self._name = name
        self._run = run
        self._scope: contextlib.AbstractContextManager[Span] | None = None

    def __enter__(self) -> Span:
        self._token = _step_path.set(self._path)
        tracer = _tracer
        if tracer is None or self._run is None:
            return NO_SPAN
        run = self._run
        attributes = {
            "run_id": run.id,
            "workflow": run.workflow,
            "version": run.version,
            "tenant": run.tenant,
            "step_path": self._path,
            "step_kind": self._kind,
            "step_name": self._name,
        }
        try:
            scope = tracer.span("step", attributes, None, ())
            opened = scope.__enter__()
        except Exception:  # an integration's bug never fails the step
            _logger.exception("telemetry: the step span could not be started")
            return NO_SPAN
        self._scope = scope
        return opened

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            if self._scope is not None:
                self._scope.__exit__(kind, error, traceback)
        finally:
            _step_path.reset(self._token)


class task_attempt:  # noqa: N801 - used like a function: ``with task_attempt(...) as attempt:``
    """The hook of the task runner: wrap each attempt of a task in it.

    ``with telemetry.task_attempt(run_id=..., workflow=..., tenant=...,
    step_path=..., task=..., attempt=n, parent=carrier) as attempt:`` opens
    the attempt's span (a child of ``parent``, the trace context stored when
    the task was requested), puts the run in the log fields and, when the
    block ends, counts the attempt by outcome and records its duration. Set
    ``attempt.outcome`` (``succeeded``, ``failed``, ``retry``, ``late``...);
    an exception out of the block makes it ``failed``.
    """

    def __init__(
        self,
        *,
        run_id: object,
        workflow: str,
        tenant: str,
        step_path: Sequence[Any],
        task: str,
        attempt: int,
        parent: Carrier | None = None,
        links: Sequence[Carrier] = (),
        version: str | None = None,
    ) -> None:
        self.outcome: str | None = None
        self._labels = {"workflow": workflow, "task": task}
        self._fields = run_fields(run_id, workflow, tenant)
        self._step = StepScope(step_path)
        self._span = span(
            "task",
            parent=parent,
            links=links,
            run_id=run_id,
            workflow=workflow,
            version=version,
            tenant=tenant,
            step_path=step_path,
            task=task,
            attempt=attempt,
        )
        self._began = 0.0

    def __enter__(self) -> Self:
        self._fields.__enter__()
        self._step.__enter__()
        self.span = self._span.__enter__()
        self._began = time.perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        elapsed = time.perf_counter() - self._began
        if error is not None and self.outcome is None:
            self.outcome = "failed"
        outcome = self.outcome or "succeeded"
        try:
            if error is not None:
                self.span.fail(error)
            self.span.set(outcome=outcome)
            self._span.__exit__(kind, error, traceback)
        finally:
            self._step.__exit__(kind, error, traceback)
            self._fields.__exit__(kind, error, traceback)
        count(TASK_ATTEMPTS, **self._labels, outcome=outcome)
        observe(TASK_DURATION, elapsed, **self._labels, outcome=outcome)
