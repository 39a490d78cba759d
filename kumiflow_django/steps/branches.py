"""Branches: lists of steps of one run that advance independently.

``parallel`` and the parallel ``for_each`` keep one entry per branch in the
run's state: its status (``ready``, ``waiting``, ``done``, ``cancelled``),
its cursor below the branch and what it waits for. Every segment of the run
(the run row is the unit of locking: branches of one run never run at the
same time) looks at each waiting branch and runs those whose wait is over:

- a timer or a retry whose time has come;
- an awaited event: the event that woke the run, or (when the run woke for
  another reason) one the log has since the wait began, or the timeout;
- a child run that ended (reported to the run's state by the child);
- nested branches, whenever one of theirs may be.

A branch that suspends again records its new wait; the step suspends the
run with the union of its branches' waits (:class:`BranchesWait`), which
the engine indexes so that an event wakes the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kumiflow_django.definition import matching
from kumiflow_django.definition.context import Cancellation, Context, Wake, WakeReason
from kumiflow_django.definition.durations import parse_instant
from kumiflow_django.definition.step import Step, get_kind
from kumiflow_django.steps.control import (
    BranchesWait,
    Suspend,
    deadline,
    event_wait,
    wait_data,
)
from kumiflow_django.steps.runner import run_steps
from kumiflow_django.store import names as ev

READY, WAITING, DONE, CANCELLED = "ready", "waiting", "done", "cancelled"


def wake_for(wait: dict[str, Any], ctx: Context, *, full: bool) -> Wake | None:
    """Why a waiting branch goes on now, or None while its wait is not over.

    ``full``: the run woke for another reason than an event (a timer, a
    child, an operator), so awaited events are looked for in the log.
    """
    now = ctx.now
    kind = wait["kind"]
    if ctx.state.get("woken"):  # an operator woke the run: every wait is over
        full = True
    if kind in ("timer", "retry"):
        due = ctx.state.get("woken") or parse_instant(wait["wake_at"]) <= now
        if not due:
            return None
        return Wake(WakeReason.TIMER if kind == "timer" else WakeReason.RETRY)
    if kind == "child":
        return Wake(WakeReason.CHILD) if wait["child_id"] in ctx.state.get("settled", {}) else None
    if kind == "branches":
        return ctx.wake if _nested_ready(wait, ctx, full=full) else None
    # an event
    awaited = matching.Wait(
        wait["event_type"],
        ctx.tenant,
        wait["match"],
        matching.Cutoff.of(
            int(wait["after"]), wait.get("gaps"), ctx.since_position, ctx.since_gaps
        ),
    )
    event = ctx.wake.event if ctx.wake is not None else None
    if event is not None and awaited.accepts(event):
        return Wake(WakeReason.EVENT, event)
    timeout = deadline(wait)
    over = timeout is not None and (timeout <= now or ctx.state.get("woken"))
    if full or over:
        found = awaited.lookback()
        if found is not None:
            return Wake(WakeReason.EVENT, found)
    return Wake(WakeReason.TIMEOUT) if over else None


def _nested_ready(wait: dict[str, Any], ctx: Context, *, full: bool) -> bool:
    if full:
        return True
    when = wait.get("wake_at")
    if when and parse_instant(when) <= ctx.now:
        return True
    if any(child in ctx.state.get("settled", {}) for child in wait.get("children", [])):
        return True
    return any(wake_for(data, ctx, full=False) is not None for _, data in wait.get("events", []))


@dataclass
class Ran:
    """How running a branch ended: done, or waiting again (``suspended``)."""

    suspended: Suspend | None = None


def run_branch(
    ctx: Context,
    steps: tuple[Step, ...],
    prefix: list[Any],
    cursor: list[Any] | None,
    *,
    wake: Wake | None,
    scope: str,
) -> Ran:
    """Run one branch from ``cursor`` (None: its start) in the branch instance
    ``scope``, with ``wake`` as the wake its steps see."""
    saved_wake, saved_branch = ctx.wake, ctx.branch
    if wake is not None:
        ctx.wake = wake
    ctx.branch = scope
    try:
        run_steps(steps, ctx, prefix, cursor)
    except Suspend as suspended:
        return Ran(suspended)
    finally:
        ctx.wake, ctx.branch = saved_wake, saved_branch
    return Ran()


def relative(cursor: list[Any], prefix: list[Any]) -> list[Any]:
    """A cursor below a branch's prefix, as the branch keeps it."""
    return list(cursor[len(prefix) :])


def last_result(steps: tuple[Step, ...], ctx: Context) -> Any:
    """A branch's result: the result of its last step, if that step keeps one."""
    if not steps:
        return None
    last = steps[-1]
    if last.name is None or not get_kind(last.kind).stores_result:
        return None
    return ctx.steps.get(last.name)


def combined(waits: list[tuple[str, dict[str, Any]]]) -> BranchesWait:
    """What a step whose branches wait (``waits``: label, wait) suspends the run with."""
    moments: list[datetime] = []
    events = []
    children: list[str] = []
    for label, data in waits:
        if data["kind"] == "branches":
            if data.get("wake_at"):
                moments.append(parse_instant(data["wake_at"]))
            events += [(branch, event_wait(e)) for branch, e in data["events"]]
            children += data.get("children", [])
            continue
        when = deadline(data)
        if when is not None:
            moments.append(when)
        if data["kind"] == "event":
            events.append((label, event_wait(data)))
        elif data["kind"] == "child":
            children.append(data["child_id"])
    return BranchesWait(
        wake_at=min(moments) if moments else None, events=tuple(events), children=tuple(children)
    )


def branch_wait(suspended: Suspend) -> dict[str, Any]:
    return wait_data(suspended.wait)


def cancellations(wait: dict[str, Any]) -> list[Cancellation]:
    """What a cancelled branch leaves behind, from what it waits for: its task,
    its awaited delivery, its child run (nested branches: theirs)."""
    kind = wait["kind"]
    if kind == "child":
        return [Cancellation("child", wait["child_id"])]
    if kind == "branches":
        found = [Cancellation("child", child) for child in wait.get("children", [])]
        for _, data in wait.get("events", []):
            found += cancellations(data)
        return found
    if kind == "event" and wait["event_type"] in (ev.TASK_SETTLED, ev.SETTLED):
        what = "task" if wait["event_type"] == ev.TASK_SETTLED else "dispatch"
        return [Cancellation(what, str(wait["match"].get("stream_id")))]
    return []


def cancel(ctx: Context, entries: list[dict[str, Any]]) -> None:
    """Mark branches cancelled and ask the segment to cancel what they left."""
    for entry in entries:
        if entry.get("status") == WAITING:
            ctx.effects.extend(cancellations(entry["wait"]))
        entry.clear()
        entry["status"] = CANCELLED


Join = Callable[[int, int], bool]


def join_rule(join: Any) -> Join:
    """``join``: "all", "any" or a number N; as a test of (done, total)."""
    if join == "all":
        return lambda done, total: done >= total
    if join == "any":
        return lambda done, total: done >= min(1, total)
    return lambda done, total: done >= min(int(join), total)


def check_join(join: Any, branches: int | None) -> None:
    if join in ("all", "any"):
        return
    if not isinstance(join, int) or isinstance(join, bool) or join < 1:
        raise ValueError(f'join must be "all", "any" or a number of branches, not {join!r}')
    if branches is not None and join > branches:
        raise ValueError(f"join={join} is more than the {branches} branches")
