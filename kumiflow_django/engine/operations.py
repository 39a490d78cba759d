"""Operating runs: cancel, retry, wake, pause, resume and fail; pausing a
workflow or a tenant. The admin and the HTTP API call these, nothing else.

Whether an operation applies to a run is said once, by its ``refuse_*``
function (the reason it does not apply, or None): the operation asks it
under the run's lock before it acts, the admin asks it to decide what to
offer, and the HTTP API answers with the operation's refusal.

Each appends one event to the run's stream at its current version (the row
is locked first, so an operation waits for a segment in flight) and updates
the run row through the projection, like every other change of a run. The
operator (``by``) and the ``reason`` are stored in that event's payload, and
``by`` as its ``created_by``: the log says who did what and why. An
operation that loses a deadlock runs again (``db.retrying``), or answers
:class:`~kumiflow_django.store.errors.OperationConflict`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from django.db import IntegrityError

from kumiflow_django.conf import settings
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.snapshots import remember
from kumiflow_django.engine import children, compensation, resuming
from kumiflow_django.engine.failure import Failure
from kumiflow_django.engine.restore import retry_point
from kumiflow_django.engine.segment import Segment
from kumiflow_django.flow import admission
from kumiflow_django.flow.admission import Item
from kumiflow_django.projections import lock_order, pauses
from kumiflow_django.projections.pauses import PausedScope, ScopeKind
from kumiflow_django.projections.runs import (
    FINISHED,
    Compensation,
    RunStatus,
    WorkflowRun,
)
from kumiflow_django.projections.tasks import StepTask, TaskStatus
from kumiflow_django.projections.tasks import append as append_task
from kumiflow_django.store import clock, db, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store.audit import audited, check_operator
from kumiflow_django.store.db import for_update
from kumiflow_django.store.errors import (
    InvalidEvent,
    InvalidPauseState,
    InvalidRunState,
    Refusal,
    RunNotFound,
    UnknownWorkflow,
    raise_refusal,
)
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.wakeups import WorkKind, work_committed

logger = get_logger("kumiflow_django.engine.operations")

WAKEABLE = (RunStatus.WAITING, RunStatus.WAITING_EVENT, RunStatus.RETRY_SCHEDULED)


def _lock(run_id: uuid.UUID | str, tenant: str | None) -> WorkflowRun:
    try:
        pk = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    except ValueError:
        raise RunNotFound(f"{run_id!r} is not a run id") from None
    run = lock_order.lock_run(pk, tenant=tenant)  # in the lock order: its waiting parent first
    if run is None:
        raise RunNotFound(f"no run {run_id}" + (f" in tenant {tenant!r}" if tenant else ""))
    return run


def refuse_cancel(run: WorkflowRun) -> str | None:
    """Why :func:`cancel_run` does not apply to ``run`` (None: it does)."""
    if run.status in FINISHED:
        return f"the run is {run.status}: only unfinished runs are cancelled"
    return None


def refuse_wake(run: WorkflowRun) -> str | None:
    """Why :func:`wake_run` does not apply to ``run`` (None: it does)."""
    if run.paused:
        return "the run is paused: resume it first"
    if run.status not in WAKEABLE:
        return f"the run is {run.status}, not waiting: only waiting runs are woken"
    return None


def refuse_retry(
    run: WorkflowRun,
    *,
    adopt_current_definition: bool = False,
    point: dict[str, Any] | None = None,
) -> str | None:
    """Why :func:`retry_run` does not apply to ``run`` (None: it does); ``point``
    is the run's :func:`retry_point`, when the caller has it already."""
    if run.status != RunStatus.FAILED:
        return f"the run is {run.status}, not failed: only failed runs are retried"
    if run.compensation == Compensation.COMPENSATED:
        return "the run was compensated: its completed steps were undone; start a new run"
    if not adopt_current_definition:
        return None
    if not registry.is_registered(run.workflow):
        return Refusal(f"no workflow {run.workflow!r} is registered", UnknownWorkflow)
    cursor = (point or retry_point(run))["cursor"]
    if cursor is not None:
        try:
            registry.get(run.workflow).step_at(cursor)
        except ValueError:
            return (
                f"the current definition of {run.workflow!r} has no step "
                f"{'.'.join(map(str, cursor))}, where the run would continue"
            )
    return None


@contextmanager
def _operation(
    run_id: uuid.UUID | str, tenant: str | None, refuse: Callable[[WorkflowRun], str | None]
) -> Iterator[WorkflowRun]:
    """An operation's transaction: the run locked first, and the operation
    refused (:class:`InvalidRunState`) unless ``refuse`` says it applies."""
    with db.atomic():
        run = _lock(run_id, tenant)
        raise_refusal(refuse(run), InvalidRunState, f"run {run.id}")
        yield run


