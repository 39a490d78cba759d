"""What the tests of task steps share: the probes' calls, waiting for a run."""

from __future__ import annotations

import time
import uuid
from typing import Any

from kumiflow_django.models import StepTask, WorkflowRun
from kumiflow_django.store.models import Event
from testproject.shop import tasks as probes


def calls(key: str) -> list[dict[str, Any]]:
    """The calls the probe ``key`` recorded, in order (any process)."""
    return list(
        Event.objects.filter(stream_id=f"task-calls-{key}")
        .order_by("version")
        .values_list("payload", flat=True)
    )


def run_of(run: WorkflowRun | uuid.UUID) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=getattr(run, "pk", run))


def task_of(run: WorkflowRun) -> StepTask:
    return StepTask.objects.get(run_id=run.pk)


def wait_until(condition, timeout: float = 30.0, what: str = "a condition") -> None:
    """Poll ``condition`` (a result another thread or process produces)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def started(key: str, timeout: float = 30.0) -> None:
    """Wait until the in-process probe ``key`` signalled that it runs."""
    assert probes._event(probes.started, key).wait(timeout), f"probe {key} never started"


def release(key: str) -> None:
    probes._event(probes.release, key).set()


def fresh_key() -> str:
    return uuid.uuid4().hex[:12]
