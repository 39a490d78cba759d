"""One attempt of a task: claim it, run it outside any transaction, record it.

1. **claim**: lock the task (skip-locked where possible), check it is due,
   append ``task.attempt-started`` with the attempt's number and a lease, and
   commit;
2. **run** the function, outside any transaction, with
   :func:`~kumiflow_django.tasks.context.current_task` set;
3. **record** the outcome in a transaction of its own that accepts only the
   current attempt: ``task.completed`` (the result), ``task.attempt-failed``
   (retried after the backoff), ``task.failed`` (no attempt left, or an
   exception that is never retried). A late outcome (the attempt timed out,
   the run was cancelled) is recorded as ``task.result-ignored`` and changes
   nothing else. A settled task wakes its run through the event it appends.

An attempt whose worker died or that outlived its timeout (or its heartbeat
timeout) is given up by :func:`expire` when its lease runs out, and tried
again by the policy: at least once, always under the same idempotency key.
An outcome that comes after the lease ran out, before any sweep, gives the
attempt up the same way first (so it is late): the lease decides, not
whether a sweep happened to run.
"""

from __future__ import annotations

import functools
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError

from kumiflow_django.conf import settings
from kumiflow_django.definition.backoff import BackoffPolicy
from kumiflow_django.definition.durations import isoformat
from kumiflow_django.flow import admission
from kumiflow_django.flow.admission import Item
from kumiflow_django.projections import claims
from kumiflow_django.projections.claims import unclaimed
from kumiflow_django.projections.lock_order import lock_owned
from kumiflow_django.projections.stream import Change, StaleRow, write
from kumiflow_django.projections.tasks import TASKS, StepTask, TaskStatus, append, metadata
from kumiflow_django.steps.task import import_function
from kumiflow_django.store import clock, db, leases, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store.errors import InvalidEvent
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.values import clean_text, to_json
from kumiflow_django.store.wakeups import WorkKind, work_committed
from kumiflow_django.tasks.context import TaskContext, running

logger = get_logger("kumiflow_django.tasks")

#: Longest traceback kept with a failed attempt, in characters.
MAX_TRACEBACK = 16_000


@dataclass(frozen=True)
class Attempt:
    """A claimed attempt: what to run, and who it is."""

    task_id: uuid.UUID
    number: int
    function: str
    args: Any
    context: TaskContext
    non_retryable: tuple[str, ...]
    workflow: str = ""
    trace: dict[str, str] | None = None


@dataclass(frozen=True)
class Outcome:
    """What an attempt came to."""

    ok: bool
    result: Any = None
    error: str = ""
    error_type: str = ""
    traceback: str = ""
    retryable: bool = True
    duration: float = 0.0


def lease_until(task: StepTask, started: datetime) -> datetime:
    """When an attempt started at ``started`` is given up unless it reports (or
    heartbeats, with a heartbeat timeout)."""
    lease = started + timedelta(seconds=task.timeout)
    if task.heartbeat_timeout is not None:
        lease = min(lease, started + timedelta(seconds=task.heartbeat_timeout))
    return lease


def claim(task_id: uuid.UUID, *, worker: str, attempt: int | None = None) -> Attempt | None:
    """Start the next attempt of a due task; None if it is not due, not pending,
    locked by another worker, or (``attempt``) not at that attempt any more."""
    now = clock.now()

    def take() -> StepTask | None:
        task = unclaimed(StepTask.objects.filter(pk=task_id)).first()
        if task is None or task.status != TaskStatus.PENDING:
            return None
        if task.next_attempt_at is None or task.next_attempt_at > now:
            return None
        number = task.attempt + 1
        if attempt is not None and attempt != number:
            return None  # a hand-off of an older attempt
        if admission.admit(Item.attempt(task), now=now).hold is not None:
            return None  # parked: a slot or the rate's next window hands it off again
        return append(
            task,
            ev.TASK_ATTEMPT_STARTED,
            {
                "attempt": number,
                "worker": worker,
                "lease_until": isoformat(lease_until(task, now)),
            },
        )

    started = claims.claim(take, lost=None)  # lost: another worker claimed it first
    return None if started is None else _attempt(started, now)