def _append(run: WorkflowRun, type_: str, payload: dict[str, Any], by: str = "") -> WorkflowRun:
    segment = Segment(run.id, run.tenant_id, run)
    segment.add(type_, payload, created_by=by)
    return segment.write()


def _operate(
    run: WorkflowRun, type_: str, payload: dict[str, Any], *, by: str, reason: str
) -> WorkflowRun:
    """Append an operation's event with who did it and why (``audited``: in
    its payload, and ``by`` as its ``created_by``)."""
    return _append(run, type_, audited(payload, by, reason), by)


def _log(subject: WorkflowRun | str, done: str, *, by: str, reason: str) -> None:
    """The one log line of an operation (on a run, or on ``subject`` named),
    once its transaction is over: what was done, by whom and why."""
    run = subject if isinstance(subject, WorkflowRun) else None
    logger.info(
        "%s %s by %s (%s)",
        f"run {run.id}" if run is not None else subject,
        done,
        by or "code",
        reason or "no reason given",
        extra=telemetry.run_log_fields(run) if run is not None else None,
    )


@db.retrying
def cancel_run(
    run_id: uuid.UUID | str,
    *,
    reason: str = "",
    tenant: str | None = None,
    compensate: bool = False,
    by: str = "",
) -> WorkflowRun:
    """Stop a run that has not finished. Its outbox requests not delivered yet,
    its tasks that have not settled and its child runs (but those started with
    ``on_parent_cancel="abandon"``) are cancelled with it, to the last level.

    With ``compensate=True`` a run with completed compensable steps runs their
    compensations first (as steps of the run, on the resume loop), then ends
    cancelled.
    """
    by, reason = check_operator(by, reason)
    with _operation(run_id, tenant, refuse_cancel) as run:
        text = reason or "cancelled"
        # Its tree before its flow key: the end releases the key, then cancels the children.
        children.lock_subtree(run, cancelled=True)
        if compensate and not compensation.active(run.cursor) and compensation.pending(run.state):
            type_, started = compensation.begin(
                run, then="cancelled", reason="cancelled", error=text
            )
            updated = _operate(run, type_, dict(started), by=by, reason="")
            work_committed(WorkKind.RESUME, updated.wake_at, updated.id)
            _log(run, "compensating before it is cancelled", by=by, reason=text)
            return updated
        payload: dict[str, Any] = {}
        if compensation.active(run.cursor):  # cancelled while compensating
            payload["compensation"] = Compensation.FAILED
        updated = _operate(run, ev.RUN_CANCELLED, payload, by=by, reason=text)
        if telemetry.measuring():
            db.on_commit(partial(telemetry.count, telemetry.RUNS_CANCELLED, workflow=run.workflow))
    _log(run, "cancelled", by=by, reason=reason)
    return updated


@db.retrying
def wake_run(
    run_id: uuid.UUID | str, *, tenant: str | None = None, by: str = "", reason: str = ""
) -> WorkflowRun:
    """Make a waiting run due now: a timer ends early, a wait for an event
    times out now (the step takes its timeout path), a scheduled retry runs now."""
    by, reason = check_operator(by, reason)
    with _operation(run_id, tenant, refuse_wake) as run:
        updated = _operate(run, ev.RUN_WOKEN, {}, by=by, reason=reason)
        work_committed(WorkKind.RESUME, updated.wake_at, updated.id)
    _log(run, "woken", by=by, reason=reason)
    return updated


def _retry_task(run: WorkflowRun, restore: dict[str, Any]) -> StepTask | None:
    """When the run failed because its task failed for good: reopen that task
    (``task.retried``: its retry policy starts over) and make the run wait for
    its new outcome, after the failure it saw. Returns the reopened task."""
    awaited = restore.get("awaited") or {}
    if run.reason != ev.TASK_FAILED_REASON or awaited.get("event_type") != ev.TASK_SETTLED:
        return None
    task_id = (awaited.get("match") or {}).get("stream_id")
    if not isinstance(task_id, str):
        return None
    task = for_update(StepTask.objects.filter(pk=task_id, run_id=run.id)).first()
    if task is None or task.status != TaskStatus.FAILED:
        return None
    failed_at = restore.pop("matched_position", None)
    if failed_at is not None:
        awaited["after"] = max(int(awaited.get("after") or 0), int(failed_at))
    restore["wait"] = True  # for the task's outcome, not due now
    return append_task(task, ev.TASK_RETRIED, {"run_id": str(run.id)})


