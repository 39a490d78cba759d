"""OpenTelemetry traces through ``opentelemetry-api`` (``kumiflow-django[otel]``).

:func:`install` registers an :class:`OtelTracer` with the seam
(:mod:`kumiflow_django.store.telemetry`); ``AppConfig.ready()`` calls it. The
spans go to the application's own TracerProvider (the global one, as set
with ``opentelemetry.trace.set_tracer_provider`` or by
``opentelemetry-instrument``): this package configures no SDK and no
exporter.

Spans are named ``kumiflow.<operation> <target>`` (``kumiflow.segment
signup``, ``kumiflow.step charge``, ``kumiflow.delivery webhook``,
``kumiflow.cron report``, ``kumiflow.task fetch``) and carry attributes
under ``kumiflow.`` (``kumiflow.run_id``, ``kumiflow.workflow``,
``kumiflow.version``, ``kumiflow.tenant``, ``kumiflow.step_path``,
``kumiflow.outcome``, ...). Stored and sent trace contexts are W3C
``traceparent``/``tracestate``, whatever propagator the application
configured globally (the stored format must not depend on it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kumiflow_django import __version__
from kumiflow_django.store import telemetry

#: The attribute of each operation whose value completes the span's name.
TARGETS = {
    "segment": ("workflow",),
    "step": ("step_name", "step_kind"),
    "delivery": ("kind",),
    "cron": ("workflow",),
    "task": ("task",),
}
PREFIX = "kumiflow."
_OUTCOME = PREFIX + "outcome"

_propagator = TraceContextTextMapPropagator()


_PLAIN = (str, bool, int, float)


def _value(value: Any) -> Any:
    """An attribute value as OpenTelemetry takes it (paths as ``0.do.2``, UUIDs as text)."""
    if isinstance(value, list | tuple):
        return ".".join(str(part) for part in value)
    return str(value)


def attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        PREFIX + key: value if type(value) in _PLAIN else _value(value)
        for key, value in values.items()
        if value is not None
    }


#: The attributes every span of a run's work carries, the same for all its steps.
RUN_KEYS = ("run_id", "workflow", "version", "tenant")
_STEP_KEYS = tuple((name, PREFIX + name) for name in ("step_path", "step_kind", "step_name"))


def span_name(operation: str, values: Mapping[str, Any]) -> str:
    for key in TARGETS.get(operation, ()):
        target = values.get(key)
        if target:
            return f"{PREFIX}{operation} {target}"
    return PREFIX + operation


def extract(carrier: telemetry.Carrier | None) -> trace.SpanContext | None:
    """The span context a stored carrier holds; None if it holds no valid one."""
    if not carrier:
        return None
    found = trace.get_current_span(_propagator.extract(dict(carrier))).get_span_context()
    return found if found.is_valid else None


class OtelSpan:
    """An open span as the seam's callers see it; current from ``__enter__``
    to ``__exit__``."""

    __slots__ = ("_span", "_token", "failed", "outcome")

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self.outcome: str | None = None
        self.failed = False

    def set(self, **values: Any) -> None:
        if "outcome" in values:
            self.outcome = values["outcome"]
            outcome = self.outcome
            if len(values) == 1 and outcome is not None:  # the usual call
                self._span.set_attribute(
                    _OUTCOME, outcome if type(outcome) is str else str(outcome)
                )
                return
        if self._span.is_recording():
            self._span.set_attributes(attributes(values))

    def fail(self, error: BaseException | str) -> None:
        self.failed = True
        self.set(outcome="failed")
        if isinstance(error, BaseException):
            self._span.record_exception(error)
            error = f"{type(error).__name__}: {error}"
        self._span.set_status(trace.Status(trace.StatusCode.ERROR, error[:500]))

    def __enter__(self) -> OtelSpan:
        self._token = context_api.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            # An exception the caller did not account for (no outcome said) is a
            # failure; one it did (a suspension, a return) is how the step ended.
            if error is not None and self.outcome is None and not self.failed:
                self.fail(error)
            elif self.outcome is None:
                self.outcome = "ok"
                self._span.set_attribute(_OUTCOME, "ok")
            self._span.end()
        finally:
            context_api.detach(self._token)


class OtelTracer:
    """The seam's tracer on ``opentelemetry-api``."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer(
            "kumiflow_django", __version__, tracer_provider=tracer_provider
        )
        # The last run's attributes, made once for all its steps (a step span
        # costs a few microseconds less); replaced whole, so threads may share it.
        self._run: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})

    def _step_attributes(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """:func:`attributes` of a step span (the seam's ``StepScope`` gives
        these keys), with the run's part made once for all its steps."""
        get = values.get
        key = (get("run_id"), get("workflow"), get("version"), get("tenant"))
        last = self._run
        if last[0] != key:
            last = self._run = (key, attributes(dict(zip(RUN_KEYS, key, strict=True))))
        found = last[1].copy()
        for name, attribute in _STEP_KEYS:
            value = get(name)
            if value is not None:
                found[attribute] = value if type(value) in _PLAIN else _value(value)
        return found

    def span(
        self,
        operation: str,
        values: dict[str, Any],
        parent: telemetry.Carrier | None,
        links: Sequence[telemetry.Carrier],
    ) -> OtelSpan:
        context = None
        if parent is None and not links:  # the common case, a step's span
            return OtelSpan(
                self._tracer.start_span(
                    span_name(operation, values),
                    attributes=(
                        self._step_attributes(values) if operation == "step" else attributes(values)
                    ),
                    record_exception=False,
                    set_status_on_exception=False,
                )
            )
        parent_context = extract(parent) if parent else None
        if parent_context is not None:
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent_context))
        linked: list[trace.Link] = []
        if links:
            if parent_context is None:
                parent_context = trace.get_current_span().get_span_context()
            for carrier in links:
                found = extract(carrier)
                # A link to the span's own parent says nothing the parent does not.
                if found is not None and found.span_id != parent_context.span_id:
                    linked.append(trace.Link(found))
        span = self._tracer.start_span(
            span_name(operation, values),
            context=context,
            attributes=attributes(values),
            links=linked,
            record_exception=False,
            set_status_on_exception=False,
        )
        return OtelSpan(span)

    def carrier(self) -> dict[str, str] | None:
        if not trace.get_current_span().get_span_context().is_valid:
            return None
        found: dict[str, str] = {}
        _propagator.inject(found)
        return found or None


def install(tracer_provider: trace.TracerProvider | None = None) -> OtelTracer:
    """Send the package's spans to ``tracer_provider`` (default: the global one)."""
    tracer = OtelTracer(tracer_provider)
    telemetry.set_tracer(tracer)
    return tracer


def uninstall() -> None:
    telemetry.set_tracer(None)
