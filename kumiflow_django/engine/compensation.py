"""Compensation (saga): undoing completed steps when a run fails or is cancelled.

A step declares ``compensate=[...]``; when it completes, the run's state
records it (its path, the loop scope it ran in), in order of completion.
When a later step fails the run, the failed segment is rolled back as a
whole (its own completed steps left no trace), and the run does not end:
``compensation-started`` makes it due, and the resume loop runs the
compensations of the steps recorded in committed segments, the last one
first, as steps of the run: each may wait, retry or run a task, across as
many segments as it needs. Then the run ends ``failed`` (or ``cancelled``,
for ``cancel_run(..., compensate=True)``) with the outcome ``compensated``;
a compensation that fails ends it with ``compensation_failed``.

The run's cursor while compensating is ``[COMPENSATE, k, ...]``: the k-th
compensation to run, and the position inside it.
"""

from __future__ import annotations

from typing import Any

from kumiflow_django.definition.context import Context
from kumiflow_django.definition.workflow import Workflow
from kumiflow_django.engine.failure import Failure
from kumiflow_django.projections.runs import COMPENSATE, Compensation, WorkflowRun
from kumiflow_django.steps.control import Suspend
from kumiflow_django.steps.runner import run_steps
from kumiflow_django.store import names as ev
from kumiflow_django.store import payloads as pl


def active(cursor: list[Any] | None) -> bool:
    """Whether a run at ``cursor`` runs its compensations."""
    return bool(cursor) and cursor[0] == COMPENSATE  # type: ignore[index]


def pending(state: dict[str, Any] | None) -> list[dict[str, Any]]:
    return list((state or {}).get("compensations") or [])


def start(row: WorkflowRun, failure: Failure) -> tuple[str, pl.CompensationStarted] | None:
    """The event that starts compensating instead of failing ``row`` (None: fail it)."""
    if not failure.compensable or active(row.cursor) or not pending(row.state):
        return None
    return begin(row, then="failed", reason=failure.reason, error=failure.error)


def begin(
    row: WorkflowRun, *, then: str, reason: str, error: str
) -> tuple[str, pl.CompensationStarted]:
    started: pl.CompensationStarted = {
        "then": then,
        "reason": reason,
        "error": error[:2000],
        "steps": [entry["path"] for entry in reversed(pending(row.state))],
        "state": row.state,
    }
    return ev.COMPENSATION_STARTED, started


def check(workflow: Workflow, cursor: list[Any], state: dict[str, Any]) -> None:
    """ValueError when a compensating run's cursor or state does not fit ``workflow``."""
    entries = pending(state)
    if len(cursor) < 2 or not isinstance(cursor[1], int) or not 0 <= cursor[1] <= len(entries):
        raise ValueError(f"the compensation cursor {cursor} does not fit the run")
    for entry in entries:
        if "compensate" not in workflow.step_at(entry["path"]).children:
            raise ValueError(f"step {entry['path']} has no compensation")


def run(workflow: Workflow, ctx: Context, cursor: list[Any]) -> None:
    """Run the compensations from ``cursor`` on, the last completed step's first."""
    entries = pending(ctx.state)
    k = int(cursor[1])
    inner: list[Any] | None = list(cursor[2:]) if len(cursor) > 2 else None
    ctx.compensating = True
    while k < len(entries):
        entry = entries[len(entries) - 1 - k]
        step = workflow.step_at(entry["path"])
        prefix = [*entry["path"], "compensate"]
        ctx.scope = dict(entry.get("scope") or {})
        ctx.branch = entry.get("branch") or ""
        try:
            run_steps(step.children["compensate"], ctx, prefix, inner)
        except Suspend as suspended:
            raise Suspend(
                suspended.wait, [COMPENSATE, k, *suspended.cursor[len(prefix) :]]
            ) from None
        finally:
            ctx.scope, ctx.branch = {}, ""
        inner = None
        k += 1


def ended(state: dict[str, Any], trail: list[str]) -> tuple[str, pl.Payload]:
    """The run's closing event once every compensation ran."""
    info = state.get("compensating") or {}
    if info.get("then") == "cancelled":
        cancelled: pl.RunCancelled = {
            "reason": info.get("error") or "cancelled",
            "compensation": Compensation.COMPENSATED,
        }
        return ev.RUN_CANCELLED, cancelled
    failed: pl.RunFailed = {
        "error": info.get("error") or "",
        "reason": info.get("reason") or ev.STEP_FAILED,
        "trail": trail,
        "compensation": Compensation.COMPENSATED,
    }
    return ev.RUN_FAILED, failed


def failed(state: dict[str, Any], error: str, path: list[Any], trail: list[str]) -> Failure:
    """The failure a run ends with when one of its compensations fails."""
    info = state.get("compensating") or {}
    first = info.get("error") or "the run failed"
    return Failure(
        info.get("reason") or ev.STEP_FAILED,
        f"{first}\nThen a compensation failed: {error}",
        path,
        trail,
        compensation=Compensation.FAILED,
    )
