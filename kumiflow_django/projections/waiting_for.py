"""What a waiting run waits for, in the words the docs use (docs/concepts.md).

A run whose step suspends on an event has the status ``waiting_event`` and
keeps the awaited event type on its row. Two of those events are the
engine's own: a task step awaits ``kumiflow.task.settled`` (its task) and a
webhook step that wants the answer awaits ``kumiflow.step.dispatch-settled`` (its
delivery). Read raw, the console and the API would say "waiting for event
kumiflow.task.settled"; :func:`waiting_for` says "waiting for task charge".
The console's run list and run page and the HTTP API's run all ask it, so
the three say the same thing. It reads the row and the registered
definitions only (no query), so that a page of runs costs no more.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from kumiflow_django.definition.registry import registry
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.projections.waits import RunWait, own_wait
from kumiflow_django.store import names as ev

Kind = Literal["task", "delivery", "event"]


class WaitingFor(TypedDict):
    #: ``task`` (a task step's task), ``delivery`` (an outbox dispatch) or ``event``.
    kind: Kind
    #: The path of the waiting step (``1``, ``3.then.0``).
    path: str
    #: The step's name where it has one (a task step always has).
    step: str | None
    #: The awaited event type as stored (``kumiflow.task.settled`` for a task).
    event_type: str
    #: The task's or the dispatch's id (their stream); None for an event.
    id: str | None
    #: The phrase the console shows: ``waiting for task charge``.
    text: str


def _step_name(run: WorkflowRun) -> str | None:
    """The name of the step at the run's cursor, in the definition it runs on."""
    if not run.cursor:
        return None
    candidates = [w for w in registry.all_versions() if w.name == run.workflow]
    same = [w for w in candidates if w.fingerprint == run.fingerprint]
    versioned = [w for w in candidates if w.version == (run.workflow_version or None)]
    for workflow in same or versioned:
        try:
            return workflow.step_at(list(run.cursor)).name
        except ValueError:
            return None
    return None


_UNREAD: Any = object()


def waiting_for(run: WorkflowRun, wait: RunWait | None = _UNREAD) -> WaitingFor | None:
    """What the run waits for, or None when it does not wait for an event.
    ``wait``: the run's own wait when the caller has read it already (a list
    page reads them in one query, :func:`own_waits`)."""
    if run.status != RunStatus.WAITING_EVENT:
        return None
    if wait is _UNREAD:
        wait = getattr(run, "own_wait", _UNREAD)
        if wait is _UNREAD:
            wait = own_wait(run)
    if wait is None or not wait.event_type:
        return None
    event_type = wait.event_type
    path = run.cursor_text
    name = _step_name(run)
    match: Any = wait.match if isinstance(wait.match, dict) else {}
    stream = match.get("stream_id")
    kind: Kind
    if event_type == ev.TASK_SETTLED:
        kind, what = "task", f"task {name or path}"
    elif event_type == ev.SETTLED:
        kind, what = "delivery", f"delivery {name}" if name else f"the delivery of step {path}"
    else:
        kind, what, stream = "event", f"event {event_type}", None
    return {
        "kind": kind,
        "path": path,
        "step": name,
        "event_type": event_type,
        "id": str(stream) if stream is not None else None,
        "text": f"waiting for {what}",
    }
