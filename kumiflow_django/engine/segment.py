"""Segments: a run advances from one suspension to the next in one transaction.

A :class:`Segment` is the change one segment makes: events on the run's
stream (folded into its row as they are added) and the dispatch streams its
steps opened. :func:`advance` runs the steps from the cursor and adds the
closing event (suspended, completed); :meth:`Segment.write` writes it all
through the one stream-write helper. The transaction around it is the
runner's (:mod:`kumiflow_django.engine.runner`).
"""

from __future__ import annotations

import contextvars
import json
import uuid
from dataclasses import dataclass
from typing import Any

from kumiflow_django.conf import settings
from kumiflow_django.definition.context import Context, RunInfo, Trigger, Wake
from kumiflow_django.definition.durations import isoformat
from kumiflow_django.definition.step import path_text
from kumiflow_django.definition.workflow import Workflow
from kumiflow_django.outbox.requests import opened
from kumiflow_django.projections.dispatches import DispatchStatus
from kumiflow_django.projections.runs import RUNS, WorkflowRun
from kumiflow_django.projections.stream import Change, write
from kumiflow_django.steps.control import EventWait, ReturnValue, StepError, Suspend, TimerWait
from kumiflow_django.steps.runner import run_steps
from kumiflow_django.store import clock
from kumiflow_django.store import names as ev
from kumiflow_django.store.db import is_transient
from kumiflow_django.store.errors import InvalidEvent
from kumiflow_django.store.models import Event
from kumiflow_django.store.telemetry import get_logger, log_fields
from kumiflow_django.store.values import clean_text, dump, to_json
from kumiflow_django.store.wakeups import WorkKind, work_committed

logger = get_logger("kumiflow_django.engine")

#: How deeply segments are nested in this thread (a step that appends an
#: event may start or wake another run inside the same transaction).
_depth: contextvars.ContextVar[int] = contextvars.ContextVar("kumiflow_depth", default=0)


def current_depth() -> int:
    return _depth.get()


@dataclass
class Failure(Exception):
    """A segment failed; the run ends failed with this reason and text."""

    reason: str
    error: str
    cursor: list[Any] | None = None
    trail: list[str] | None = None

    def __str__(self) -> str:
        return f"{self.reason}: {self.error}"

    def payload(self) -> dict[str, Any]:
        """The ``run-failed`` event's payload."""
        payload: dict[str, Any] = {
            "error": clean_text(self.error, 2000),
            "reason": self.reason,
            "trail": self.trail or [],
        }
        if self.cursor is not None:
            payload["cursor"] = self.cursor
        return payload


class Segment:
    """The events of one run's segment and the rows they become."""

    def __init__(self, run_id: uuid.UUID, tenant: str, run: WorkflowRun | None = None) -> None:
        self.run = Change(RUNS, str(run_id), tenant, run, now=clock.now())
        if run is not None:
            # A committed segment ends any worker's lease on the run.
            run.lease_owner, run.lease_until = "", None
        self.dispatches: list[Change[Any]] = []

    def add(self, type_: str, payload: dict[str, Any]) -> Event:
        return self.run.add(type_, payload)

    @property
    def row(self) -> WorkflowRun:
        return self.run.saved

    def add_effects(self, ctx: Context) -> None:
        """Open the dispatch streams of the outbox requests the steps made."""
        self.dispatches += opened(
            ctx.effects, tenant=ctx.tenant, run_id=ctx.run.id, now=self.run.now
        )

    def write(self) -> WorkflowRun:
        """Write the segment (events, run row, outbox rows) and announce its events."""
        write([self.run, *self.dispatches])
        if any(d.saved.status == DispatchStatus.PENDING for d in self.dispatches):
            work_committed(WorkKind.DISPATCH)
        return self.row


def run_info(run: WorkflowRun) -> RunInfo:
    return RunInfo(
        id=run.id,
        workflow=run.workflow,
        version=run.workflow_version or None,
        tenant=run.tenant_id,
        fingerprint=run.fingerprint,
    )


