"""Segments: a run advances from one suspension to the next in one transaction.

A :class:`Segment` is the change one segment makes: events on the run's
stream (folded into its row as they are added) and the dispatch streams its
steps opened. :func:`advance` runs the steps from the cursor and adds the
closing event (suspended, completed); :meth:`Segment.write` writes it all
through the one stream-write helper. The transaction around it is the
runner's (:mod:`kumiflow_django.engine.runner`).
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from kumiflow_django.conf import settings
from kumiflow_django.definition.attributes import merged
from kumiflow_django.definition.context import (
    AttributesUpdate,
    Cancellation,
    ChildRequest,
    Context,
    DispatchRequest,
    RunInfo,
    TaskRequest,
    Trigger,
    Wake,
    WakeReason,
    state_part,
)
from kumiflow_django.definition.durations import isoformat
from kumiflow_django.definition.step import path_text
from kumiflow_django.definition.workflow import Workflow
from kumiflow_django.engine import children, compensation
from kumiflow_django.engine.failure import Failure, capped_steps, capped_traceback
from kumiflow_django.engine.opening import segment_depth as _depth
from kumiflow_django.flow import admission
from kumiflow_django.outbox.requests import opened
from kumiflow_django.projections.dispatches import DispatchStatus
from kumiflow_django.projections.runs import FINISHED, RUNS, RunStatus, WorkflowRun
from kumiflow_django.projections.stream import Change, write
from kumiflow_django.projections.tasks import StepTask, TaskStatus
from kumiflow_django.projections.tasks import opened as open_tasks
from kumiflow_django.projections.waits import sync as sync_waits
from kumiflow_django.projections.waits import waits_events, waits_of
from kumiflow_django.steps.control import (
    BranchesWait,
    ChildWait,
    EventWait,
    ReturnValue,
    StepError,
    Suspend,
    TimerWait,
)
from kumiflow_django.steps.runner import run_steps
from kumiflow_django.store import clock, limits
from kumiflow_django.store import names as ev
from kumiflow_django.store import payloads as pl
from kumiflow_django.store.db import is_transient
from kumiflow_django.store.errors import InvalidEvent
from kumiflow_django.store.models import Event
from kumiflow_django.store.telemetry import get_logger, log_fields
from kumiflow_django.store.values import clean_text, dump, to_json
from kumiflow_django.store.wakeups import WorkKind, work_committed

logger = get_logger("kumiflow_django.engine")


#: The run events after which its ``RunWait`` rows are those the event names.
_WAITS_SET_BY = frozenset({ev.STEP_WAITING_FOR_EVENT, ev.STEP_WAITING_BRANCHES, ev.RUN_RETRIED})


class Segment:
    """The events of one run's segment and the rows they become."""

    def __init__(self, run_id: uuid.UUID, tenant: str, run: WorkflowRun | None = None) -> None:
        self.run = Change(RUNS, str(run_id), tenant, run, now=clock.now())
        if run is not None:
            # A committed segment ends any worker's lease on the run.
            run.lease_owner, run.lease_until = "", None
        self.dispatches: list[Change[Any]] = []
        self.tasks: list[Change[StepTask]] = []
        self.cancellations: list[Cancellation] = []
        self.had_waits = run is not None and waits_events(run)
        self.was_finished = run is not None and run.status in FINISHED
        #: Its end frees a slot of its key (a new run's: if it was admitted).
        self.held_slot = run is None or admission.holds_slot(run)

    def add(self, type_: str, payload: pl.Payload, *, created_by: str = "") -> Event:
        return self.run.add(type_, payload, created_by=created_by)

    @property
    def row(self) -> WorkflowRun:
        return self.run.saved

    def add_effects(self, ctx: Context, start_child: children.Starter) -> None:
        """Open the streams of what the steps asked for: outbox requests, tasks,
        child runs; keep what cancelled branches left for after the write."""
        if not ctx.effects:
            return
        tenant, run_id, now = ctx.tenant, ctx.run.id, self.run.now
        requests = [e for e in ctx.effects if isinstance(e, DispatchRequest)]
        tasks = [e for e in ctx.effects if isinstance(e, TaskRequest)]
        self.dispatches += opened(requests, tenant=tenant, run_id=run_id, now=now)
        self.tasks += open_tasks(
            tasks, tenant=tenant, run_id=run_id, now=now, workflow=ctx.run.workflow
        )
        kids = [e for e in ctx.effects if isinstance(e, ChildRequest)]
        if kids:
            try:
                settled = children.started(kids, self.row, start=start_child)
            except children.ChildStartRefused as exc:
                raise Failure(ev.CHILD_FAILED_REASON, str(exc), None, _trail(ctx)) from exc
            if settled:  # keyed children that had ended already: their outcomes
                state_part(ctx.state, "settled").update(settled)
        self.cancellations += [e for e in ctx.effects if isinstance(e, Cancellation)]
        for update in (e for e in ctx.effects if isinstance(e, AttributesUpdate)):
            after = merged(self.row.attributes or {}, update.attributes)
            if len(after) > limits.ATTRIBUTES_PER_RUN:
                raise Failure(
                    ev.STEP_FAILED,
                    f"step {update.step} (set_attributes): a run carries at most "
                    f"{limits.ATTRIBUTES_PER_RUN} search attributes ({len(after)})",
                    None,
                    _trail(ctx),
                )
            self.add(ev.RUN_ATTRIBUTES_SET, {"attributes": update.attributes, "step": update.step})

    def write(self) -> WorkflowRun:
        """Write the segment (events, run row, outbox, task and child rows) and
        announce its events; after commit, the loops learn of the new work."""
        row = self.row  # folded already: what the write makes of it
        ended = row.status in FINISHED and not self.was_finished
        last = self.run.events[-1] if self.run.events else None
        waits = waits_events(row)
        if not ended and last is not None and (self.had_waits or waits):
            # Before the write: its events are announced as it ends, and one of
            # them (a task that fails at once) may be what the new wait awaits.
            if last.type in _WAITS_SET_BY:
                sync_waits(row.id, row.tenant_id, waits_of(last), had=self.had_waits)
            elif not waits:  # it no longer waits for an event
                sync_waits(row.id, row.tenant_id, [], had=True)
            # else: still waiting there (an event matched, a child ended): as it was
        write([self.run, *self.dispatches, *self.tasks])
        if self.cancellations:
            children.cancel(row, self.cancellations)
        # A run admitted in this segment is counted from its row now; whether
        # nothing parked behind its key meanwhile (flow/admission.py).
        quiet = admission.written(row.id)
        cancelled = row.status == RunStatus.CANCELLED or (
            (row.state or {}).get("compensating", {}).get("then") == "cancelled"
        )
        if ended:
            # A new run that ended in its first segment with nothing parked
            # behind its key meanwhile frees no slot anyone waits for; a run
            # parked behind its key held none.
            release = self.held_slot and not (self.run.new and quiet)
            children.ended(row, had_waits=self.had_waits, cancelled=cancelled, release=release)
        elif last is not None and last.type == ev.COMPENSATION_STARTED:
            children.after_end(row, cancelled=cancelled)
        if any(d.saved.status == DispatchStatus.PENDING for d in self.dispatches):
            work_committed(WorkKind.DISPATCH)
        for change in self.tasks:
            task = change.saved
            if task.status == TaskStatus.PENDING:
                # A backend's task is handed to it after commit; the pool's wakes the loop.
                item = task.id if task.backend else None
                work_committed(WorkKind.TASK, run_id=task.run_id, item=item)
        return row


