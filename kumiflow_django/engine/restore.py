"""Where a run begins again: the start of its failed segment.

A failed segment was rolled back as a whole: the run's last committed
suspension (and how it was woken) is where a retry, or the resume of a run
paused on exhausted retries, continues. Read from the run's stream.
"""

from __future__ import annotations

from typing import Any

from kumiflow_django.definition.context import new_state
from kumiflow_django.projections.runs import COMPENSATE, RunStatus, WorkflowRun
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import Event

_SUSPENSIONS = {
    ev.STEP_WAITING: RunStatus.WAITING,
    ev.STEP_WAITING_FOR_EVENT: RunStatus.WAITING_EVENT,
    ev.RETRY_SCHEDULED: RunStatus.RETRY_SCHEDULED,
    ev.STEP_WAITING_FOR_CHILD: RunStatus.WAITING,
    ev.STEP_WAITING_BRANCHES: RunStatus.WAITING,
    # the start of a compensation: a retry runs the compensations again
    ev.COMPENSATION_STARTED: RunStatus.WAITING,
}


def retry_point(run: WorkflowRun) -> dict[str, Any]:
    """Where the failed segment began: the last suspension (and how it was woken),
    or the start."""
    events = list(
        Event.objects.filter(stream_id=str(run.id), tenant_id=run.tenant_id).order_by("-version")
    )
    resumed: Event | None = None
    for event in events:
        if event.type == ev.STEP_RESUMED and resumed is None:
            resumed = event
        if event.type in _SUSPENSIONS:
            p = event.payload
            restore: dict[str, Any] = {
                "status": _SUSPENSIONS[event.type],
                "cursor": p.get("cursor", [COMPENSATE, 0]),
                "state": p["state"],
                "attempt": p.get("attempt", 1),
            }
            if event.type == ev.COMPENSATION_STARTED:
                restore["state"] = {
                    **p["state"],
                    "compensating": {k: p.get(k) for k in ("reason", "error", "then")},
                }
            if event.type == ev.STEP_WAITING_BRANCHES:
                restore["waits"] = p.get("waits") or []  # indexed again (RunWait)
            if event.type in (ev.STEP_WAITING_BRANCHES, ev.STEP_WAITING_FOR_CHILD):
                # the children that ended since are read again from the log
                children = [p["child_id"]] if "child_id" in p else p.get("children") or []
                restore["child_waits"] = len(children)
                restore["suspended_version"] = event.version
            if event.type == ev.STEP_WAITING_FOR_EVENT:
                restore["awaited"] = {
                    k: p[k]
                    for k in ("event_type", "match", "correlation_key", "after", "gaps")
                    if k in p
                }
                if resumed is not None and resumed.payload.get("event"):
                    restore["matched_position"] = resumed.payload["event"]["position"]
            return restore
    started = events[-1].payload if events and events[-1].type == ev.RUN_STARTED else {}
    restart = started.get("restart") or {}  # a restarted run begins at its from-step
    return {
        "status": RunStatus.PENDING,
        "cursor": restart.get("cursor"),
        "state": restart.get("state") or new_state(),
        "attempt": 1,
    }
