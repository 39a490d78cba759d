"""The run projection: how each run event changes a ``WorkflowRun`` row.

One pure function serves both the engine (which applies a segment's events
to the row in memory before saving it once) and ``kumiflow_rebuild`` (which
replays the log), so the live table and a rebuilt one cannot disagree.
"""

from __future__ import annotations

import uuid
from typing import Any

from kumiflow_django import run_events as ev
from kumiflow_django.context import new_state
from kumiflow_django.durations import parse_instant
from kumiflow_django.models.event import Event
from kumiflow_django.models.run import RunStatus, WorkflowRun


def _merge_trail(run: WorkflowRun, payload: dict[str, Any]) -> None:
    seen = set(run.trail)
    added = []
    for path in payload.get("trail") or ():
        if path not in seen:
            seen.add(path)
            added.append(path)
    if added:
        run.trail = [*run.trail, *added]


def _clear_wait(run: WorkflowRun) -> None:
    run.wake_at = None
    run.awaited_event_type = ""
    run.correlation_key = ""
    run.awaited_match = None
    run.awaited_after = None
    run.matched_position = None


def _instant(value: str | None) -> Any:
    return parse_instant(value) if value else None


def apply(run: WorkflowRun | None, event: Event) -> WorkflowRun:
    """The row after ``event``; ``run`` is None before run-started."""
    p = event.payload
    if event.type == ev.RUN_STARTED:
        deferred = p.get("mode") == "deferred"
        trigger = p.get("trigger") or {}
        run = WorkflowRun(
            id=uuid.UUID(event.stream_id),
            tenant_id=event.tenant_id,
            workflow=p["workflow"],
            workflow_version=p.get("version") or "",
            fingerprint=p["fingerprint"],
            status=RunStatus.PENDING if deferred else RunStatus.RUNNING,
            start_mode=p.get("mode", "inline"),
            cursor=None,
            state=new_state(),
            trail=[],
            wake_at=event.created_at if deferred else None,
            since_position=p.get("since", 0),
            since_gaps=p.get("since_gaps") or None,
            trigger_type=trigger.get("type", ""),
            trigger_position=trigger.get("position"),
            idempotency_key=p.get("idempotency_key"),
            input=p.get("input"),
            attempt=1,
            started_at=event.created_at,
            version=0,
        )
    if run is None:
        raise ValueError(f"event {event.type} at version {event.version} precedes run-started")
    run.version = event.version
    run.updated_at = event.created_at

    if event.type in (ev.STEP_WAITING, ev.STEP_WAITING_FOR_EVENT, ev.RETRY_SCHEDULED):
        _clear_wait(run)
        run.cursor = p["cursor"]
        run.state = p["state"]
        _merge_trail(run, p)
        if event.type == ev.STEP_WAITING:
            run.status = RunStatus.WAITING
            run.wake_at = _instant(p["wake_at"])
        elif event.type == ev.STEP_WAITING_FOR_EVENT:
            run.status = RunStatus.WAITING_EVENT
            run.wake_at = _instant(p.get("timeout_at"))
            run.awaited_event_type = p["event_type"]
            run.correlation_key = p["correlation_key"]
            run.awaited_match = p["match"]
            run.awaited_after = p["after"]
        else:
            run.status = RunStatus.RETRY_SCHEDULED
            run.wake_at = _instant(p["wake_at"])
            run.attempt = p["attempt"]
            run.last_error = p["error"]
    elif event.type == ev.EVENT_MATCHED:
        run.matched_position = p["event"]["position"]
        run.wake_at = event.created_at
    elif event.type == ev.RUN_WOKEN:
        run.wake_at = event.created_at
    elif event.type == ev.STEP_RESUMED:
        _clear_wait(run)
        run.status = RunStatus.RUNNING
        if p.get("recovered"):
            run.recoveries += 1
    elif event.type == ev.RUN_COMPLETED:
        _clear_wait(run)
        run.status = RunStatus.COMPLETED
        run.cursor = None
        run.result = p.get("result")
        run.finished_at = event.created_at
        _merge_trail(run, p)
    elif event.type == ev.RUN_FAILED:
        _clear_wait(run)
        run.status = RunStatus.FAILED
        run.cursor = p.get("cursor", run.cursor)
        run.last_error = p["error"]
        run.reason = p.get("reason", "")
        run.finished_at = event.created_at
        _merge_trail(run, p)
    elif event.type == ev.RUN_CANCELLED:
        _clear_wait(run)
        run.status = RunStatus.CANCELLED
        run.reason = "cancelled"
        run.last_error = p.get("reason", "")
        run.finished_at = event.created_at
    elif event.type == ev.RUN_RETRIED:
        restore = p["restore"]
        _clear_wait(run)
        run.status = restore["status"]
        run.cursor = restore["cursor"]
        run.state = restore["state"]
        run.attempt = restore.get("attempt", 1)
        awaited = restore.get("awaited")
        if awaited:
            run.awaited_event_type = awaited["event_type"]
            run.awaited_match = awaited["match"]
            run.correlation_key = awaited["correlation_key"]
            run.awaited_after = awaited["after"]
        run.matched_position = restore.get("matched_position")
        if "fingerprint" in p:
            run.fingerprint = p["fingerprint"]
            run.workflow_version = p.get("version") or ""
        run.reason = ""
        run.last_error = ""
        run.finished_at = None
        run.wake_at = event.created_at
    elif event.type == ev.RUN_RECOVERED:
        run.recoveries += 1
    elif event.type == ev.SEGMENT_REFUSED:
        if run.status == RunStatus.RUNNING:
            run.status = RunStatus.PENDING  # its first segment never committed
        run.wake_at = _instant(p["retry_at"])
        run.last_error = p["error"]
        if p.get("event"):
            run.matched_position = p["event"]["position"]
    return run
