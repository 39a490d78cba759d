"""Starting runs: from a saved event (the trigger projection) or by hand.

A start runs in a savepoint of the caller's transaction. If the first
segment fails, the savepoint is rolled back and the run is recorded as
failed; the caller's own writes (the domain event) still commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django.db.models import Max

from kumiflow_django.conf import settings
from kumiflow_django.definition import matching
from kumiflow_django.definition.context import Trigger, TriggerEvent, Wake, WakeReason, new_state
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.snapshots import remember
from kumiflow_django.definition.triggers import EventTrigger
from kumiflow_django.definition.workflow import Workflow
from kumiflow_django.engine.failure import Failure
from kumiflow_django.engine.resuming import after_segment, writers_serialized
from kumiflow_django.engine.runner import Opening, Prepared, Steps, execute, keyed_run
from kumiflow_django.engine.segment import current_depth
from kumiflow_django.projections.runs import WorkflowRun
from kumiflow_django.store import db, limits, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store.db import is_transient
from kumiflow_django.store.errors import InvalidEvent, UnknownWorkflow
from kumiflow_django.store.log import check_text, resolve_tenant
from kumiflow_django.store.models import Event
from kumiflow_django.store.values import clean_text, to_json

logger = telemetry.get_logger("kumiflow_django.engine.starting")


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
    if payload is not None and not isinstance(payload, Mapping):
        raise InvalidEvent(
            f"the payload of {name!r} must be a mapping (a dict), not {type(payload).__name__}"
        )
    data = to_json(dict(payload or {}), f"the payload of {name!r}")
    trigger = TriggerEvent(type="manual", payload=data, tenant_id=tenant_id)
    key = idempotency_key
    if key is not None:
        check_text(key, "idempotency_key", MAX_KEY_LENGTH)
    else:
        try:
            key = _resolve_key(workflow, trigger)
        except Exception as exc:
            raise InvalidEvent(
                f"the idempotency key of {name!r} cannot be resolved from the payload: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    with db.atomic():
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
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # user code: SystemExit fails the run like any error
            if is_transient(exc):
                raise
            logger.warning(
                "workflow %s: trigger of event %s failed",
                workflow.name,
                event.position,
                extra=telemetry.log_fields(workflow=workflow.name, tenant=event.tenant_id),
            )
            failure = Failure(
                ev.STEP_FAILED, clean_text(f"{type(exc).__name__} in the trigger: {exc}", 600)
            )
        try:
            start_run(
                workflow,
                trigger=event,
                tenant=event.tenant_id,
                key=key,
                since=event.position,
                failure=failure,
            )
        except Exception as exc:
            if is_transient(exc):
                raise
            # Even the record of a refused start was refused: the appender's
            # transaction goes on (its event is in the log), the start is lost.
            logger.exception(
                "workflow %s: could not start for event %s (position %s)",
                workflow.name,
                event.type,
                event.position,
                extra=telemetry.log_fields(workflow=workflow.name, tenant=event.tenant_id),
            )


#: Longest idempotency key (the run table's column).
MAX_KEY_LENGTH = limits.IDEMPOTENCY_KEY


def _resolve_key(workflow: Workflow, event: Trigger) -> str | None:
    key = workflow.idempotency_key
    if key is None:
        return None
    value = key(event) if callable(key) else key
    return check_text(value, "the idempotency key", MAX_KEY_LENGTH)


def _trigger_ref(trigger: Trigger) -> dict[str, Any]:
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
    trigger: Trigger,
    tenant: str,
    key: str | None,
    since: int,
    input_: dict[str, Any] | None = None,
    failure: Failure | None = None,
) -> WorkflowRun:
    """Record a run (and run its first segment when inline); see module doc."""

    def prepare() -> Prepared:
        if key is not None:
            existing = keyed_run(tenant, workflow.name, key)
            if existing is not None:
                return existing
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
        if workflow.awaited and not writers_serialized():
            gaps = matching.gaps_below(since)
            if gaps:
                started["since_gaps"] = gaps
        reason = failure
        if reason is None and current_depth() >= settings.MAX_START_DEPTH:
            reason = Failure(
                ev.START_DEPTH_EXCEEDED,
                f"workflows started workflows {current_depth()} levels deep in one transaction "
                f"(KUMIFLOW_MAX_START_DEPTH={settings.MAX_START_DEPTH})",
            )
        steps = None
        if workflow.start_mode == "inline":
            steps = Steps(
                workflow, trigger, cursor=None, state=new_state(), wake=Wake(WakeReason.START)
            )
        return Opening(
            # Random, also for keyed runs: an id derived from the key would be
            # a stream id anyone could take first. The run table's unique key
            # (tenant, workflow, idempotency key) makes a second start a no-op.
            run_id=uuid.uuid4(),
            tenant=tenant,
            row=None,
            first=[(ev.RUN_STARTED, started)],
            steps=steps,
            failure=reason,
            key=key,
            workflow_name=workflow.name,
            # telemetry: the run's origin, stored on run-started
            trace=(telemetry.carried(trigger.metadata) or telemetry.carrier())
            if telemetry.tracing()
            else None,
        )

    remember(workflow)  # the definition the run starts on, for the console
    run = execute(prepare)
    assert run is not None  # a start always leaves a run (or finds the keyed one)
    after_segment(run)
    return run
