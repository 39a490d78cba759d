"""What a segment reports: its span, its log fields, its metrics.

The segment runner opens a :class:`Watch` around every segment; it reports
through the seam (:mod:`kumiflow_django.store.telemetry`) and costs next to
nothing while no integration is registered.

**Trace context.** A run's origin is the trace context of the code that
started it: the one stored in the trigger event's metadata, or (a manual or
cron start) the current span's. It is stored in the metadata of the run's
``run-started`` event. Which spans are children, which links:

- the run's *first* segment (inline, or a deferred start a worker runs) is
  a child of the origin;
- every *later* segment (a timer, an awaited event, a timeout, a retry, an
  operator's wake) is a child of the span current where it runs (the
  request that appended the awaited event, for an inline wake), or the root
  of a trace of its own in a worker, and *links* to the origin and to the
  trace context stored on the event that woke it. The origin's spans ended
  long ago: a trace is not held open for days.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from kumiflow_django.definition.context import WakeReason
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.store import clock, db, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import Event

if TYPE_CHECKING:
    from kumiflow_django.engine.opening import Opening

_SUSPENDED = {RunStatus.WAITING, RunStatus.WAITING_EVENT, RunStatus.RETRY_SCHEDULED}


def origin(run_id: object, tenant: str) -> dict[str, str] | None:
    """The trace context stored on a run's ``run-started`` event."""
    metadata = (
        Event.objects.filter(tenant_id=tenant, stream_id=str(run_id), version=1)
        .values_list("metadata", flat=True)
        .first()
    )
    return telemetry.carried(metadata)


def stamp(event: Event, opening: Opening) -> Event:
    """Store the run's origin in the metadata of its ``run-started`` event."""
    if opening.trace and event.type == ev.RUN_STARTED:
        event.metadata = {**event.metadata, **opening.trace}
    return event


def _context(opening: Opening) -> tuple[telemetry.Carrier | None, list[telemetry.Carrier]]:
    """(parent, links) of a segment's span; see the module docstring."""
    if opening.new:
        return opening.trace, []
    first = origin(opening.run_id, opening.tenant)
    steps = opening.steps
    if steps is not None and steps.wake.reason == WakeReason.START:
        return first, []  # a deferred start: the run's first segment
    links: list[telemetry.Carrier] = [first] if first else []
    event = steps.wake.event if steps is not None else None
    woken_by = telemetry.carried(event.metadata) if event is not None else None
    if woken_by and woken_by != first:
        links.append(woken_by)
    return None, links


class Watch:
    """The telemetry of one segment: opened once its opening is known, closed
    when the runner is done with it (a recorded failure or refusal included)."""

    def __init__(self) -> None:
        self._began = time.perf_counter()
        self._opening: Opening | None = None
        self._fields: telemetry.run_fields | None = None
        self._scope: AbstractContextManager[telemetry.Span] | None = None
        self._span: telemetry.Span = telemetry.NO_SPAN
        self._workflow = ""
        #: Set by the runner when the database refused the segment.
        self.refused = False

    def __enter__(self) -> Self:
        return self

    def open(self, opening: Opening) -> None:
        self._opening = opening
        row = opening.row
        steps = opening.steps
        workflow = self._workflow = opening.workflow_name or (row.workflow if row else "")
        self._fields = telemetry.run_fields(opening.run_id, workflow, opening.tenant)
        self._fields.__enter__()
        if not (telemetry.tracing() or telemetry.measuring()):
            return
        wake = None if steps is None or opening.new else steps.wake.reason
        if telemetry.measuring() and row is not None and row.wake_at is not None:
            late = (clock.now() - row.wake_at).total_seconds()
            if late >= 0:
                reason = str(wake) if wake is not None else "unknown"
                telemetry.observe(telemetry.WAKE_LATENESS, late, workflow=workflow, reason=reason)
        if telemetry.tracing():
            parent, links = _context(opening)
            if steps is not None:
                version = steps.workflow.version
            else:
                version = row.workflow_version if row is not None else None
            self._scope = telemetry.span(
                "segment",
                parent=parent,
                links=links,
                run_id=opening.run_id,
                workflow=workflow,
                version=version or None,
                tenant=opening.tenant,
                wake=wake,
            )
            self._span = self._scope.__enter__()

    def done(self, run: WorkflowRun | None) -> WorkflowRun | None:
        """Report how the segment left the run; returns ``run``."""
        opening = self._opening
        if opening is None or not (telemetry.tracing() or telemetry.measuring()):
            return run
        outcome = self._outcome(opening, run)
        if outcome == "failed" and run is not None:
            self._span.fail(f"{run.reason}: {run.last_error}")
        self._span.set(outcome=outcome)
        workflow = self._workflow
        telemetry.count(telemetry.SEGMENTS, workflow=workflow, outcome=outcome)
        telemetry.observe(
            telemetry.SEGMENT_DURATION, time.perf_counter() - self._began, workflow=workflow
        )
        if run is not None and run.id == opening.run_id and telemetry.measuring():
            # Runs are counted once their transaction commits (an outer
            # transaction that rolls back started nothing).
            db.on_commit(_RunCounts(workflow, opening.new, run.status, run.reason))
        return run

    def _outcome(self, opening: Opening, run: WorkflowRun | None) -> str:
        if run is None or run.id != opening.run_id:
            return "skipped"  # another writer was first; a keyed start found its run
        if run.status == RunStatus.FAILED:
            return "failed"
        if self.refused:
            return "refused"
        if run.status == RunStatus.COMPLETED:
            return "completed"
        if run.status in _SUSPENDED:
            return "suspended"
        return "deferred"  # recorded to run later

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if error is not None and self._opening is not None:
            self._span.fail(error)
            self._span.set(outcome="error")
            telemetry.count(telemetry.SEGMENTS, workflow=self._workflow, outcome="error")
        try:
            if self._scope is not None:
                self._scope.__exit__(kind, error, traceback)
        finally:
            if self._fields is not None:
                self._fields.__exit__(kind, error, traceback)


class _RunCounts:
    """The run counters of a segment, counted after commit."""

    __slots__ = ("new", "reason", "status", "workflow")

    def __init__(self, workflow: str, new: bool, status: str, reason: str) -> None:
        self.workflow, self.new, self.status, self.reason = workflow, new, status, reason

    def __call__(self) -> Any:
        if self.new:
            telemetry.count(telemetry.RUNS_STARTED, workflow=self.workflow)
        if self.status == RunStatus.COMPLETED:
            telemetry.count(telemetry.RUNS_COMPLETED, workflow=self.workflow)
        elif self.status == RunStatus.FAILED:
            telemetry.count(telemetry.RUNS_FAILED, workflow=self.workflow, reason=self.reason)
