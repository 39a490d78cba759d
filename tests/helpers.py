"""Small helpers shared by the tests."""

from __future__ import annotations

from typing import Any

from kumiflow_django.models import Dispatch, Event, WorkflowRun

P = "kumiflow.workflow."


def run_events(run: WorkflowRun | Any) -> list[Event]:
    """The run's stream (of its tenant, when given the run: the id alone names a
    stream in every tenant)."""
    run_id = run.id if hasattr(run, "id") else run
    qs = Event.objects.filter(stream_id=str(run_id))
    if hasattr(run, "tenant_id"):
        qs = qs.filter(tenant_id=run.tenant_id)
    return list(qs.order_by("version"))


def types(run: WorkflowRun | Any, after: int = 0) -> list[str]:
    """The run stream's event types, without the common prefix."""
    return [e.type.removeprefix(P) for e in run_events(run) if e.version > after]


def dispatches(run: WorkflowRun) -> list[Dispatch]:
    return list(Dispatch.objects.filter(run_id=run.id).order_by("created_at", "step_path"))


def only_run(workflow: str | None = None) -> WorkflowRun:
    qs = WorkflowRun.objects.all()
    if workflow:
        qs = qs.filter(workflow=workflow)
    return qs.get()
