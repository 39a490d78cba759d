"""Handing task attempts to a Django Tasks backend.

A task step whose function is a Django Tasks ``Task`` runs on that task's
backend and queue: not the user's ``Task`` itself, but kumiflow's
:func:`kumiflow_django.tasks.run_attempt`, enqueued there with the task's id
and the attempt's number, which claims the attempt, runs the function and
records the outcome like kumiflow's own pool does. So the at-least-once
contract, the lease, the retry policy and the idempotency key are the same
on every backend.

The hand-off happens after the segment commits (a hook on committed work),
and again for any due attempt a crash left un-enqueued (:func:`sweep`, from
the task loop): an attempt enqueued twice runs once (the claim checks the
attempt's number).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NamedTuple

from django.db.models import F, Min
from django.db.models.functions import Greatest

from kumiflow_django.projections.claims import claim, unclaimed
from kumiflow_django.projections.tasks import StepTask, TaskStatus, append
from kumiflow_django.store import clock, db
from kumiflow_django.store import names as ev
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.tasks")

#: A due attempt that no hand-off claimed this long is handed off again.
RESEND_AFTER = timedelta(seconds=30)


def enqueue(runner: Any, task_id: uuid.UUID) -> bool:
    """Hand the task's next attempt to its backend, once; True if it was handed.

    ``runner`` is the Django ``Task`` of :func:`kumiflow_django.tasks.run_attempt`.
    The hand-off is recorded (``task.enqueued``) first, and the job enqueued
    once that record commits: a backend that runs jobs at once (Django's
    ``ImmediateBackend``) then runs the attempt outside any transaction, and
    a crash in between leaves an attempt that :func:`sweep` hands off again.
    """

    def take() -> bool:
        task = unclaimed(StepTask.objects.filter(pk=task_id)).first()
        if task is None or not task.backend or task.status != TaskStatus.PENDING:
            return False
        number = task.attempt + 1
        now = clock.now()
        if task.enqueued_attempt >= number and not _lost(task, now):
            return False
        options: dict[str, Any] = {"backend": task.backend}
        if task.queue:
            options["queue_name"] = task.queue
        if task.priority:
            options["priority"] = task.priority
        if task.next_attempt_at is not None and task.next_attempt_at > now:
            if not runner.using(backend=task.backend).get_backend().supports_defer:
                return False  # handed off by the sweep once it is due
            options["run_after"] = task.next_attempt_at
        append(task, ev.TASK_ENQUEUED, {"attempt": number, "backend": task.backend})
        db.on_commit(partial(_send, runner, options, task_id, number))
        return True

    return claim(take, lost=False)


def _send(runner: Any, options: dict[str, Any], task_id: uuid.UUID, number: int) -> None:
    try:
        result = runner.using(**options).enqueue(str(task_id), number)
    except Exception:  # handed off again by the sweep once the attempt is overdue
        logger.exception(
            "task %s: enqueueing attempt %d to %s failed; it is enqueued again in %d s",
            task_id,
            number,
            options["backend"],
            RESEND_AFTER.total_seconds(),
        )
        return
    logger.info(
        "task %s: attempt %d enqueued to %s as %s", task_id, number, options["backend"], result.id
    )


def _lost(task: StepTask, now: datetime) -> bool:
    """An enqueued attempt that is due and was not claimed for a while: its job was lost."""
    due = task.next_attempt_at
    sent = task.enqueued_at
    return due is not None and sent is not None and max(due, sent) + RESEND_AFTER <= now


class Swept(NamedTuple):
    """What a sweep found due, and how many of those it handed off."""

    found: int
    sent: int


def sweep(runner: Any, now: datetime, limit: int) -> Swept:
    """Hand off due backend attempts that no job took: never enqueued (a crash
    right after commit, a backend that cannot defer) or enqueued and lost."""
    candidates = (
        StepTask.objects.due(now)
        .exclude(backend="")
        .filter(enqueued_attempt__lte=F("attempt"))
        .values_list("id", flat=True)[:limit]
    )
    stale = (
        StepTask.objects.due(now - RESEND_AFTER)
        .exclude(backend="")
        .filter(enqueued_at__lte=now - RESEND_AFTER)
        .values_list("id", flat=True)[:limit]
    )
    found = list(dict.fromkeys([*candidates, *stale]))
    sent = 0
    for task_id in found:
        try:
            sent += enqueue(runner, task_id)
        except Exception:  # one backend that refuses does not stop the others
            logger.exception("task %s: enqueueing failed; tried again later", task_id)
    return Swept(len(found), sent)


def next_sweep() -> datetime | None:
    """When :func:`sweep` next has something to do (as far as the rows tell)."""
    pending = StepTask.objects.filter(status=TaskStatus.PENDING).exclude(backend="")
    unsent = pending.filter(enqueued_attempt__lte=F("attempt")).aggregate(
        at=Min("next_attempt_at")
    )["at"]
    sent = pending.filter(enqueued_attempt__gt=F("attempt")).aggregate(
        at=Min(Greatest("next_attempt_at", "enqueued_at"))
    )["at"]
    moments = [m for m in (unsent, sent + RESEND_AFTER if sent else None) if m is not None]
    return min(moments) if moments else None