def run_info(run: WorkflowRun) -> RunInfo:
    return RunInfo(
        id=run.id,
        workflow=run.workflow,
        version=run.workflow_version or None,
        tenant=run.tenant_id,
        fingerprint=run.fingerprint,
        started_version=run.started_version or None,
    )


def advance(
    segment: Segment,
    workflow: Workflow,
    trigger: Trigger,
    *,
    cursor: list[Any] | None,
    state: dict[str, Any],
    wake: Wake,
    start_child: children.Starter,
) -> None:
    """Run the steps from ``cursor`` and add the closing event to the segment.

    ``start_child`` runs the first segment of a child run whose workflow
    starts inline, in this transaction (the runner's).

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
    compensating = compensation.active(cursor)
    # A start with a cursor is a restart (engine.restart): its step runs anew.
    ctx.fresh = wake.reason == WakeReason.START and cursor is not None and not compensating
    try:
        if compensating:
            compensation.run(workflow, ctx, cursor or [])
        else:
            run_steps(workflow.steps, ctx, [], cursor)
    except Suspend as suspend:
        state.pop("woken", None)
        segment.add_effects(ctx, start_child)
        _suspend(segment, ctx, suspend)
        return
    except ReturnValue as returned:
        result = _result(returned.value, ctx)
        segment.add_effects(ctx, start_child)
        segment.add(ev.RUN_COMPLETED, _completed(result, ctx))
        return
    except StepError as failure:
        state.pop("woken", None)
        if is_transient(failure.error):
            raise failure.error from failure
        logger.warning(
            "run %s: %s",
            run.id,
            failure.describe(),
            exc_info=(type(failure.error), failure.error, failure.error.__traceback__),
            extra=log_fields(step_path=failure.path),
        )
        # An error may name its own reason (a task step's task that failed for good).
        reason = getattr(failure.error, "run_failure_reason", ev.STEP_FAILED)
        if compensating:  # a compensation failed: the run ends failed, saying so
            error = failure.describe()
            raise compensation.failed(state, error, failure.path, _trail(ctx)) from failure
        raise Failure(
            reason,
            clean_text(failure.describe(), 1000),
            failure.path,
            _trail(ctx),
            compensable=True,
            traceback=capped_traceback(failure.error),
            steps=capped_steps(ctx.steps),
            durations=ctx.durations,
        ) from failure
    finally:
        _depth.reset(token)
    state.pop("woken", None)
    segment.add_effects(ctx, start_child)
    if compensating:
        segment.add(*compensation.ended(state, _trail(ctx)))
        return
    segment.add(ev.RUN_COMPLETED, _completed(None, ctx))


def _completed(result: Any, ctx: Context) -> pl.RunCompleted:
    """The ``run-completed`` payload: the result, and for the console the steps
    run, their results (capped) and how long they took."""
    payload: pl.RunCompleted = {"result": result, "trail": _trail(ctx)}
    if ctx.steps:
        payload["steps"] = capped_steps(ctx.steps)
    if ctx.durations:
        payload["durations"] = ctx.durations
    return payload


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


def _iso(when: datetime | None) -> str | None:
    return isoformat(when) if when is not None else None


def _branch_wait(branch: str, wait: EventWait) -> pl.BranchWait:
    """One event a branch awaits, as the run's ``RunWait`` rows index it."""
    return {
        "branch": branch[: limits.STEP_PATH],
        "event_type": wait.event_type,
        "correlation_key": wait.correlation_key,
        "match": wait.match,
        "after": wait.after,
        **_gaps(wait),
    }


