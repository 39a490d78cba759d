"""Starting runs: from a saved event (the trigger projection) or by hand.

A start runs in a savepoint of the caller's transaction. If the first
segment fails, the savepoint is rolled back and the run is recorded as
failed; the caller's own writes (the domain event) still commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from kumiflow_django.definition.context import Trigger, TriggerEvent
from kumiflow_django.definition.durations import isoformat, parse_duration
from kumiflow_django.definition.flow import resolve_key
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.snapshots import remember
from kumiflow_django.definition.triggers import EventTrigger
from kumiflow_django.definition.workflow import Workflow
from kumiflow_django.engine.failure import Failure, user_code
from kumiflow_django.engine.resuming import after_segment
from kumiflow_django.engine.run_start import RestartFrom, RunStart, trigger_ref
from kumiflow_django.engine.runner import start
from kumiflow_django.engine.segment import Segment
from kumiflow_django.flow.admission import DEBOUNCE, lock_bucket, lock_key
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.store import clock, db, limits, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store.db import for_update, is_transient
from kumiflow_django.store.errors import InvalidEvent, UnknownWorkflow
from kumiflow_django.store.log import PRIORITY_METADATA, check_priority, check_text, resolve_tenant
from kumiflow_django.store.models import Event
from kumiflow_django.store.values import to_json
from kumiflow_django.store.wakeups import WorkKind, work_committed

logger = telemetry.get_logger("kumiflow_django.engine.starting")


def start_workflow(
    name: str,
    *,
    payload: dict[str, Any] | None = None,
    tenant: str | None = None,
    idempotency_key: str | None = None,
    version: str | None = None,
    priority: int | None = None,
) -> WorkflowRun:
    """Start a run by hand; ``ctx.event.payload`` is ``payload``.

    With an ``idempotency_key`` (or the workflow's own key, resolved against
    the payload), a second start returns the first run and runs nothing.
    ``priority`` (-100 to 100) overrides the workflow's.
    """
    if priority is not None:
        check_priority(priority)
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
    with db.atomic(takes_nested=True):  # the run's savepoint is released with this one
        since = Event.objects.last_position()
        return start_run(
            workflow,
            trigger=trigger,
            tenant=tenant_id,
            key=key,
            since=since,
            input_=data,
            priority=priority,
        )


def start_triggered(event: Event) -> None:
    """Start every current workflow whose ``on_event`` trigger matches ``event``."""
    for workflow in registry.for_event(event.type):
        trigger = workflow.trigger
        assert isinstance(trigger, EventTrigger)
        failure: Failure | None = None
        key: str | None = None
        try:
            with user_code(ev.STEP_FAILED, "in the trigger"):
                if trigger.filter is not None and not trigger.filter(event):
                    continue
                key = _resolve_key(workflow, event)
        except Failure as failed:
            logger.warning(
                "workflow %s: trigger of event %s failed",
                workflow.name,
                event.position,
                extra=telemetry.log_fields(workflow=workflow.name, tenant=event.tenant_id),
            )
            failure = failed
        try:
            if failure is None and trigger.grouped:
                group = _group_key(workflow, trigger, event)
                if isinstance(group, Failure):
                    failure = group
                elif trigger.throttle is not None:
                    with db.atomic():  # a savepoint: a refusal here spares the append
                        skipped = _throttled(workflow, trigger.throttle, event, group)
                    if skipped:
                        continue
                else:
                    with db.atomic():
                        _debounce(workflow, trigger, event, group, key)
                    continue
            start_run(
                workflow,
                trigger=event,
                tenant=event.tenant_id,
                key=key,
                since=event.position,
                failure=failure,
                priority=_priority_of(event),
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


def _priority_of(event: Event) -> int | None:
    """The priority an event's ``append_event(priority=)`` asked for, if any."""
    value = (
        (event.metadata or {}).get(PRIORITY_METADATA) if isinstance(event.metadata, dict) else None
    )
    try:
        return None if value is None else check_priority(value)
    except InvalidEvent:
        return None


def _group_key(workflow: Workflow, trigger: EventTrigger, event: Event) -> str | Failure:
    """The key a debounce or a throttle groups the event under ("*": one group)."""
    if trigger.key is None:
        return "*"
    try:
        with user_code(ev.FLOW_KEY_FAILED, "resolving the trigger's key"):
            return resolve_key(trigger.key, event, "the trigger's key")
    except Failure as failed:
        return failed


