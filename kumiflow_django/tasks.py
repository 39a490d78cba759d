"""Optional Django Tasks integration (``KUMIFLOW_TASKS_BACKEND``).

When the setting names a ``TASKS`` alias, every wake-up the engine knows of
at commit (a timer, a scheduled retry, an awaited event in worker mode, a
deferred start, an operator's wake or retry) is also enqueued as the task
:func:`wake_run` with ``run_after`` at the wake time. A project that already
runs a task worker (django-tasks-db, or Celery/RQ behind a ``django.tasks``
backend) then resumes runs with low latency. The resume loop stays the
source of truth: the task only calls ``resume_run``, which does nothing
unless the run is due, so a lost, early or repeated task loses and repeats
nothing. Needs ``django.tasks`` (Django 6.0 or later).

This module sits at the app's root because a queued task is stored by the
import path of its function: ``kumiflow_django.tasks.wake_run`` must not
move between releases.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.tasks import task

from kumiflow_django.conf import settings
from kumiflow_django.engine.resuming import resume_run
from kumiflow_django.store.telemetry import get_logger, log_fields
from kumiflow_django.store.wakeups import Work, WorkKind, on_committed

logger = get_logger("kumiflow_django.tasks")


@task
def wake_run(run_id: str) -> str:
    """Resume one run if it is due (idempotent)."""
    run = resume_run(uuid.UUID(run_id))
    return "resumed" if run is not None else "nothing to do"


def enqueue(alias: str, run_id: uuid.UUID, when: datetime | None) -> None:
    try:
        wake_run.using(backend=alias, run_after=when).enqueue(str(run_id))
    except Exception:  # the loop resumes the run anyway
        logger.warning(
            "run %s: enqueueing the wake-up task failed",
            run_id,
            exc_info=True,
            extra=log_fields(run_id=run_id),
        )


def _enqueue_wake_up(work: Work) -> None:
    alias = settings.TASKS_BACKEND
    if alias and work.kind == WorkKind.RESUME and work.run_id is not None:
        enqueue(alias, work.run_id, work.when)


on_committed(_enqueue_wake_up)
