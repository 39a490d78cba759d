"""How a step tells the engine to stop: suspend the run, end it, or fail.

These travel as exceptions from the step up through the steps that contain
it (a ``branch``, a ``for_each``, a ``retry``) to the segment, which turns
them into the run's closing event. They are the engine's control flow, not
errors: step kinds raise them, the runner and the segment catch them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kumiflow_django.definition.durations import isoformat, parse_instant
from kumiflow_django.definition.step import path_text


@dataclass(frozen=True)
class TimerWait:
    """Wake the run at ``wake_at`` (``wait``)."""

    wake_at: datetime


@dataclass(frozen=True)
class EventWait:
    """Wake the run when an event matching ``match`` comes (``wait_for_event``,
    a delivery awaited), or at ``timeout_at``.

    ``after`` is the log position events must come after; ``gaps`` are
    positions at or below it whose events were not seen when the cut-off
    was taken (transactions in flight then): they count as after it too.
    None: the run's start gaps, when ``after`` is the run's start.
    """

    event_type: str
    match: dict[str, Any]
    correlation_key: str
    timeout_at: datetime | None
    after: int
    gaps: tuple[int, ...] | None = None


@dataclass(frozen=True)
class RetryWait:
    """Run the ``retry`` step's next attempt at ``wake_at``."""

    wake_at: datetime
    attempt: int
    max_attempts: int
    error: str


@dataclass(frozen=True)
class ChildWait:
    """Wake the run when its child run ``child_id`` ends (``child``)."""

    child_id: str


@dataclass(frozen=True)
class BranchesWait:
    """Branches of a ``parallel`` step (or of a parallel ``for_each``) wait, each
    for its own thing: the run is due at ``wake_at`` (the earliest timer, retry
    or timeout among them), when an event one of them awaits comes (``events``,
    with the branch that awaits each), or when a child one of them awaits ends."""

    wake_at: datetime | None
    events: tuple[tuple[str, EventWait], ...]
    children: tuple[str, ...] = ()


Wait = TimerWait | EventWait | RetryWait | ChildWait | BranchesWait


def wait_data(wait: Wait) -> dict[str, Any]:
    """A wait as the run's state keeps it (a branch's wait)."""
    if isinstance(wait, TimerWait):
        return {"kind": "timer", "wake_at": isoformat(wait.wake_at)}
    if isinstance(wait, RetryWait):
        return {"kind": "retry", "wake_at": isoformat(wait.wake_at)}
    if isinstance(wait, EventWait):
        return {
            "kind": "event",
            "event_type": wait.event_type,
            "match": wait.match,
            "correlation_key": wait.correlation_key,
            "timeout_at": isoformat(wait.timeout_at) if wait.timeout_at else None,
            "after": wait.after,
            **({"gaps": list(wait.gaps)} if wait.gaps is not None else {}),
        }
    if isinstance(wait, ChildWait):
        return {"kind": "child", "child_id": wait.child_id}
    return {
        "kind": "branches",
        "wake_at": isoformat(wait.wake_at) if wait.wake_at else None,
        "events": [[branch, wait_data(e)] for branch, e in wait.events],
        "children": list(wait.children),
    }


def event_wait(data: dict[str, Any]) -> EventWait:
    timeout = data.get("timeout_at")
    return EventWait(
        event_type=data["event_type"],
        match=data["match"],
        correlation_key=data["correlation_key"],
        timeout_at=parse_instant(timeout) if timeout else None,
        after=int(data["after"]),
        gaps=None if data.get("gaps") is None else tuple(int(g) for g in data["gaps"]),
    )


def deadline(data: dict[str, Any]) -> datetime | None:
    """When a branch's wait is over by the clock alone (None: only by an event or a child)."""
    when = data.get("timeout_at") if data["kind"] == "event" else data.get("wake_at")
    return parse_instant(when) if when else None


class Suspend(Exception):  # noqa: N818 - control flow, not an error
    """Raised by a step to suspend the run at ``cursor`` until ``wait`` is over."""

    def __init__(self, wait: Wait, cursor: list[Any]) -> None:
        super().__init__(type(wait).__name__)
        self.wait = wait
        self.cursor = cursor


class ReturnValue(Exception):  # noqa: N818 - control flow, not an error
    """Raised by ``return_`` to end the run with a result."""

    def __init__(self, value: Any) -> None:
        super().__init__("return")
        self.value = value


class StepError(Exception):
    """A step failed: carries the step's path and kind for the run's reason."""

    def __init__(self, path: list[Any], kind: str, name: str | None, error: BaseException) -> None:
        super().__init__(str(error))
        self.path = path
        self.kind = kind
        self.name = name
        self.error = error

    def describe(self) -> str:
        label = f"{self.kind} {self.name!r}" if self.name else self.kind
        message = str(self.error)
        if len(message) > 500:
            message = message[:500] + "…"
        return f"{type(self.error).__name__} at step {path_text(self.path)} ({label}): {message}"
