"""Tasks: work run outside the segment's transaction, and Django Tasks.

- :mod:`.context`: what a task's function sees (``current_task()``);
- :mod:`.attempts`: one attempt: claim, run, record; giving up a lost one;
- :mod:`.backends`: handing attempts to a Django Tasks backend.

The task rows and their fold live in :mod:`kumiflow_django.projections.tasks`;
the step in :mod:`kumiflow_django.steps.task`; kumiflow's own task pool in
:mod:`kumiflow_django.workers.tasks`.

This package is also where kumiflow's Django tasks live, because a queued
task is stored by the import path of its function, which must not move
between releases:

- :func:`run_attempt` runs one attempt of a task step whose function is a
  Django Tasks ``Task``, on that task's backend;
- :func:`wake_run` (``KUMIFLOW_TASKS_BACKEND``): every wake-up the engine
  knows of at commit (a timer, a scheduled retry, an awaited event in worker
  mode, a deferred start, an operator's wake or retry) is also enqueued with
  ``run_after`` at the wake time, so a project that runs a task worker
  resumes runs with low latency. The resume loop stays the source of truth:
  the task only calls ``resume_run``, which does nothing unless the run is
  due, so a lost, early or repeated task loses and repeats nothing.

Both need ``django.tasks`` (Django 6.0+) or the ``django-tasks`` backport.
"""

from __future__ import annotations

import importlib
import os
import socket
import uuid
from datetime import datetime
from typing import Any, cast

from kumiflow_django.conf import settings
from kumiflow_django.engine.resuming import resume_run
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.wakeups import Work, WorkKind, on_committed
from kumiflow_django.tasks import attempts, backends

logger = get_logger("kumiflow_django.tasks")


def _task_class() -> Any:
    """Django's ``Task`` (6.0+), or the django-tasks backport's on 5.2, or None."""
    for module in ("django.tasks", "django_tasks.base"):
        try:
            return importlib.import_module(module).Task
        except (ImportError, AttributeError):
            continue
    return None


Task: Any = _task_class()


def wake_run(run_id: str) -> str:
    """Resume one run if it is due (idempotent)."""
    run = resume_run(uuid.UUID(run_id))
    return "resumed" if run is not None else "nothing to do"


def run_attempt(task_id: str, attempt: int) -> dict[str, Any]:
    """Claim attempt ``attempt`` of a task, run it here, record its outcome."""
    worker = f"django-tasks:{socket.gethostname()}:{os.getpid()}"
    claimed = attempts.claim(uuid.UUID(task_id), worker=worker, attempt=attempt)
    if claimed is None:
        return {"task": task_id, "attempt": attempt, "outcome": "not due or already taken"}
    outcome = attempts.run(claimed)
    attempts.record(claimed, outcome)
    return {"task": task_id, "attempt": attempt, "ok": outcome.ok}


if Task is not None:
    # Built as ``Task(func=...)`` under the function's own name: a queued task is
    # found again by its function's import path, which must lead to a ``Task`` of
    # this Django's own class whatever the backend (the decorator would pick the
    # class of the default backend).
    wake_run = Task(func=wake_run)
    run_attempt = Task(func=run_attempt)


def runner_task() -> Any | None:
    """The Django ``Task`` that runs attempts on a backend (None without ``django.tasks``)."""
    return run_attempt if Task is not None else None


def enqueue(alias: str, run_id: uuid.UUID, when: datetime | None) -> None:
    """Enqueue the wake-up task of a run (``KUMIFLOW_TASKS_BACKEND``)."""
    try:
        cast(Any, wake_run).using(backend=alias, run_after=when).enqueue(str(run_id))
    except Exception:  # the loop resumes the run anyway
        logger.warning("run %s: enqueueing the wake-up task failed", run_id, exc_info=True)


def _after_commit(work: Work) -> None:
    if work.kind == WorkKind.RESUME and work.run_id is not None:
        alias = settings.TASKS_BACKEND
        if alias:
            enqueue(alias, work.run_id, work.when)
    elif work.kind == WorkKind.TASK and work.item is not None:
        backends.enqueue(run_attempt, work.item)


if Task is not None:
    on_committed(_after_commit)