def claim_due(
    now: datetime,
    *,
    worker: str,
    limit: int,
    queues: Sequence[str] | None = None,
    every_backend: bool = False,
) -> list[Attempt]:
    """Start the next attempt of up to ``limit`` due tasks of kumiflow's pool (of
    ``queues``; of every backend too with ``every_backend``), earliest first, in
    one transaction: rows another worker holds are skipped where the database
    can, and a concurrent claim makes the whole batch a no-op (tried again)."""
    due = StepTask.objects.due(now)
    if not every_backend:
        due = due.filter(backend="")
    if queues is not None:
        due = due.filter(queue__in=list(queues))

    def take() -> list[Change[StepTask]]:
        rows = list(unclaimed(due.order_by("next_attempt_at")[:limit]))
        # Every key and rate bucket of the batch locked first, keys then
        # buckets, each in sorted order (as a single admission takes them):
        # two claims of overlapping batches cannot deadlock.
        items = [Item.attempt(task) for task in rows]
        admission.lock_batch(items, now)
        changes = []
        for task, item in zip(rows, items, strict=True):
            if admission.admit(item, now=now).hold is not None:
                continue  # parked until a slot frees or the rate's next window
            change = Change(
                TASKS,
                str(task.id),
                task.tenant_id,
                task,
                now=now,
                metadata=metadata(task.run_id),
            )
            number = task.attempt + 1
            change.add(
                ev.TASK_ATTEMPT_STARTED,
                {
                    "attempt": number,
                    "worker": worker,
                    "lease_until": isoformat(lease_until(task, now)),
                },
            )
            if task.flow_key:  # running now, so the next admission of its key counts it
                write([change])
            changes.append(change)
        write([change for change in changes if not change.saved.flow_key])
        return changes

    # lost: another worker claimed some of them first
    changes: list[Change[StepTask]] = claims.claim(take, lost=[])
    return [_attempt(change.saved, now) for change in changes]


def _attempt(task: StepTask, started: datetime) -> Attempt:
    context = TaskContext(
        task_id=task.id,
        run_id=task.run_id,
        tenant=task.tenant_id,
        step=task.step_path,
        attempt=task.attempt,
        started_at=started,
        timeout=task.timeout,
        heartbeat_timeout=task.heartbeat_timeout,
    )
    return Attempt(
        task.id,
        task.attempt,
        task.function,
        task.args,
        context,
        tuple(task.non_retryable),
        workflow=task.workflow,
        trace=task.trace,
    )


@functools.cache
def _exception_class(path: str) -> type[BaseException] | None:
    try:
        found = import_function(path)
    except (ImportError, AttributeError, TypeError):
        return None
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def run(attempt: Attempt) -> Outcome:
    """Run the attempt's function (outside any transaction), in its span (a
    child of the segment that asked for the task); never raises but
    ``KeyboardInterrupt``."""
    with telemetry.task_attempt(
        run_id=attempt.context.run_id,
        workflow=attempt.workflow,
        tenant=attempt.context.tenant,
        step_path=attempt.context.step.split("."),
        task=attempt.function,
        attempt=attempt.number,
        parent=attempt.trace,
    ) as watched:
        outcome = _run(attempt)
        watched.outcome = "succeeded" if outcome.ok else "failed"
    return outcome


def _run(attempt: Attempt) -> Outcome:
    began = time.monotonic()
    try:
        function = import_function(attempt.function)
        with running(attempt.context):
            if isinstance(attempt.args, list):
                value = function(*attempt.args)
            elif isinstance(attempt.args, dict):
                value = function(**attempt.args)
            else:
                value = function()
        result = to_json(
            value,
            f"the result of {attempt.function}",
            max_bytes=settings.MAX_RESULT_BYTES,
            setting="KUMIFLOW_MAX_RESULT_BYTES",
        )
    except KeyboardInterrupt:
        raise
    except InvalidEvent as exc:  # a result no database stores: trying again changes nothing
        return Outcome(
            ok=False,
            error=str(exc),
            error_type="kumiflow_django.store.errors.InvalidEvent",
            retryable=False,
            duration=time.monotonic() - began,
        )
    except BaseException as exc:  # SystemExit too: an exception of the function fails its attempt
        classes = [_exception_class(path) for path in attempt.non_retryable]
        never = any(cls is not None and isinstance(exc, cls) for cls in classes)
        return Outcome(
            ok=False,
            error=clean_text(str(exc) or type(exc).__name__, 2000),
            error_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
            traceback=clean_text("".join(traceback.format_exception(exc)), MAX_TRACEBACK),
            retryable=not never,
            duration=time.monotonic() - began,
        )
    return Outcome(ok=True, result=result, duration=time.monotonic() - began)


