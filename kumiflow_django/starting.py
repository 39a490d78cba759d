"""Starting runs: from a saved event (the trigger projection) or by hand.

A start runs in a savepoint of the caller's transaction. If the first
segment fails, the savepoint is rolled back and the run is recorded as
failed; the caller's own writes (the domain event) still commit.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max

from kumiflow_django import run_events as ev
from kumiflow_django import wakeups
from kumiflow_django.conf import settings
from kumiflow_django.context import TriggerEvent, Wake, new_state
from kumiflow_django.definition import EventTrigger, Workflow
from kumiflow_django.engine import (
    Failure,
    Segment,
    advance,
    current_depth,
    is_transient,
    keyed_run_id,
    record_failure,
)
from kumiflow_django.eventstore import resolve_tenant
from kumiflow_django.exceptions import InvalidEvent, UnknownWorkflow
from kumiflow_django.jsonvalues import to_json
from kumiflow_django.models.event import Event
from kumiflow_django.models.run import RunStatus, WorkflowRun
from kumiflow_django.registry import registry

logger = logging.getLogger("kumiflow_django.starting")


def start_workflow(
    name: str,
    *,
    payload: dict[str, Any] | None = None,
    tenant: str | None = None,
    idempotency_key: str | None = None,
    version: str | None = None,
) -> WorkflowRun:
    """Start a run by hand; ``ctx.event.payload`` is ``payload``.

    With an ``idempotency_key`` (or the workflow's own key, resolved against
    the payload), a second start returns the first run and runs nothing.
    """
    workflow = registry.get(name) if version is None else registry.find(name, version)
    if workflow is None:
        raise UnknownWorkflow(f"no workflow named {name!r} with version {version!r} is registered")
    tenant_id = resolve_tenant(tenant)
    data = to_json(payload or {}, f"the payload of {name!r}")
    if not isinstance(data, dict):
        raise InvalidEvent(f"the payload of {name!r} must be a mapping")
    trigger = TriggerEvent(type="manual", payload=data, tenant_id=tenant_id)
    key = idempotency_key
    if key is None:
        try:
            key = _resolve_key(workflow, trigger)
        except Exception as exc:
            raise InvalidEvent(
                f"the idempotency key of {name!r} cannot be resolved from the payload: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    with transaction.atomic():
        since = Event.objects.aggregate(m=Max("position"))["m"] or 0
        return start_run(
            workflow,
            trigger=trigger,
            tenant=tenant_id,
            key=key,
            since=since,
            input_=data,
        )


def start_triggered(event: Event) -> None:
    """Start every current workflow whose ``on_event`` trigger matches ``event``."""
    for workflow in registry.for_event(event.type):
        trigger = workflow.trigger
        assert isinstance(trigger, EventTrigger)
        failure: Failure | None = None
        key: str | None = None
        try:
            if trigger.filter is not None and not trigger.filter(event):
                continue
            key = _resolve_key(workflow, event)
        except Exception as exc:
            if is_transient(exc):
                raise
            logger.warning("workflow %s: trigger of event %s failed", workflow.name, event.position)
            failure = Failure(ev.STEP_FAILED, f"{type(exc).__name__} in the trigger: {exc}"[:600])
        start_run(
            workflow,
            trigger=event,
            tenant=event.tenant_id,
            key=key,
            since=event.position,
            failure=failure,
        )


def _resolve_key(workflow: Workflow, event: Any) -> str | None:
    key = workflow.idempotency_key
    if key is None:
        return None
    value = key(event) if callable(key) else key
    if not isinstance(value, str) or not value or len(value) > 200:
        raise ValueError(f"the idempotency key must be a string of 1 to 200 characters: {value!r}")
    return value


def _trigger_ref(trigger: Any) -> dict[str, Any]:
    ref: dict[str, Any] = {"type": trigger.type}
    if isinstance(trigger, Event):
        ref.update(
            position=trigger.position,
            event_id=str(trigger.event_id),
            stream_id=trigger.stream_id,
            version=trigger.version,
        )
    return ref


def start_run(
    workflow: Workflow,
    *,
    trigger: Any,
    tenant: str,
    key: str | None,
    since: int,
    input_: dict[str, Any] | None = None,
    failure: Failure | None = None,
    run_id: uuid.UUID | None = None,
) -> WorkflowRun:
    """Record a run (and run its first segment when inline); see module doc."""
    if key is not None:
        run_id = keyed_run_id(tenant, workflow.name, key)
        existing = WorkflowRun.objects.filter(pk=run_id).first()
        if existing is not None:
            return existing
    run_id = run_id or uuid.uuid4()
    if failure is None and current_depth() >= settings.MAX_START_DEPTH:
        failure = Failure(
            ev.START_DEPTH_EXCEEDED,
            f"workflows started workflows {current_depth()} levels deep in one transaction "
            f"(KUMIFLOW_MAX_START_DEPTH={settings.MAX_START_DEPTH})",
        )
    started: dict[str, Any] = {
        "workflow": workflow.name,
        "version": workflow.version,
        "fingerprint": workflow.fingerprint,
        "mode": workflow.start_mode,
        "trigger": _trigger_ref(trigger),
        "since": since,
    }
    if key is not None:
        started["idempotency_key"] = key
    if input_ is not None:
        started["input"] = input_
    try:
        if failure is not None:
            raise failure
        with transaction.atomic():
            segment = Segment(run_id, tenant)
            segment.add(ev.RUN_STARTED, dict(started))
            if workflow.start_mode == "inline":
                advance(
                    segment, workflow, trigger, cursor=None, state=new_state(), wake=Wake("start")
                )
            run = segment.persist()
    except Failure as failed:
        try:
            with transaction.atomic():
                segment = Segment(run_id, tenant)
                segment.add(ev.RUN_STARTED, dict(started))
                record_failure(segment, failed)
                run = segment.persist()
        except IntegrityError:
            if key is None:
                raise
            return WorkflowRun.objects.get(pk=run_id)  # a concurrent start won
        logger.warning("run %s of %s failed: %s", run_id, workflow.name, failed)
    except IntegrityError:
        if key is None:
            raise
        return WorkflowRun.objects.get(pk=run_id)  # a concurrent start with the key won
    after_segment(run)
    return run


def after_segment(run: WorkflowRun) -> None:
    """Tell the loops (after commit) about work a segment left behind."""
    if run.status == RunStatus.WAITING_EVENT:
        from kumiflow_django import resuming

        resuming.recheck_after_commit(run)
    if run.wake_at is not None:
        wakeups.work_committed("resume", run.wake_at, run.id)
