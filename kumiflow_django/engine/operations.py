"""Operating runs: cancel, retry and wake. The admin calls these, nothing else.

Each appends one event to the run's stream at its current version (the row
is locked first, so an operation waits for a segment in flight) and updates
the run row through the projection, like every other change of a run.
"""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

from kumiflow_django.definition.context import new_state
from kumiflow_django.definition.registry import registry
from kumiflow_django.engine.segment import Segment
from kumiflow_django.outbox.actions import cancel_dispatch
from kumiflow_django.projections.dispatches import DELIVERABLE, Dispatch
from kumiflow_django.projections.runs import FINISHED, RunStatus, WorkflowRun
from kumiflow_django.store import db, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store.db import for_update
from kumiflow_django.store.errors import InvalidRunState, RunNotFound
from kumiflow_django.store.models import Event
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.wakeups import WorkKind, work_committed

logger = get_logger("kumiflow_django.engine.operations")

_SUSPENSIONS = {
    ev.STEP_WAITING: RunStatus.WAITING,
    ev.STEP_WAITING_FOR_EVENT: RunStatus.WAITING_EVENT,
    ev.RETRY_SCHEDULED: RunStatus.RETRY_SCHEDULED,
}
WAKEABLE = (RunStatus.WAITING, RunStatus.WAITING_EVENT, RunStatus.RETRY_SCHEDULED)


def _lock(run_id: uuid.UUID | str, tenant: str | None) -> WorkflowRun:
    try:
        pk = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    except ValueError:
        raise RunNotFound(f"{run_id!r} is not a run id") from None
    qs = WorkflowRun.objects.filter(pk=pk)
    if tenant is not None:
        qs = qs.filter(tenant_id=tenant)
    run = for_update(qs).first()
    if run is None:
        raise RunNotFound(f"no run {run_id}" + (f" in tenant {tenant!r}" if tenant else ""))
    return run


def _append(run: WorkflowRun, type_: str, payload: dict[str, Any]) -> WorkflowRun:
    segment = Segment(run.id, run.tenant_id, run)
    segment.add(type_, payload)
    return segment.write()


def cancel_run(
    run_id: uuid.UUID | str, *, reason: str = "", tenant: str | None = None
) -> WorkflowRun:
    """Stop a run that has not finished. Its outbox requests not delivered yet
    are cancelled with it."""
    with db.atomic():
        run = _lock(run_id, tenant)
        if run.status in FINISHED:
            raise InvalidRunState(
                f"run {run.id} is {run.status}: only unfinished runs are cancelled"
            )
        updated = _append(run, ev.RUN_CANCELLED, {"reason": reason or "cancelled"})
        if telemetry.measuring():
            db.on_commit(partial(telemetry.count, telemetry.RUNS_CANCELLED, workflow=run.workflow))
        pending = Dispatch.objects.filter(run_id=run.id, status__in=DELIVERABLE)
        for dispatch_id in pending.values_list("id", flat=True):
            cancel_dispatch(dispatch_id, reason=f"run {run.id} was cancelled")
    logger.info(
        "run %s cancelled (%s)",
        run.id,
        reason or "no reason given",
        extra=telemetry.run_log_fields(run),
    )
    return updated


def wake_run(run_id: uuid.UUID | str, *, tenant: str | None = None) -> WorkflowRun:
    """Make a waiting run due now: a timer ends early, a wait for an event
    times out now, a scheduled retry runs now."""
    with db.atomic():
        run = _lock(run_id, tenant)
        if run.status not in WAKEABLE:
            raise InvalidRunState(f"run {run.id} is {run.status}: only waiting runs are woken")
        updated = _append(run, ev.RUN_WOKEN, {})
        work_committed(WorkKind.RESUME, updated.wake_at, updated.id)
    return updated


def _retry_point(run: WorkflowRun) -> dict[str, Any]:
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
                "cursor": p["cursor"],
                "state": p["state"],
                "attempt": p.get("attempt", 1),
            }
            if event.type == ev.STEP_WAITING_FOR_EVENT:
                restore["awaited"] = {
                    k: p[k] for k in ("event_type", "match", "correlation_key", "after")
                }
                if resumed is not None and resumed.payload.get("event"):
                    restore["matched_position"] = resumed.payload["event"]["position"]
            return restore
    return {"status": RunStatus.PENDING, "cursor": None, "state": new_state(), "attempt": 1}


def retry_run(
    run_id: uuid.UUID | str,
    *,
    adopt_current_definition: bool = False,
    tenant: str | None = None,
) -> WorkflowRun:
    """Run a failed run's failed segment again, from the suspension it began at.

    The failed segment was rolled back as a whole, so nothing of it is
    repeated twice. ``adopt_current_definition=True`` moves the run onto the
    workflow's current definition first (after a ``workflow_definition_changed``
    failure, when the new definition still fits the run's position).
    """
    with db.atomic():
        run = _lock(run_id, tenant)
        if run.status != RunStatus.FAILED:
            raise InvalidRunState(f"run {run.id} is {run.status}: only failed runs are retried")
        payload: dict[str, Any] = {"restore": _retry_point(run)}
        if adopt_current_definition:
            current = registry.get(run.workflow)
            cursor = payload["restore"]["cursor"]
            if cursor is not None:
                try:
                    current.step_at(cursor)
                except ValueError as exc:
                    raise InvalidRunState(
                        f"run {run.id} is at {cursor}, which the current definition of "
                        f"{run.workflow!r} does not have"
                    ) from exc
            payload["fingerprint"] = current.fingerprint
            payload["version"] = current.version
        updated = _append(run, ev.RUN_RETRIED, payload)
        work_committed(WorkKind.RESUME, updated.wake_at, updated.id)
    logger.info(
        "run %s retried from %s",
        run.id,
        payload["restore"]["cursor"],
        extra=telemetry.run_log_fields(run),
    )
    return updated