@db.retrying
def record(attempt: Attempt, outcome: Outcome) -> StepTask | None:
    """Record an attempt's outcome, if it is still the current attempt and its
    lease has not run out (at the engine's clock). The savepoint of what the
    outcome wakes (the run's segment, its match) is released with the commit."""
    with db.atomic(takes_nested=True):
        task = lock_owned(StepTask, attempt.task_id)
        if task is None:
            return None
        now = clock.now()
        current = task.status == TaskStatus.RUNNING and task.attempt == attempt.number
        if current and leases.ran_out(task.lease_until, now):
            # It outlived its lease and no sweep gave it up yet: given up here,
            # as the sweep would, so its result comes too late below.
            task = _give_up(task, now, late=True)
        if task.status != TaskStatus.RUNNING or task.attempt != attempt.number:
            logger.info(
                "task %s: the result of attempt %d came too late (the task is %s at attempt %d)",
                task.id,
                attempt.number,
                task.status,
                task.attempt,
            )
            return append(
                task,
                ev.TASK_RESULT_IGNORED,
                {
                    "attempt": attempt.number,
                    "outcome": "completed" if outcome.ok else "failed",
                    "why": f"the task is {task.status} at attempt {task.attempt}",
                },
            )
        if outcome.ok:
            updated = append(
                task,
                ev.TASK_COMPLETED,
                {"attempt": attempt.number, "result": outcome.result, "duration": outcome.duration},
            )
        else:
            updated = _failed(task, attempt.number, outcome)
        admission.release(Item.attempt(updated))  # its slot frees: wake one parked behind it
        return updated


def _failed(task: StepTask, number: int, outcome: Outcome) -> StepTask:
    """The attempt failed: try again after the backoff, or fail the task."""
    payload: dict[str, Any] = {
        "attempt": number,
        "error": outcome.error,
        "error_type": outcome.error_type,
        "traceback": outcome.traceback,
        "duration": outcome.duration,
    }
    policy = BackoffPolicy.from_mapping(task.retry) if task.retry else BackoffPolicy(attempts=1)
    if outcome.retryable and number < task.max_attempt:
        retry_at = clock.now() + policy.delay(number - (task.max_attempt - policy.attempts))
        logger.info(
            "task %s: attempt %d failed (%s); next at %s", task.id, number, outcome.error, retry_at
        )
        updated = append(task, ev.TASK_ATTEMPT_FAILED, payload | {"retry_at": isoformat(retry_at)})
        work_committed(WorkKind.TASK, retry_at, task.run_id, task.id if task.backend else None)
        return updated
    logger.warning("task %s: failed after attempt %d: %s", task.id, number, outcome.error)
    return append(task, ev.TASK_FAILED, payload)


def expire(task_id: uuid.UUID, now: datetime) -> StepTask | None:
    """Give up a running attempt whose lease ran out (its worker died, it outlived
    its timeout, it stopped heartbeating): it is tried again by the policy."""
    try:
        with db.atomic():
            task = lock_owned(StepTask, task_id, skip_locked=True)
            if task is None or task.status != TaskStatus.RUNNING:
                return None
            if not leases.ran_out(task.lease_until, now):
                return None
            return _give_up(task, now)
    except (IntegrityError, StaleRow):
        return None


def _give_up(task: StepTask, now: datetime, *, late: bool = False) -> StepTask:
    """Give up the running attempt of a locked task whose lease ran out at ``now``
    (the one way, for the sweep and for a result that comes after the lease).

    The sweep finds no result at all: its worker was lost (or the attempt is
    stuck), and the attempt says so (``WorkerLost``), with how long it ran
    before its last sign of life (its last heartbeat, else its lease's end).
    A result that comes after the lease (``late``) timed out."""
    started, lease = task.started_at or now, task.lease_until or now
    last = lease
    if task.heartbeat_timeout is not None and lease < started + timedelta(seconds=task.timeout):
        why = f"no heartbeat for {task.heartbeat_timeout:g} s"
        last = task.heartbeat_at or started
    else:
        why = f"timed out after {task.timeout:g} s"
    if task.worker:
        why += f" (worker {task.worker})"
    if late:
        error_type, ran = "TimeoutError", now
    else:
        error_type, ran = ev.WORKER_LOST, min(last, now)
        why = f"worker lost: no result within its lease, {why}"
    logger.warning("task %s: attempt %d given up: %s", task.id, task.attempt, why)
    seconds = max((ran - started).total_seconds(), 0.0)
    outcome = Outcome(ok=False, error=why, error_type=error_type, duration=seconds)
    updated = _failed(task, task.attempt, outcome)
    admission.release(Item.attempt(updated))
    return updated
