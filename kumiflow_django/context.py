"""What a step and its resolvers see while a run advances."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kumiflow_django import clock


@dataclass(frozen=True)
class TriggerEvent:
    """The trigger of a run that no stored event started (manual start, cron).

    It has the attributes of :class:`~kumiflow_django.models.Event` that
    resolvers read, so ``ctx.event.payload`` works for every run.
    """

    type: str
    payload: dict[str, Any]
    tenant_id: str
    stream_id: str = ""
    stream_type: str = ""
    version: int = 0
    position: int | None = None
    event_id: uuid.UUID | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None


@dataclass(frozen=True)
class RunInfo:
    id: uuid.UUID
    workflow: str
    version: str | None
    tenant: str
    fingerprint: str


@dataclass(frozen=True)
class Wake:
    """Why a suspended run continues: the step it stopped at reads this."""

    reason: str  # "timer", "event", "timeout", "retry", "start", "manual"
    event: Any = None  # the awaited Event, when reason == "event"


class Context:
    """The resolver context: the trigger event, step results, loop scope, run and clock."""

    def __init__(
        self,
        *,
        event: Any,
        run: RunInfo,
        state: dict[str, Any],
        wake: Wake | None = None,
        depth: int = 0,
        since_position: int = 0,
        since_gaps: tuple[int, ...] = (),
    ) -> None:
        self.event = event
        self.run = run
        self.state = state
        self.steps: dict[str, Any] = state["steps"]
        self.scope: dict[str, Any] = {}
        self.wake = wake
        self.depth = depth
        #: Awaited events are looked for after this log position (the run's start).
        self.since_position = since_position
        #: Positions below it whose transactions were still open then.
        self.since_gaps = since_gaps
        #: Static paths of the steps this segment ran (for the admin's picture).
        self.trail: list[str] = []
        #: Extra work the segment commits with the run: ``(kind, data)`` pairs.
        self.effects: list[tuple[str, dict[str, Any]]] = []
        self._attempts: list[int] = []

    @property
    def tenant(self) -> str:
        return self.run.tenant

    @property
    def attempt(self) -> int:
        """The attempt number of the innermost ``retry`` (1 outside any)."""
        return self._attempts[-1] if self._attempts else 1

    @property
    def now(self) -> datetime:
        return clock.now()

    @property
    def clock(self) -> clock.Clock:
        return clock.get_clock()

    def push_attempt(self, attempt: int) -> None:
        self._attempts.append(attempt)

    def pop_attempt(self) -> None:
        self._attempts.pop()


def new_state() -> dict[str, Any]:
    return {"steps": {}, "loops": {}, "retries": {}, "consumed": {}}


def check_state(state: Any) -> dict[str, Any]:
    """``state`` if it has the shape the engine writes; ValueError otherwise."""
    if not isinstance(state, dict):
        raise ValueError("run state is not an object")
    for key in ("steps", "loops", "retries", "consumed"):
        if not isinstance(state.get(key), dict):
            raise ValueError(f"run state has no valid {key!r}")
    for key, loop in state["loops"].items():
        if not (
            isinstance(loop, dict)
            and isinstance(loop.get("items"), list)
            and isinstance(loop.get("index"), int)
            and 0 <= loop["index"] < len(loop["items"])
        ):
            raise ValueError(f"run state has a broken loop at {key!r}")
    for key, attempt in state["retries"].items():
        if not isinstance(attempt, int) or attempt < 1:
            raise ValueError(f"run state has a broken retry attempt at {key!r}")
    return state


class Suspend(Exception):
    """Raised by a step to suspend the run at ``cursor`` (engine-internal control flow)."""

    def __init__(self, kind: str, cursor: list[Any], **info: Any) -> None:
        super().__init__(kind)
        self.kind = kind  # "timer", "event", "retry"
        self.cursor = cursor
        self.info = info


class ReturnValue(Exception):
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


def path_text(path: list[Any]) -> str:
    return ".".join(str(p) for p in path)
