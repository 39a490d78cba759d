"""Operating runs: cancel, retry and wake. The admin calls these, nothing else.

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
from functools import partial
from typing import Any

from kumiflow_django.definition.context import new_state
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.snapshots import remember
from kumiflow_django.engine import children, compensation
from kumiflow_django.engine.segment import Segment
from kumiflow_django.flow.admission import lock_key
from kumiflow_django.flow.gates import RUNS as RUNS_GATE
from kumiflow_django.projections import lock_order
from kumiflow_django.projections.runs import (
    COMPENSATE,
    FINISHED,
    Compensation,
    RunStatus,
    WorkflowRun,
)
from kumiflow_django.projections.tasks import StepTask, TaskStatus
from kumiflow_django.projections.tasks import append as append_task
from kumiflow_django.store import db, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store.audit import audited, check_operator
from kumiflow_django.store.db import for_update
from kumiflow_django.store.errors import (
    InvalidRunState,
    Refusal,
    RunNotFound,
    UnknownWorkflow,
    raise_refusal,
)
from kumiflow_django.store.models import Event
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.wakeups import WorkKind, work_committed

logger = get_logger("kumiflow_django.engine.operations")

_SUSPENSIONS = {
    ev.STEP_WAITING: RunStatus.WAITING,
    ev.STEP_WAITING_FOR_EVENT: RunStatus.WAITING_EVENT,
    ev.RETRY_SCHEDULED: RunStatus.RETRY_SCHEDULED,
    ev.STEP_WAITING_FOR_CHILD: RunStatus.WAITING,
    ev.STEP_WAITING_BRANCHES: RunStatus.WAITING,
    # the start of a compensation: a retry runs the compensations again
    ev.COMPENSATION_STARTED: RunStatus.WAITING,
}
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


def _append(run: WorkflowRun, type_: str, payload: dict[str, Any], by: str = "") -> WorkflowRun:
    segment = Segment(run.id, run.tenant_id, run)
    segment.add(type_, payload, created_by=by)
    return segment.write()


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
    with db.atomic():
        run = _lock(run_id, tenant)
        raise_refusal(refuse_cancel(run), InvalidRunState, f"run {run.id}")
        text = reason or "cancelled"
        # Its tree before its flow key: the end releases the key, then cancels the children.
        children.lock_subtree(run, cancelled=True)
        if compensate and not compensation.active(run.cursor) and compensation.pending(run.state):
            segment = Segment(run.id, run.tenant_id, run)
            type_, started = compensation.begin(
                run, then="cancelled", reason="cancelled", error=text
            )
            if by:
                started["by"] = by
            segment.add(type_, started, created_by=by)
            updated = segment.write()
            work_committed(WorkKind.RESUME, updated.wake_at, updated.id)
            logger.info(
                "run %s: compensating before it is cancelled (%s)",
                run.id,
                text,
                extra=telemetry.run_log_fields(run),
            )
            return updated
        payload = audited({}, by, text)
        if compensation.active(run.cursor):  # cancelled while compensating
            payload["compensation"] = Compensation.FAILED
        updated = _append(run, ev.RUN_CANCELLED, payload, by)
        if telemetry.measuring():
            db.on_commit(partial(telemetry.count, telemetry.RUNS_CANCELLED, workflow=run.workflow))
    logger.info(
        "run %s cancelled by %s (%s)",
        run.id,
        by or "code",
        reason or "no reason given",
        extra=telemetry.run_log_fields(run),
    )
    return updated


@db.retrying
def wake_run(
    run_id: uuid.UUID | str, *, tenant: str | None = None, by: str = "", reason: str = ""
) -> WorkflowRun:
    """Make a waiting run due now: a timer ends early, a wait for an event
    times out now (the step takes its timeout path), a scheduled retry runs now."""
    by, reason = check_operator(by, reason)
    with db.atomic():
        run = _lock(run_id, tenant)
        raise_refusal(refuse_wake(run), InvalidRunState, f"run {run.id}")
        updated = _append(run, ev.RUN_WOKEN, audited({}, by, reason), by)
        work_committed(WorkKind.RESUME, updated.wake_at, updated.id)
    logger.info("run %s woken by %s (%s)", run.id, by or "code", reason or "no reason given")
    return updated


def retry_point(run: WorkflowRun) -> dict[str, Any]:
    """Where the failed segment began: the last suspension (and how it was woken),
    or the start."""
    events = list(
        Event.objects.filter(stream_id=str(run.id), tenant_id=run.tenant_id).order_by("-version")
    )
    resumed: Event | None = None
    for event in events:
        if event.type == ev.STEP_RESUMED and resumed is None:
            resumed = event
        if event.type in _SUSPENSIONS:
            p = event.payload
            restore: dict[str, Any] = {
                "status": _SUSPENSIONS[event.type],
                "cursor": p.get("cursor", [COMPENSATE, 0]),
                "state": p["state"],
                "attempt": p.get("attempt", 1),
            }
            if event.type == ev.COMPENSATION_STARTED:
                restore["state"] = {
                    **p["state"],
                    "compensating": {k: p.get(k) for k in ("reason", "error", "then")},
                }
            if event.type == ev.STEP_WAITING_BRANCHES:
                restore["waits"] = p.get("waits") or []  # indexed again (RunWait)
            if event.type in (ev.STEP_WAITING_BRANCHES, ev.STEP_WAITING_FOR_CHILD):
                # the children that ended since are read again from the log
                children = [p["child_id"]] if "child_id" in p else p.get("children") or []
                restore["child_waits"] = len(children)
                restore["suspended_version"] = event.version
            if event.type == ev.STEP_WAITING_FOR_EVENT:
                restore["awaited"] = {
                    k: p[k]
                    for k in ("event_type", "match", "correlation_key", "after", "gaps")
                    if k in p
                }
                if resumed is not None and resumed.payload.get("event"):
                    restore["matched_position"] = resumed.payload["event"]["position"]
            return restore
    started = events[-1].payload if events and events[-1].type == ev.RUN_STARTED else {}
    restart = started.get("restart") or {}  # a restarted run begins at its from-step
    return {
        "status": RunStatus.PENDING,
        "cursor": restart.get("cursor"),
        "state": restart.get("state") or new_state(),
        "attempt": 1,
    }


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
    with db.atomic():
        run = _lock(run_id, tenant)
        raise_refusal(refuse_retry(run), InvalidRunState, f"run {run.id}")
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
        if run.flow_key:
            # It takes its slot at once (an operator's decision), and like every
            # active run its key has its row (flow control's count relies on it).
            lock_key(RUNS_GATE.kind, run.flow_scope, run.flow_key)
        updated = _append(run, ev.RUN_RETRIED, audited(payload, by, reason), by)
        if task is not None:
            work_committed(WorkKind.TASK, None, run.id, task.id if task.backend else None)
        else:
            work_committed(WorkKind.RESUME, updated.wake_at, updated.id)
    logger.info(
        "run %s retried from %s by %s",
        run.id,
        payload["restore"]["cursor"],
        by or "code",
        extra=telemetry.run_log_fields(run),
    )
    return updated
