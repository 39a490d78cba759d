"""Segments: a run advances from one suspension to the next in one transaction.

A :class:`Segment` runs the steps of one run from a cursor, collects the
events it produces (the run's own and the outbox's) in memory, applies
them to the run row with the projection's reducer, and writes everything
at the end: one bulk insert of events, one write of the run row, one of the
outbox rows. Then ``event_appended`` is sent for each event.
"""

from __future__ import annotations

import contextvars
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from kumiflow_django import clock, eventstore, outbox, rowsql, runs
from kumiflow_django import run_events as ev
from kumiflow_django.conf import settings
from kumiflow_django.context import (
    Context,
    ReturnValue,
    RunInfo,
    StepError,
    Suspend,
    Wake,
    path_text,
)
from kumiflow_django.dberrors import is_transient
from kumiflow_django.definition import Workflow
from kumiflow_django.durations import isoformat
from kumiflow_django.exceptions import InvalidEvent
from kumiflow_django.jsonvalues import clean_text, dump, to_json
from kumiflow_django.models.dispatch import Dispatch
from kumiflow_django.models.event import Event
from kumiflow_django.models.run import WorkflowRun
from kumiflow_django.steps.base import run_steps

logger = logging.getLogger("kumiflow_django.engine")

#: How deeply segments are nested in this thread (a step that appends an
#: event may start or wake another run inside the same transaction).
_depth: contextvars.ContextVar[int] = contextvars.ContextVar("kumiflow_depth", default=0)


def current_depth() -> int:
    return _depth.get()


class Conflict(Exception):
    """The run moved on since it was read: another worker got there first."""


@dataclass
class Failure(Exception):
    """A segment failed; the run ends failed with this reason and text."""

    reason: str
    error: str
    cursor: list[Any] | None = None
    trail: list[str] | None = None

    def __str__(self) -> str:
        return f"{self.reason}: {self.error}"


class Segment:
    """The events of one run's segment and the rows they become."""

    def __init__(self, run_id: uuid.UUID, tenant: str, run: WorkflowRun | None = None) -> None:
        self.run_id = run_id
        self.run = run
        self.tenant = tenant
        self.new = run is None
        self.before = None if run is None else rowsql.snapshot(run)
        if run is not None:
            # A committed segment ends any worker's lease on the run.
            run.lease_owner, run.lease_until = "", None
        self.base_version = 0 if run is None else run.version
        self.events: list[Event] = []
        self.dispatches: list[Dispatch] = []
        self.now = clock.now()

    def add(self, type_: str, payload: dict[str, Any]) -> Event:
        version = (self.run.version if self.run is not None else 0) + 1
        event = Event(
            tenant_id=self.tenant,
            stream_type=ev.RUN_STREAM,
            stream_id=str(self.run_id),
            version=version,
            type=type_,
            payload=payload,
            metadata={},
            created_at=self.now,
        )
        self.run = runs.apply(self.run, event)
        self.events.append(event)
        return event

    def add_effects(self, ctx: Context) -> None:
        for kind, effect in ctx.effects:
            if kind != "dispatch":  # pragma: no cover - only kind so far
                raise ValueError(f"unknown effect {kind!r}")
            dispatch: Dispatch | None = None
            for event in outbox.requested_events(effect, ctx, self.now):
                dispatch = outbox.apply(dispatch, event)
                self.events.append(event)
            assert dispatch is not None
            self.dispatches.append(dispatch)

    def persist(self) -> WorkflowRun:
        """Write the segment: events, run row, outbox rows; then announce the events."""
        assert self.run is not None
        eventstore.insert(self.events)
        if self.new:
            rowsql.insert(WorkflowRun, [self.run], using=DEFAULT_DB_ALIAS, return_pk=False)
        else:
            assert self.before is not None
            where = {"id": self.run.pk, "version": self.base_version}
            if not rowsql.update_changed(
                self.run, self.before, where=where, using=DEFAULT_DB_ALIAS
            ):
                raise Conflict(f"run {self.run.pk} is no longer at version {self.base_version}")
        if self.dispatches:
            Dispatch.objects.bulk_create(self.dispatches)
        eventstore.notify(self.events)
        if any(d.status == "pending" for d in self.dispatches):
            from kumiflow_django import wakeups

            wakeups.work_committed("dispatch")
        return self.run


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
    trigger: Any,
    *,
    cursor: list[Any] | None,
    state: dict[str, Any],
    wake: Wake,
) -> None:
    """Run the steps from ``cursor`` and add the closing event to the segment.

    Raises :class:`Failure` when a step fails (the caller rolls the
    segment's savepoint back and records the failure).
    """
    run = segment.run
    assert run is not None
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


def _suspend(segment: Segment, ctx: Context, suspend: Suspend) -> None:
    info = suspend.info
    try:
        # The state is written twice (event and row): check it once, as a whole.
        text = dump(
            ctx.state,
            "the run's state",
            max_bytes=settings.MAX_STATE_BYTES,
            setting="KUMIFLOW_MAX_STATE_BYTES",
        )
        state = json.loads(text)
    except InvalidEvent as exc:
        raise Failure(
            ev.STATE_TOO_LARGE,
            f"{exc} (step results are kept in the run's state; keep large data in your own tables)",
            suspend.cursor,
            _trail(ctx),
        ) from exc
    payload: dict[str, Any] = {"cursor": suspend.cursor, "state": state, "trail": _trail(ctx)}
    if suspend.kind == "timer":
        segment.add(ev.STEP_WAITING, payload | {"wake_at": isoformat(info["wake_at"])})
    elif suspend.kind == "event":
        timeout_at = info.get("timeout_at")
        segment.add(
            ev.STEP_WAITING_FOR_EVENT,
            payload
            | {
                "event_type": info["event_type"],
                "match": info["match"],
                "correlation_key": info["correlation_key"],
                "timeout_at": isoformat(timeout_at) if timeout_at else None,
                "after": info["after"],
            },
        )
    else:
        segment.add(
            ev.RETRY_SCHEDULED,
            payload
            | {
                "wake_at": isoformat(info["wake_at"]),
                "attempt": info["attempt"],
                "max_attempts": info["max_attempts"],
                "error": info["error"],
            },
        )
    logger.debug("run %s suspended (%s) at %s", ctx.run.id, suspend.kind, path_text(suspend.cursor))
