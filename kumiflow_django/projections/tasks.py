"""Tasks: one ``StepTask`` row per task a ``task`` step asked for, a projection
of the task's stream (``step-task``).

A task is work run outside the segment's transaction (its function, with its
arguments), at least once, each attempt under the same idempotency key (the
task's id). Its stream records every attempt: started (with a lease), failed
(with the retry time), completed (with the result), failed for good,
cancelled, a late result ignored. Heartbeats only extend the lease of the
row: they are not events (the lease fields are operational, like a run's).
:func:`apply` is the fold, shared by the engine, the task pool and rebuild.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import ClassVar

from django.db import models
from django.db.models import Expression
from django.utils.translation import gettext_lazy as _

from kumiflow_django.definition.context import TaskRequest
from kumiflow_django.definition.durations import parse_instant
from kumiflow_django.projections.stream import Change, Stream, write_one
from kumiflow_django.store import clock, leases, limits, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store import payloads as pl
from kumiflow_django.store.models import EngineManager, Event


class TaskStatus(models.TextChoices):
    PENDING = "pending", _("pending")  # waiting for its next attempt (next_attempt_at)
    RUNNING = "running", _("running")  # an attempt holds the lease
    COMPLETED = "completed", _("completed")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")


#: A task in one of these states is not done: it may still start or report.
OPEN = (TaskStatus.PENDING, TaskStatus.RUNNING)


class StepTaskQuerySet(models.QuerySet["StepTask", "StepTask"]):
    def due(self, now: datetime) -> StepTaskQuerySet:
        """Pending tasks whose next attempt is due, from the ``next_attempt_at``
        index alone (only pending tasks have one)."""
        return self.filter(next_attempt_at__lte=now)

    def expired(self, now: datetime | Expression) -> StepTaskQuerySet:
        """Running attempts whose lease ran out (a dead worker, a timeout)."""
        return self.filter(leases.ran_out_q(now))


class StepTask(models.Model):
    id = models.UUIDField(_("task id"), primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(_("tenant"), max_length=limits.TENANT)
    run_id = models.UUIDField(_("run"))
    workflow = models.CharField(_("workflow"), max_length=limits.WORKFLOW_NAME, blank=True)
    #: The trace context of the segment that asked for the task (its attempts'
    #: spans are its children), when a trace was active.
    trace = models.JSONField(_("trace context"), null=True, blank=True)
    step_path = models.CharField(_("step"), max_length=limits.STEP_PATH)
    name = models.CharField(_("step name"), max_length=limits.EVENT_TYPE, blank=True)
    function = models.CharField(_("function"), max_length=limits.TASK_FUNCTION)
    #: A ``TASKS`` alias; empty: kumiflow's own task pool runs it.
    backend = models.CharField(_("backend"), max_length=limits.TASK_BACKEND, blank=True)
    queue = models.CharField(_("queue"), max_length=limits.TASK_QUEUE, blank=True)
    priority = models.IntegerField(_("priority"), default=0)
    args = models.JSONField(_("arguments"), null=True, blank=True)
    retry = models.JSONField(_("retry policy"), default=dict)
    non_retryable = models.JSONField(_("never retried"), default=list)
    timeout = models.FloatField(_("timeout per attempt (s)"))
    heartbeat_timeout = models.FloatField(_("heartbeat timeout (s)"), null=True, blank=True)
    #: Flow control of its attempts (``steps.task(concurrency=, rate=)``): the
    #: limit as declared, the key it counts in, what holds a parked attempt.
    flow = models.JSONField(_("flow control"), null=True, blank=True)
    flow_scope = models.CharField(_("limit scope"), max_length=limits.FLOW_SCOPE, blank=True)
    flow_key = models.CharField(_("limit key"), max_length=limits.FLOW_KEY, blank=True)
    held_by = models.CharField(_("held by"), max_length=20, blank=True)
    status = models.CharField(_("status"), max_length=20, choices=TaskStatus.choices)
    attempt = models.PositiveIntegerField(_("attempt"), default=0)
    #: The last attempt number the retry policy allows (an operator's retry raises it).
    max_attempt = models.PositiveIntegerField(_("last attempt allowed"), default=1)
    next_attempt_at = models.DateTimeField(_("next attempt at"), null=True, blank=True)
    #: The attempt handed to the backend (so a lost hand-off is found and done again).
    enqueued_attempt = models.PositiveIntegerField(_("attempt enqueued"), default=0)
    enqueued_at = models.DateTimeField(_("enqueued at"), null=True, blank=True)
    started_at = models.DateTimeField(_("attempt started at"), null=True, blank=True)
    # Operational (not projected from the log): who runs the attempt, until
    # when, its last heartbeat. A heartbeat extends the lease.
    worker = models.CharField(_("worker"), max_length=limits.LEASE_OWNER, blank=True)
    lease_until = models.DateTimeField(_("lease until"), null=True, blank=True)
    heartbeat_at = models.DateTimeField(_("last heartbeat"), null=True, blank=True)
    heartbeat_details = models.JSONField(_("heartbeat details"), null=True, blank=True)
    result = models.JSONField(_("result"), null=True, blank=True)
    last_error = models.TextField(_("last error"), blank=True)
    error_type = models.CharField(_("error type"), max_length=limits.TASK_FUNCTION, blank=True)
    traceback = models.TextField(_("traceback"), blank=True)
    duration = models.FloatField(_("duration of the last attempt (s)"), null=True, blank=True)
    version = models.PositiveIntegerField(_("stream version"))
    created_at = models.DateTimeField(_("created at"))
    updated_at = models.DateTimeField(_("updated at"))
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    objects: ClassVar[StepTaskQuerySet] = EngineManager.from_queryset(StepTaskQuerySet)()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=[c.value for c in TaskStatus]),
                name="kumiflow_task_status_valid",
            ),
        ]
        indexes = [
            # Due attempts: only pending tasks have a next attempt time.
            models.Index(fields=["next_attempt_at"], name="kumiflow_task_due_idx"),
            # Flow control: a key's running attempts and its parked ones.
            models.Index(
                fields=["flow_key", "flow_scope", "status"], name="kumiflow_task_flow_idx"
            ),
            # Attempts whose lease ran out: only running tasks have a lease.
            models.Index(fields=["lease_until"], name="kumiflow_task_lease_idx"),
            models.Index(fields=["run_id"], name="kumiflow_task_run_idx"),
        ]

    def __str__(self) -> str:
        return f"task {self.function} {self.id} ({self.status})"

    @property
    def idempotency_key(self) -> str:
        """The same for every attempt of the task: send it to the services you call."""
        return str(self.id)


# -- the fold ---------------------------------------------------------------


def _instant(value: str | None) -> datetime | None:
    return parse_instant(value) if value else None


def _end_attempt(task: StepTask) -> None:
    task.worker = ""
    task.lease_until = None
    task.heartbeat_at = None
    task.heartbeat_details = None


def _requested(event: Event) -> StepTask:
    p: pl.TaskRequested = event.payload
    return StepTask(
        id=uuid.UUID(event.stream_id),
        tenant_id=event.tenant_id,
        run_id=uuid.UUID(p["run_id"]),
        workflow=p.get("workflow") or "",
        trace=p.get("trace"),
        step_path=p["step"],
        name=p.get("name") or "",
        function=p["function"],
        backend=p.get("backend") or "",
        queue=p.get("queue") or "",
        priority=p.get("priority", 0),
        args=p.get("args"),
        retry=p.get("retry") or {},
        non_retryable=p.get("non_retryable") or [],
        timeout=p["timeout"],
        heartbeat_timeout=p.get("heartbeat_timeout"),
        flow=p.get("flow"),
        flow_scope=(p.get("flow") or {}).get("scope", ""),
        flow_key=(p.get("flow") or {}).get("key", ""),
        status=TaskStatus.PENDING,
        attempt=0,
        max_attempt=int((p.get("retry") or {}).get("attempts", 1)),
        next_attempt_at=event.created_at,
        created_at=event.created_at,
    )


def _enqueued(task: StepTask, event: Event) -> None:
    p: pl.TaskEnqueued = event.payload
    task.enqueued_attempt = p["attempt"]
    task.enqueued_at = event.created_at


def _attempt_started(task: StepTask, event: Event) -> None:
    p: pl.TaskAttemptStarted = event.payload
    task.status = TaskStatus.RUNNING
    task.attempt = p["attempt"]
    task.next_attempt_at = None
    task.started_at = event.created_at
    task.worker = p.get("worker", "")
    task.lease_until = _instant(p.get("lease_until"))
    task.heartbeat_at = None
    task.heartbeat_details = None


def _attempt_failed(task: StepTask, event: Event) -> None:
    p: pl.TaskAttemptFailed = event.payload
    _end_attempt(task)
    task.status = TaskStatus.PENDING
    task.next_attempt_at = _instant(p["retry_at"])
    task.last_error = p["error"]
    task.error_type = p.get("error_type", "")
    task.traceback = p.get("traceback", "")
    task.duration = p.get("duration")


def _completed(task: StepTask, event: Event) -> None:
    p: pl.TaskCompleted = event.payload
    _end_attempt(task)
    task.status = TaskStatus.COMPLETED
    task.next_attempt_at = None
    task.result = p.get("result")
    task.duration = p.get("duration")
    task.finished_at = event.created_at


def _failed(task: StepTask, event: Event) -> None:
    p: pl.TaskFailed = event.payload
    _end_attempt(task)
    task.status = TaskStatus.FAILED
    task.next_attempt_at = None
    task.last_error = p["error"]
    task.error_type = p.get("error_type", "")
    task.traceback = p.get("traceback", "")
    task.duration = p.get("duration")
    task.finished_at = event.created_at


def _cancelled(task: StepTask, event: Event) -> None:
    p: pl.TaskCancelled = event.payload
    _end_attempt(task)
    task.status = TaskStatus.CANCELLED
    task.next_attempt_at = None
    task.last_error = p.get("reason", "")
    task.finished_at = event.created_at


def _retried(task: StepTask, event: Event) -> None:
    _end_attempt(task)
    task.status = TaskStatus.PENDING
    task.next_attempt_at = event.created_at
    task.max_attempt = task.attempt + int(task.retry.get("attempts", 1))
    task.finished_at = None
    task.result = None


#: How each task event changes the row (after :func:`apply` set its version);
#: ``task.result-ignored`` changes nothing else.
FOLD: dict[str, Callable[[StepTask, Event], None]] = {
    ev.TASK_ENQUEUED: _enqueued,
    ev.TASK_ATTEMPT_STARTED: _attempt_started,
    ev.TASK_ATTEMPT_FAILED: _attempt_failed,
    ev.TASK_COMPLETED: _completed,
    ev.TASK_FAILED: _failed,
    ev.TASK_CANCELLED: _cancelled,
    ev.TASK_RETRIED: _retried,
}


def apply(task: StepTask | None, event: Event) -> StepTask:
    """The task row after ``event``; ``task`` is None before ``task.requested``."""
    if event.type == ev.TASK_REQUESTED:
        task = _requested(event)
    if task is None:
        raise ValueError(f"event {event.type} precedes task.requested")
    task.version = event.version
    task.updated_at = event.created_at
    handler = FOLD.get(event.type)
    if handler is not None:
        handler(task, event)
    return task


#: The task streams: what the segment and the task pool write through.
TASKS = Stream(ev.TASK_STREAM, StepTask, apply)


def metadata(run_id: uuid.UUID) -> dict[str, str]:
    return {"run_id": str(run_id)}


def opened(
    requests: Iterable[TaskRequest],
    *,
    tenant: str,
    run_id: uuid.UUID,
    now: datetime,
    workflow: str = "",
) -> list[Change[StepTask]]:
    """The task streams that the task requests of one run's segment open.

    A request that can never run (its arguments are not JSON) fails at once,
    without an attempt.
    """
    changes = []
    trace = telemetry.carrier() if requests else None
    for request in requests:
        change = Change(TASKS, str(request.id), tenant, None, now=now, metadata=metadata(run_id))
        requested: pl.TaskRequested = {
            "run_id": str(run_id),
            "workflow": workflow,
            "step": request.step,
            "name": request.name,
            "function": request.function,
            "backend": request.backend,
            "queue": request.queue,
            "priority": request.priority,
            "args": request.args,
            "retry": request.retry,
            "non_retryable": list(request.non_retryable),
            "timeout": request.timeout,
            "heartbeat_timeout": request.heartbeat_timeout,
        }
        if trace:
            requested["trace"] = trace
        if request.flow:
            requested["flow"] = request.flow
        change.add(ev.TASK_REQUESTED, requested)
        if request.problem:
            failed: pl.TaskFailed = {
                "attempt": 0,
                "error": request.problem,
                "error_type": "InvalidEvent",
            }
            change.add(ev.TASK_FAILED, failed)
        changes.append(change)
    return changes


def append(task: StepTask, type_: str, payload: pl.Payload) -> StepTask:
    """Append one event to a task's stream at its next version, fold it and write
    it, in the caller's transaction (a concurrent writer makes it fail with a
    version clash or :class:`~kumiflow_django.projections.stream.StaleRow`)."""
    change = Change(
        TASKS, str(task.id), task.tenant_id, task, now=clock.now(), metadata=metadata(task.run_id)
    )
    change.add(type_, payload)
    return write_one(change)
