"""What a step and its resolvers see while a run advances: the context.

Resolvers are functions of a :class:`Context` (``lambda ctx: ...``): the
trigger event, the results of earlier steps, the loop scope, the run and the
clock. It is part of the definition language, which is why it lives here;
the engine builds one per segment.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
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
    """The run a resolver runs in (``ctx.run``).

    ``version`` is the version of the definition the run runs on now (a
    deploy may carry a run on to another one); ``started_version`` the one it
    started on, which never changes: a resolver that must behave as the old
    code did for runs started before a change branches on it.
    """

    id: uuid.UUID
    workflow: str
    version: str | None
    tenant: str
    fingerprint: str
    started_version: str | None = None


#: What a run's trigger is: a stored event, or the stand-in of a manual or cron start.
Trigger = Event | TriggerEvent


class WakeReason(StrEnum):
    """Why a suspended run continues."""

    START = "start"  # a deferred start (or a start the database refused first)
    TIMER = "timer"
    EVENT = "event"  # the awaited event came
    TIMEOUT = "timeout"  # the wait for an event timed out
    RETRY = "retry"  # a retry's backoff is over
    CHILD = "child"  # a child run it waits for ended


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


@dataclass(frozen=True)
class TaskRequest:
    """Work a ``task`` step asks for: run ``function`` with ``args`` outside the
    segment's transaction, after it commits (kumiflow's pool, or the Django
    Tasks ``backend``), at least once, under one idempotency key for every
    attempt: the task's id."""

    id: uuid.UUID
    step: str
    name: str
    function: str
    args: Any
    backend: str
    queue: str
    priority: int
    timeout: float
    heartbeat_timeout: float | None
    retry: dict[str, Any]
    non_retryable: tuple[str, ...]
    problem: str | None = None
    #: Flow control of its attempts: {"scope", "key", "max"} and/or {"rate": {...}}.
    flow: dict[str, Any] | None = None


@dataclass(frozen=True)
class ChildRequest:
    """A child run a ``child`` step starts: created with the segment (its own
    stream, linked to this run and to the root of its tree), run by the resume
    loop after commit. With ``wait`` its end is reported to this run."""

    id: uuid.UUID
    workflow: str
    version: str | None
    payload: dict[str, Any]
    idempotency_key: str | None
    step: str
    wait: bool
    cancel_with_parent: bool


@dataclass(frozen=True)
class Cancellation:
    """Something a branch that was cancelled (a ``parallel`` join met without it)
    or a failed run leaves behind: its task, its child run, its awaited delivery."""

    what: str  # "task", "child" or "dispatch"
    id: str


@dataclass(frozen=True)
class AttributesUpdate:
    """Search attributes a ``set_attributes`` step changes (None removes one):
    an ``attributes-set`` event on the run's stream, folded into its row."""

    attributes: dict[str, Any]
    step: str


#: What a step can ask the segment to commit besides the run's own events.
Effect = DispatchRequest | TaskRequest | ChildRequest | Cancellation | AttributesUpdate


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
        #: The branch instance the steps run in (``""`` outside ``parallel``): it
        #: scopes the state kept by step path, so two branches running the same
        #: steps (items of a parallel ``for_each``) keep theirs apart.
        self.branch = ""
        #: Whether the run runs its compensations (steps completed then record none).
        self.compensating = False
        #: Milliseconds each step of this segment took, by static path (summed
        #: over a loop's items), for the admin's picture.
        self.durations: dict[str, float] = {}
        #: Side effects the segment commits with the run (outbox requests, tasks,
        #: child runs, what cancelled branches left).
        self.effects: list[Effect] = []
        #: A restarted run's first segment: the step at its cursor runs anew
        #: (it was never suspended there), it is not resumed.
        self.fresh = False
        self._attempts: list[int] = []
        #: What resolvers see: the same context, read-only.
        self.view = ResolverContext(self)

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

    def key(self, path: list[Any]) -> str:
        """The state key of the step at ``path`` in the current branch instance."""
        text = ".".join(str(p) for p in path)
        return f"{self.branch}{text}" if self.branch else text

    def timed(self, path: str, began: float) -> None:
        """Add the time since ``began`` (``time.perf_counter()``) to a step's duration."""
        ms = (time.perf_counter() - began) * 1000
        self.durations[path] = round(self.durations.get(path, 0.0) + ms, 3)

    def push_attempt(self, attempt: int) -> None:
        self._attempts.append(attempt)

    def pop_attempt(self) -> None:
        self._attempts.pop()