def advance(
    segment: Segment,
    workflow: Workflow,
    trigger: Trigger,
    *,
    cursor: list[Any] | None,
    state: dict[str, Any],
    wake: Wake,
) -> None:
    """Run the steps from ``cursor`` and add the closing event to the segment.

    Raises :class:`Failure` when a step fails (the runner rolls the segment
    back and records the failure).
    """
    run = segment.row
    ctx = Context(
        event=trigger,
        run=run_info(run),
        state=state,
        wake=wake,
        depth=_depth.get(),
        since_position=run.since_position,
        since_gaps=tuple(run.since_gaps or ()),
    )
    token = _depth.set(_depth.get() + 1)
    try:
        run_steps(workflow.steps, ctx, [], cursor)
    except Suspend as suspend:
        segment.add_effects(ctx)
        _suspend(segment, ctx, suspend)
        return
    except ReturnValue as returned:
        result = _result(returned.value, ctx)
        segment.add_effects(ctx)
        segment.add(ev.RUN_COMPLETED, {"result": result, "trail": _trail(ctx)})
        return
    except StepError as failure:
        if is_transient(failure.error):
            raise failure.error from failure
        logger.warning(
            "run %s: %s",
            run.id,
            failure.describe(),
            exc_info=(type(failure.error), failure.error, failure.error.__traceback__),
            extra=log_fields(step_path=failure.path),
        )
        raise Failure(
            ev.STEP_FAILED, clean_text(failure.describe(), 1000), failure.path, _trail(ctx)
        ) from failure
    finally:
        _depth.reset(token)
    segment.add_effects(ctx)
    segment.add(ev.RUN_COMPLETED, {"result": None, "trail": _trail(ctx)})


def _trail(ctx: Context) -> list[str]:
    return list(dict.fromkeys(ctx.trail))


def _result(value: Any, ctx: Context) -> Any:
    try:
        return to_json(value, "the run's result")
    except InvalidEvent as exc:
        raise Failure(
            ev.STEP_FAILED, f"TypeError at step return: {exc}", None, _trail(ctx)
        ) from exc


def _state(ctx: Context, suspend: Suspend) -> dict[str, Any]:
    """The run's state as JSON stores it, checked once as a whole (it is written
    twice: in the suspension event and in the row)."""
    try:
        text = dump(
            ctx.state,
            "the run's state",
            max_bytes=settings.MAX_STATE_BYTES,
            setting="KUMIFLOW_MAX_STATE_BYTES",
        )
    except InvalidEvent as exc:
        raise Failure(
            ev.STATE_TOO_LARGE,
            f"{exc} (step results are kept in the run's state; keep large data in your own tables)",
            suspend.cursor,
            _trail(ctx),
        ) from exc
    state: dict[str, Any] = json.loads(text)
    return state


def _suspend(segment: Segment, ctx: Context, suspend: Suspend) -> None:
    payload: dict[str, Any] = {
        "cursor": suspend.cursor,
        "state": _state(ctx, suspend),
        "trail": _trail(ctx),
    }
    wait = suspend.wait
    if isinstance(wait, TimerWait):
        segment.add(ev.STEP_WAITING, payload | {"wake_at": isoformat(wait.wake_at)})
    elif isinstance(wait, EventWait):
        segment.add(
            ev.STEP_WAITING_FOR_EVENT,
            payload
            | {
                "event_type": wait.event_type,
                "match": wait.match,
                "correlation_key": wait.correlation_key,
                "timeout_at": isoformat(wait.timeout_at) if wait.timeout_at else None,
                "after": wait.after,
            },
        )
    else:
        segment.add(
            ev.RETRY_SCHEDULED,
            payload
            | {
                "wake_at": isoformat(wait.wake_at),
                "attempt": wait.attempt,
                "max_attempts": wait.max_attempts,
                "error": wait.error,
            },
        )
    logger.debug(
        "run %s suspended (%s) at %s",
        ctx.run.id,
        type(wait).__name__,
        path_text(suspend.cursor),
        extra=log_fields(step_path=suspend.cursor),
    )
