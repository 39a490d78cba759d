"""What a step and its resolvers see while a run advances: the context.

Resolvers are functions of a :class:`Context` (``lambda ctx: ...``): the
trigger event, the results of earlier steps, the loop scope, the run and the
clock. It is part of the definition language, which is why it lives here;
the engine builds one per segment.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from kumiflow_django.store import clock
from kumiflow_django.store.models import Event


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


#: What a run's trigger is: a stored event, or the stand-in of a manual or cron start.
Trigger = Event | TriggerEvent


class WakeReason(StrEnum):
    """Why a suspended run continues."""

    START = "start"  # a deferred start (or a start the database refused first)
    TIMER = "timer"
    EVENT = "event"  # the awaited event came
    TIMEOUT = "timeout"  # the wait for an event timed out
    RETRY = "retry"  # a retry's backoff is over


@dataclass(frozen=True)
class Wake:
    """Why a suspended run continues: the step it stopped at reads this."""

    reason: WakeReason
    event: Event | None = None  # the awaited event, when reason is EVENT


@dataclass(frozen=True)
class DispatchRequest:
    """A side effect a step asks for (mail, webhook, a registered kind): the
    segment writes it to the outbox with the run, the dispatch loop delivers it.

    ``problem`` says why it can never be delivered (then it is dead at once).
    """

    id: uuid.UUID
    kind: str
    request: dict[str, Any]
    retry: dict[str, Any]
    step: str
    problem: str | None = None


class Context:
    """The resolver context: the trigger event, step results, loop scope, run and clock."""

    def __init__(
        self,
        *,
        event: Trigger,
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
        #: Milliseconds each step of this segment took, by static path (summed
        #: over a loop's items), for the admin's picture.
        self.durations: dict[str, float] = {}
        #: Side effects the segment commits with the run (outbox requests).
        self.effects: list[DispatchRequest] = []
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

    def timed(self, path: str, began: float) -> None:
        """Add the time since ``began`` (``time.perf_counter()``) to a step's duration."""
        ms = (time.perf_counter() - began) * 1000
        self.durations[path] = round(self.durations.get(path, 0.0) + ms, 3)

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
