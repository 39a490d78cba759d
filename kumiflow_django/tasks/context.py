"""What a task's function sees while it runs: :func:`current_task`.

Inside a task step's function, ``current_task()`` tells which run and step
it serves, which attempt it is, the idempotency key to send to the services
it calls (the same for every attempt), and lets it send heartbeats and see
whether it was cancelled (its run cancelled, or its attempt given up after a
timeout: its result would be ignored).
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kumiflow_django.projections.tasks import StepTask, TaskStatus
from kumiflow_django.store import clock, errors, leases
from kumiflow_django.store.deprecation import moved_names
from kumiflow_django.store.values import to_json

#: Largest heartbeat details, in bytes of JSON (they live on the task's row).
MAX_DETAILS_BYTES = 65_536


@dataclass(frozen=True)
class TaskContext:
    """One attempt of one task, as its function sees it."""

    task_id: uuid.UUID
    run_id: uuid.UUID
    tenant: str
    step: str
    attempt: int
    started_at: Any
    timeout: float
    heartbeat_timeout: float | None

    @property
    def idempotency_key(self) -> str:
        """The same for every attempt of this task: send it to the services you call."""
        return str(self.task_id)

    def heartbeat(self, details: Any = None) -> bool:
        """Tell the engine this attempt is alive (with ``heartbeat_timeout`` it must,
        at least that often); ``details`` (JSON) are shown in the admin.

        Returns False when the attempt is no longer the current one: it timed
        out or its run was cancelled, and its result will be ignored.
        """
        now = clock.now()
        lease = self.started_at + timedelta(seconds=self.timeout)
        if self.heartbeat_timeout is not None:
            lease = min(lease, now + timedelta(seconds=self.heartbeat_timeout))
        values = {"heartbeat_at": now, "lease_until": lease}
        if details is not None:
            values["heartbeat_details"] = to_json(
                details, "heartbeat details", max_bytes=MAX_DETAILS_BYTES
            )
        # A lease that ran out is not extended: the attempt is given up (its
        # result would be ignored) even if no sweep did it yet.
        alive = (
            StepTask.objects.filter(
                pk=self.task_id, status=TaskStatus.RUNNING, attempt=self.attempt
            )
            .exclude(leases.ran_out_q(now))
            .update(**values)
        )
        return bool(alive)

    @property
    def cancelled(self) -> bool:
        """Whether this attempt should stop: its run was cancelled, or the engine
        gave it up or its lease ran out (a timeout). Reads the task's row: call it
        between units of work."""
        row = (
            StepTask.objects.filter(pk=self.task_id)
            .values_list("status", "attempt", "lease_until")
            .first()
        )
        if row is None or row[:2] != (TaskStatus.RUNNING, self.attempt):
            return True
        return leases.ran_out(row[2], clock.now())


_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "kumiflow_current_task", default=None
)


def current_task() -> TaskContext:
    """The attempt the calling code runs in (inside a task step's function)."""
    context = _current.get()
    if context is None:
        raise errors.NotInATask("current_task() is only available inside a task step's function")
    return context


@contextlib.contextmanager
def running(context: TaskContext) -> Iterator[TaskContext]:
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


__getattr__ = moved_names(__name__, {"NotInATask": "kumiflow_django"})