class ResolverContext:
    """What a resolver (``lambda ctx: ...``) sees: a read-only view of the
    segment's :class:`Context`.

    The engine's own state (the run's state, the side effects the segment will
    commit, the trail, the retry attempts) is not reachable from it, and its
    attributes cannot be set: a resolver that wrote to them would change what
    the segment commits behind the engine's back. ``steps`` and ``scope`` are
    read-only mappings that follow the run as it advances; the values in them
    are the stored results themselves, to be read, not changed.
    """

    __slots__ = ("_ctx", "_steps")
    _ctx: Context
    _steps: Mapping[str, Any]

    def __init__(self, ctx: Context) -> None:
        object.__setattr__(self, "_ctx", ctx)
        object.__setattr__(self, "_steps", MappingProxyType(ctx.steps))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the resolver context is read-only (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"the resolver context is read-only (cannot delete {name!r})")

    def __repr__(self) -> str:
        return f"<ResolverContext run={self._ctx.run.id} workflow={self._ctx.run.workflow!r}>"

    @property
    def event(self) -> Trigger:
        """The run's trigger event (a stand-in for manual and cron starts)."""
        return self._ctx.event

    @property
    def trigger(self) -> Trigger:
        """The same as ``event``: the run's trigger event."""
        return self._ctx.event

    @property
    def steps(self) -> Mapping[str, Any]:
        """The results of the steps that ran, by step name."""
        return self._steps

    @property
    def scope(self) -> Mapping[str, Any]:
        """The current item of each enclosing ``for_each``, by its ``as_`` name."""
        return MappingProxyType(self._ctx.scope)

    @property
    def run(self) -> RunInfo:
        return self._ctx.run

    @property
    def started_version(self) -> str | None:
        """The workflow version the run started on (``ctx.run.started_version``)."""
        return self._ctx.run.started_version

    @property
    def wake(self) -> Wake | None:
        """Why the run continues in this segment (None in its first)."""
        return self._ctx.wake

    @property
    def tenant(self) -> str:
        return self._ctx.run.tenant

    @property
    def attempt(self) -> int:
        """The attempt number of the innermost ``retry`` (1 outside any)."""
        return self._ctx.attempt

    @property
    def now(self) -> datetime:
        return clock.now()

    @property
    def clock(self) -> clock.Clock:
        return clock.get_clock()


#: What a run's state holds (all keyed by ``Context.key`` of a step, but
#: ``steps``, by step name, and ``settled``, by child run id):
#: ``steps`` step results; ``loops`` for_each positions; ``retries`` retry
#: attempts; ``consumed`` the last event each wait took; ``parallel`` the
#: branches of parallel steps; ``children`` the child run each child step
#: started; ``settled`` children that ended and were not yet taken;
#: ``compensations`` completed steps with a compensation, in order.
STATE_KEYS = (
    "steps",
    "loops",
    "retries",
    "consumed",
    "parallel",
    "children",
    "settled",
    "compensations",
    "consumed_gaps",
)


def new_state() -> dict[str, Any]:
    """A new run's state: the last four keys are added when first used."""
    return {key: {} for key in STATE_KEYS[:4]}


def state_part(state: dict[str, Any], key: str) -> Any:
    """One part of a run's state, created when first used."""
    part = state.get(key)
    if part is None:
        part = state[key] = [] if key == "compensations" else {}
    return part


def check_state(state: Any) -> dict[str, Any]:
    """``state`` if it has the shape the engine writes; ValueError otherwise."""
    if not isinstance(state, dict):
        raise ValueError("run state is not an object")
    for key in STATE_KEYS:
        expected = list if key == "compensations" else dict
        if key in STATE_KEYS[4:] and key not in state:
            continue  # created when first used
        if not isinstance(state.get(key), expected):
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