def _grouped_scope(tenant: str, workflow: str) -> str:
    """The scope of a debounce's or a throttle's groups: per tenant and workflow,
    unambiguous whatever characters the two contain (the tenant's length first)."""
    return f"{len(tenant)}:{tenant}:{workflow}"


def _throttled(workflow: Workflow, period: str, event: Event, group: str) -> bool:
    """Whether a throttle skips this event: a run of the key started less than
    ``period`` ago. The skipped events are counted on the key's bucket."""
    now = clock.now()
    bucket = lock_bucket("throttle:" + _grouped_scope(event.tenant_id, workflow.name), group, now)
    if bucket.count and now < bucket.window_start + parse_duration(period):
        bucket.skipped += 1
        bucket.skipped_positions = [*bucket.skipped_positions, event.position][-THROTTLE_KEPT:]
        bucket.save(update_fields=["skipped", "skipped_positions"])
        logger.info(
            "workflow %s: throttled, event %s skipped (key %r)",
            workflow.name,
            event.position,
            group,
            extra=telemetry.log_fields(workflow=workflow.name, tenant=event.tenant_id),
        )
        return True
    bucket.window_start, bucket.count = now, bucket.count + 1
    bucket.save(update_fields=["window_start", "count"])
    return False


#: The positions of skipped events a throttle keeps (their count is kept whole).
THROTTLE_KEPT = 50


def _debounce(
    workflow: Workflow, trigger: EventTrigger, event: Event, group: str, key: str | None
) -> None:
    """The run of the key's burst starts with its last event, once the key has
    been quiet for ``debounce`` (or ``max_wait`` after its first event)."""
    assert trigger.debounce is not None
    now = clock.now()
    lock_key("debounce", _grouped_scope(event.tenant_id, workflow.name), group)  # one burst
    until = now + parse_duration(trigger.debounce)
    queued = for_update(
        WorkflowRun.objects.filter(
            tenant_id=event.tenant_id,
            workflow=workflow.name,
            debounce_key=group,
            status=RunStatus.QUEUED,
            held_by=DEBOUNCE,
        )
    ).first()
    if queued is not None and queued.status == RunStatus.QUEUED and queued.held_by == DEBOUNCE:
        if trigger.max_wait is not None:
            until = min(until, queued.started_at + parse_duration(trigger.max_wait))
        segment = Segment(queued.id, queued.tenant_id, queued)
        payload: dict[str, Any] = {
            "trigger": trigger_ref(event),
            "since": event.position,
            "until": isoformat(until),
        }
        segment.add(ev.RUN_DEBOUNCED, payload)
        segment.write()
        work_committed(WorkKind.RESUME, until, queued.id)
        return
    start_run(
        workflow,
        trigger=event,
        tenant=event.tenant_id,
        key=key,
        since=event.position,
        priority=_priority_of(event),
        debounce={"debounce_key": group, "held": {"why": DEBOUNCE, "until": isoformat(until)}},
    )


#: Longest idempotency key (the run table's column).
MAX_KEY_LENGTH = limits.IDEMPOTENCY_KEY


def _resolve_key(workflow: Workflow, event: Trigger) -> str | None:
    key = workflow.idempotency_key
    if key is None:
        return None
    value = key(event) if callable(key) else key
    return check_text(value, "the idempotency key", MAX_KEY_LENGTH)


def start_run(
    workflow: Workflow,
    *,
    trigger: Trigger,
    tenant: str,
    key: str | None,
    since: int,
    input_: dict[str, Any] | None = None,
    failure: Failure | None = None,
    priority: int | None = None,
    debounce: dict[str, Any] | None = None,
    restart: RestartFrom | None = None,
    run_id: uuid.UUID | None = None,
) -> WorkflowRun:
    """Record a run (and run its first segment when inline): one
    :class:`~kumiflow_django.engine.run_start.RunStart`, then the loops are
    told of what it left behind.

    Under flow control the run may be recorded as queued (a full key, a used
    up rate, a debounce): then nothing of it runs now.
    """
    remember(workflow)  # the definition the run starts on, for the console
    run = start(
        RunStart(
            workflow,
            trigger,
            tenant,
            since,
            key=key,
            input=input_,
            priority=priority,
            failure=failure,
            debounce=debounce,
            restart=restart,
            run_id=run_id or uuid.uuid4(),
        )
    )
    assert run is not None  # a start always leaves a run (or finds the keyed one)
    after_segment(run)
    return run