def _gaps(wait: EventWait) -> pl.Gaps:
    """A wait's gaps, only when it has any list (an empty one too)."""
    return {"gaps": list(wait.gaps)} if wait.gaps is not None else {}


def _suspend(segment: Segment, ctx: Context, suspend: Suspend) -> None:
    payload: pl.Suspended = {
        "cursor": suspend.cursor,
        "state": _state(ctx, suspend),
        "trail": _trail(ctx),
    }
    if ctx.durations:
        payload["durations"] = ctx.durations
    wait = suspend.wait
    if isinstance(wait, ChildWait | BranchesWait):
        awaited = [wait.child_id] if isinstance(wait, ChildWait) else list(wait.children)
        settled = payload["state"].get("settled") or {}
        # A child that ended already (a keyed one): the run goes on at once.
        due = ctx.now if any(child in settled for child in awaited) else None
        if isinstance(wait, ChildWait):
            for_child: pl.StepWaitingForChild = {
                **payload,
                "child_id": wait.child_id,
                "wake_at": _iso(due),
            }
            segment.add(ev.STEP_WAITING_FOR_CHILD, for_child)
        else:
            when = (
                min(w for w in (wait.wake_at, due) if w is not None)
                if (wait.wake_at or due)
                else None
            )
            branches: pl.StepWaitingBranches = {
                **payload,
                "wake_at": _iso(when),
                "waits": [_branch_wait(branch, w) for branch, w in wait.events],
                "children": awaited,
            }
            segment.add(ev.STEP_WAITING_BRANCHES, branches)
    elif isinstance(wait, TimerWait):
        timer: pl.StepWaiting = {**payload, "wake_at": isoformat(wait.wake_at)}
        segment.add(ev.STEP_WAITING, timer)
    elif isinstance(wait, EventWait):
        for_event: pl.StepWaitingForEvent = {
            **payload,
            "event_type": wait.event_type,
            "match": wait.match,
            "correlation_key": wait.correlation_key,
            "timeout_at": isoformat(wait.timeout_at) if wait.timeout_at else None,
            "after": wait.after,
            **_gaps(wait),
        }
        segment.add(ev.STEP_WAITING_FOR_EVENT, for_event)
    else:
        retry: pl.RetryScheduled = {
            **payload,
            "wake_at": isoformat(wait.wake_at),
            "attempt": wait.attempt,
            "max_attempts": wait.max_attempts,
            "error": wait.error,
        }
        segment.add(ev.RETRY_SCHEDULED, retry)
    logger.debug(
        "run %s suspended (%s) at %s",
        ctx.run.id,
        type(wait).__name__,
        path_text(suspend.cursor),
        extra=log_fields(step_path=suspend.cursor),
    )