@db.retrying
def retry_run(
    run_id: uuid.UUID | str,
    *,
    adopt_current_definition: bool = False,
    tenant: str | None = None,
    by: str = "",
    reason: str = "",
) -> WorkflowRun:
    """Run a failed run's failed segment again, from the suspension it began at.

    The failed segment was rolled back as a whole, so nothing of it is
    repeated twice. A run whose task failed for good runs that task again, with
    the same idempotency key and a fresh retry policy.

    ``adopt_current_definition=True`` moves the run onto the workflow's
    current definition first (after a ``workflow_definition_changed`` failure,
    when the new definition still fits the run's position).
    """
    by, reason = check_operator(by, reason)
    with _operation(run_id, tenant, refuse_retry) as run:
        payload: dict[str, Any] = {"restore": retry_point(run)}
        if adopt_current_definition:
            refusal = refuse_retry(run, adopt_current_definition=True, point=payload["restore"])
            raise_refusal(refusal, InvalidRunState, f"run {run.id}")
        task = _retry_task(run, payload["restore"])
        if adopt_current_definition:
            current = registry.get(run.workflow)
            payload["fingerprint"] = current.fingerprint
            payload["version"] = current.version
            remember(current)
        # It takes its slot at once (an operator's decision), and like every
        # active run its key has its row (flow control's count relies on it).
        admission.take(Item.run(run))
        updated = _operate(run, ev.RUN_RETRIED, payload, by=by, reason=reason)
        if task is not None:
            work_committed(WorkKind.TASK, None, run.id, task.id if task.backend else None)
        else:
            work_committed(WorkKind.RESUME, updated.wake_at, updated.id)
    _log(run, f"retried from {payload['restore']['cursor']}", by=by, reason=reason)
    return updated


# -- pause, resume, fail -------------------------------------------------------


def refuse_pause(run: WorkflowRun) -> str | None:
    """Why :func:`pause_run` does not apply to ``run`` (None: it does)."""
    if run.status in FINISHED:
        return f"the run is {run.status}: only unfinished runs are paused"
    if run.paused:
        return "the run is paused already"
    return None


def refuse_resume(run: WorkflowRun) -> str | None:
    """Why :func:`resume_run` does not apply to ``run`` (None: it does)."""
    if not run.paused:
        return f"the run is {run.status}, not paused: only paused runs are resumed"
    return None


def refuse_fail(run: WorkflowRun) -> str | None:
    """Why :func:`fail_run` does not apply to ``run`` (None: it does)."""
    if run.status in FINISHED:
        return f"the run is {run.status}: only unfinished runs are failed"
    if compensation.active(run.cursor):
        return "the run is compensating: cancel it to stop its compensations"
    return None


@db.retrying
def pause_run(
    run_id: uuid.UUID | str, *, reason: str = "", by: str = "", tenant: str | None = None
) -> WorkflowRun:
    """Pause a run that has not finished: no worker claims it until
    :func:`resume_run`. Its status stays; events that match its wait are still
    recorded, and its timers still come due: it takes them once resumed.

    The run's row is locked first: a segment in flight finishes (the pause
    takes effect at the run's next suspension). Its tasks already requested
    and its deliveries go on; their outcomes wait for the resume too.
    """
    by, reason = check_operator(by, reason)
    with _operation(run_id, tenant, refuse_pause) as run:
        updated = _operate(run, ev.RUN_PAUSED, {}, by=by, reason=reason)
    _log(run, "paused", by=by, reason=reason)
    return updated


@db.retrying
def resume_run(
    run_id: uuid.UUID | str, *, reason: str = "", by: str = "", tenant: str | None = None
) -> WorkflowRun:
    """Resume a paused run: it is claimed again when due (at once, if its timer
    came or its event was matched while it was paused).

    A run paused because its step's retries ran out (``on_exhausted="pause"``)
    continues at that step with its whole retry policy again; a task that
    failed for good runs again (as :func:`retry_run` does it). A run whose
    workflow or tenant is paused as well waits for that pause to end.
    """
    by, reason = check_operator(by, reason)
    with _operation(run_id, tenant, refuse_resume) as run:
        payload: dict[str, Any] = {}
        task = None
        if run.reason == ev.TASK_FAILED_REASON:  # paused on a task that failed for good
            restore = retry_point(run)
            task = _retry_task(run, restore)
            if task is not None:
                restore["attempt"] = 1
                payload["restore"] = restore
        updated = _operate(run, ev.RUN_RESUMED, payload, by=by, reason=reason)
        if task is not None:
            work_committed(WorkKind.TASK, None, run.id, task.id if task.backend else None)
        elif updated.wake_at is not None:
            work_committed(WorkKind.RESUME, updated.wake_at, updated.id)
        # An event that came while it was paused, in a race with the pause: found now.
        if updated.status == RunStatus.WAITING_EVENT or updated.branch_waits:
            resuming.look_back_after_commit(updated)
    _log(run, "resumed", by=by, reason=reason)
    return updated


