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

from kumiflow_django.definition.step import path_text


@dataclass(frozen=True)
class TimerWait:
    """Wake the run at ``wake_at`` (``wait``)."""

    wake_at: datetime


@dataclass(frozen=True)
class EventWait:
    """Wake the run when an event matching ``match`` comes (``wait_for_event``,
    a delivery awaited), or at ``timeout_at``.

    ``after`` is the log position events must come after; the run's start
    gaps (positions in flight then) count as after it too.
    """

    event_type: str
    match: dict[str, Any]
    correlation_key: str
    timeout_at: datetime | None
    after: int


@dataclass(frozen=True)
class RetryWait:
    """Run the ``retry`` step's next attempt at ``wake_at``."""

    wake_at: datetime
    attempt: int
    max_attempts: int
    error: str


Wait = TimerWait | EventWait | RetryWait


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