@db.retrying
def fail_run(
    run_id: uuid.UUID | str, *, reason: str = "", by: str = "", tenant: str | None = None
) -> WorkflowRun:
    """End a run that has not finished as failed (reason ``failed_by_operator``),
    paused or not: a run paused on exhausted retries that will not be fixed.

    It ends like a run whose step failed, through the one end of a run: with
    completed compensable steps it compensates first (then ends failed,
    ``compensated``); its open tasks and the children it waits for are
    cancelled. A failed run can be retried (:func:`retry_run`).
    """
    by, reason = check_operator(by, reason)
    with _operation(run_id, tenant, refuse_fail) as run:
        text = reason or "failed by an operator"
        failure = Failure(
            ev.FAILED_BY_OPERATOR, text, run.cursor, list(run.trail), compensable=True
        )
        children.lock_subtree(run, cancelled=False)
        started = compensation.start(run, failure)
        if started is not None:
            type_, payload = started
            updated = _operate(run, type_, dict(payload), by=by, reason="")
            work_committed(WorkKind.RESUME, updated.wake_at, updated.id)
        else:
            updated = _operate(run, ev.RUN_FAILED, dict(failure.payload()), by=by, reason="")
    _log(run, "failed", by=by, reason=reason)
    return updated


# -- pausing a workflow or a tenant ----------------------------------------------


def _scope(kind: str, name: object) -> PausedScope | None:
    if not isinstance(name, str) or not name.strip():
        raise InvalidEvent(f"a {kind} name is a non-empty string, not {name!r:.60}")
    return for_update(PausedScope.objects.filter(pk=pauses.stream_id(kind, name))).first()


def refuse_pause_scope(scope: PausedScope | None) -> str | None:
    """Why a workflow or a tenant cannot be paused (None: it can)."""
    if scope is not None and scope.paused:
        return f"the {scope.kind} {scope.name!r} is paused already"
    return None


def refuse_resume_scope(scope: PausedScope | None) -> str | None:
    """Why a workflow or a tenant cannot be resumed (None: it can)."""
    if scope is None or not scope.paused:
        return "it is not paused"
    return None


def _pause_scope(kind: str, name: str, *, reason: str, by: str, pause: bool) -> PausedScope:
    by, reason = check_operator(by, reason)
    for attempt in (1, 2):  # two first pauses of one scope: the second finds the row
        try:
            with db.atomic():
                scope = _scope(kind, name)
                refuse = refuse_pause_scope if pause else refuse_resume_scope
                raise_refusal(refuse(scope), InvalidPauseState, f"{kind} {name!r}")
                tenant = name if kind == ScopeKind.TENANT else settings.DEFAULT_TENANT
                if pause:
                    payload: dict[str, Any] = audited({"kind": kind, "name": name}, by, reason)
                    type_ = ev.SCOPE_PAUSED
                else:
                    payload, type_ = audited({}, by, reason), ev.SCOPE_RESUMED
                saved = pauses.append(scope, kind, name, tenant, type_, payload, created_by=by)
                pauses.forget_scopes()  # this process's starts see it at once
                db.on_commit(pauses.forget_scopes)
                if not pause:  # its due runs are claimed again: tell the resume loop
                    work_committed(WorkKind.RESUME, clock.now())
        except IntegrityError:
            if attempt == 2:
                raise
            continue
        _log(f"{kind} {name}", "paused" if pause else "resumed", by=by, reason=reason)
        return saved
    raise AssertionError("unreachable")  # pragma: no cover


@db.retrying
def pause_workflow(name: str, *, reason: str = "", by: str = "") -> PausedScope:
    """Pause a workflow: no worker claims its runs (in every tenant) until
    :func:`resume_workflow`. New starts are recorded and wait (an inline
    start is recorded deferred); segments in flight finish."""
    return _pause_scope(ScopeKind.WORKFLOW, name, reason=reason, by=by, pause=True)


@db.retrying
def resume_workflow(name: str, *, reason: str = "", by: str = "") -> PausedScope:
    """Resume a paused workflow: its due runs are claimed again."""
    return _pause_scope(ScopeKind.WORKFLOW, name, reason=reason, by=by, pause=False)


@db.retrying
def pause_tenant(tenant_id: str, *, reason: str = "", by: str = "") -> PausedScope:
    """Pause a tenant: no worker claims its runs (of every workflow) until
    :func:`resume_tenant`; starts are recorded and wait."""
    return _pause_scope(ScopeKind.TENANT, tenant_id, reason=reason, by=by, pause=True)


@db.retrying
def resume_tenant(tenant_id: str, *, reason: str = "", by: str = "") -> PausedScope:
    """Resume a paused tenant: its due runs are claimed again."""
    return _pause_scope(ScopeKind.TENANT, tenant_id, reason=reason, by=by, pause=False)
