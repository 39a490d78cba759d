"""The payload of every event the engine writes, one ``TypedDict`` per type.

Beside :mod:`kumiflow_django.store.names`: ``RUN_STARTED`` is written with a
:class:`RunStarted`, and so on (:data:`PAYLOADS` maps each name to its type).
A ``TypedDict`` is a plain ``dict`` at run time: the JSON stored is what it
always was, and building or reading one costs nothing more, while mypy checks
the keys where the engine writes a payload and where a fold reads one.

Keys the engine always writes are required; the others are ``NotRequired``
(older events, or written only when they apply). ``by`` and ``reason`` of
operator actions are added by :func:`kumiflow_django.store.audit.audited`.
"""

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from kumiflow_django.store import names as ev

#: Some event's payload, where the type is not known (any of the ones below).
Payload = Mapping[str, Any]

# -- parts ------------------------------------------------------------------


class TriggerRef(TypedDict):
    """What started a run: its type, and for a stored event where it is."""

    type: str
    position: NotRequired[int]
    event_id: NotRequired[str]
    stream_id: NotRequired[str]
    version: NotRequired[int]


class Held(TypedDict):
    """What holds a run that starts queued (``concurrency``, ``rate``, ``debounce``)."""

    why: str
    until: NotRequired[str | None]
    detail: NotRequired[dict[str, Any]]


class FlowRef(TypedDict, total=False):
    """The flow-control keys of a run, resolved at its start."""

    scope: str
    key: str
    rate_key: str
    debounce_key: str
    held: Held


class ParentRef(TypedDict):
    """A child run's parent (the run that started it)."""

    id: str
    root: str
    step: str
    wait: bool
    cancel_with_parent: bool
    depth: int


class EventRef(TypedDict):
    """A stored event a run took (the awaited one, the one that woke it)."""

    position: int
    event_id: str


#: The worker whose lease on the run ran out (``from`` is a keyword: the
#: functional syntax).
Recovered = TypedDict("Recovered", {"from": str, "lease_until": str | None})


class Gaps(TypedDict, total=False):
    """Positions below a wait's cut-off still in flight when it began."""

    gaps: list[int]


class BranchWait(TypedDict):
    """One event a branch of a parallel step awaits (a ``RunWait`` row)."""

    branch: str
    event_type: str
    correlation_key: str
    match: Any
    after: int
    gaps: NotRequired[list[int]]


class Awaited(TypedDict):
    """The awaited event of a run a retry restores to a wait."""

    event_type: str
    match: Any
    correlation_key: str
    after: int
    gaps: NotRequired[list[int] | None]


class Restore(TypedDict):
    """Where a retried run begins again: its last suspension, or its start."""

    status: str
    cursor: list[Any] | None
    state: dict[str, Any]
    attempt: NotRequired[int]
    waits: NotRequired[list[BranchWait]]
    child_waits: NotRequired[int]
    suspended_version: NotRequired[int]
    awaited: NotRequired[Awaited]
    matched_position: NotRequired[int]
    wait: NotRequired[bool]


# -- run events -------------------------------------------------------------


class RunStarted(TypedDict):
    workflow: str
    version: str | None
    fingerprint: str
    mode: str
    trigger: NotRequired[TriggerRef]
    since: int
    idempotency_key: NotRequired[str]
    input: NotRequired[Any]
    priority: NotRequired[int]
    since_gaps: NotRequired[list[int]]
    flow: NotRequired[FlowRef]
    parent: NotRequired[ParentRef]
    #: A restart of an earlier run from one of its steps (engine.restart).
    restart: NotRequired[dict[str, Any]]
    #: Search attributes resolved at the start (None-valued ones left out).
    attributes: NotRequired[dict[str, str | int | bool]]
    #: An inline start recorded deferred: its workflow or tenant was paused.
    paused: NotRequired[str]


class Suspended(TypedDict):
    """What every suspension carries: where the run is, its state, the steps run."""

    cursor: list[Any]
    state: dict[str, Any]
    trail: list[str]
    durations: NotRequired[dict[str, Any]]


class StepWaiting(Suspended):
    wake_at: str


class StepWaitingForEvent(Suspended):
    event_type: str
    match: Any
    correlation_key: str
    timeout_at: str | None
    after: int
    gaps: NotRequired[list[int]]


class RetryScheduled(Suspended):
    wake_at: str
    attempt: int
    max_attempts: int
    error: str


class StepWaitingForChild(Suspended):
    child_id: str
    wake_at: str | None


class StepWaitingBranches(Suspended):
    wake_at: str | None
    waits: list[BranchWait]
    children: list[str]


class EventMatched(TypedDict):
    event: EventRef


class StepResumed(TypedDict):
    cursor: list[Any] | None
    by: NotRequired[str]
    attempt: NotRequired[int]
    recovered: NotRequired[Recovered]
    event: NotRequired[EventRef]


class RunCompleted(TypedDict):
    result: Any
    trail: list[str]
    steps: NotRequired[dict[str, Any]]
    durations: NotRequired[dict[str, Any]]


class RunFailed(TypedDict):
    error: str
    reason: str
    trail: list[str]
    cursor: NotRequired[list[Any] | None]
    compensation: NotRequired[str]
    traceback: NotRequired[str]
    steps: NotRequired[dict[str, Any]]
    durations: NotRequired[dict[str, Any]]


class RunCancelled(TypedDict):
    reason: NotRequired[str]
    by: NotRequired[str]
    compensation: NotRequired[str]


class RunRetried(TypedDict):
    restore: Restore
    fingerprint: NotRequired[str]
    version: NotRequired[str | None]
    by: NotRequired[str]
    reason: NotRequired[str]


class RunPaused(TypedDict):
    """An operator's pause (``by``, ``reason``), or the engine's when a step's
    retries ran out under ``on_exhausted="pause"``: ``failure`` is the
    ``run-failed`` payload the run would have ended with."""

    by: NotRequired[str]
    reason: NotRequired[str]
    failure: NotRequired[RunFailed]
    restore: NotRequired[Restore]


class RunResumed(TypedDict):
    """``restore``: where a run paused on exhausted retries continues, when it
    differs from where the pause left it (its task failed for good and runs
    again: the run waits for the task's new outcome)."""

    by: NotRequired[str]
    reason: NotRequired[str]
    restore: NotRequired[Restore]


class ScopePaused(TypedDict):
    kind: str
    name: str
    by: NotRequired[str]
    reason: NotRequired[str]


class ScopeResumed(TypedDict):
    by: NotRequired[str]
    reason: NotRequired[str]


class RunWoken(TypedDict):
    by: NotRequired[str]
    reason: NotRequired[str]


class RunRestarted(TypedDict):
    """On the old run: the new run that restarted it from ``from_step``."""

    run: str
    from_step: str
    definition: str
    idempotency_key: NotRequired[str]
    by: NotRequired[str]
    reason: NotRequired[str]


class RunRecovered(TypedDict, total=False):
    """Written by earlier releases (a recovery is ``step.resumed``'s ``recovered`` now)."""

    recovered: Recovered


class SegmentRefused(TypedDict):
    attempt: int
    error: str
    retry_at: str
    event: NotRequired[EventRef]


class RunAttributesSet(TypedDict):
    """A ``set_attributes`` step's changes (None: the attribute is removed)."""

    attributes: dict[str, str | int | bool | None]
    step: str


class ApprovalDecided(TypedDict):
    """The decision an approval step waits for (``decide_approval``), on the
    run's own stream: which approval, the choice, the declared fields, who
    decided (also the event's ``created_by``) and why."""

    approval: str
    choice: str
    fields: dict[str, Any]
    by: str
    reason: NotRequired[str]


class ChildSettled(TypedDict):
    """The child's id and its outcome (``engine.children.outcome``)."""

    child_id: str
    status: str
    workflow: str
    run_id: str
    result: NotRequired[Any]
    error: NotRequired[str]
    reason: NotRequired[str]


class CompensationStarted(TypedDict):
    then: str
    reason: str
    error: str
    steps: list[list[Any]]
    state: dict[str, Any]
    trail: NotRequired[list[str]]
    by: NotRequired[str]


class RunAdmitted(TypedDict):
    held_by: str
    fingerprint: NotRequired[str]
    version: NotRequired[str | None]
    recovered: NotRequired[Recovered]


class DefinitionSwitched(TypedDict):
    """The run carries on on another definition (``definition-switched``)."""

    from_fingerprint: str
    to_fingerprint: str
    from_version: str | None
    to_version: str | None
    #: ``compatible`` or ``unchanged`` (a change outside the steps).
    classification: str


class RunDebounced(TypedDict):
    trigger: TriggerRef
    since: int
    until: str
    since_gaps: NotRequired[list[int]]


# -- dispatch events --------------------------------------------------------


class DispatchRequested(TypedDict):
    kind: str
    request: dict[str, Any]
    retry: dict[str, Any]
    run_id: str | None
    step: str


class DispatchAttemptStarted(TypedDict):
    attempt: int
    lease_until: str


class DispatchAttemptFailed(TypedDict):
    kind: str
    attempt: int
    error: str
    status_code: int | None
    next_attempt_at: str


class Dispatched(TypedDict):
    kind: str
    attempt: int
    status_code: int | None
    response: NotRequired[Any]


class DispatchFailed(TypedDict):
    kind: str
    attempt: int
    error: str
    status_code: NotRequired[int | None]
    response: NotRequired[Any]


class DispatchCancelled(TypedDict, total=False):
    reason: str
    by: str


class DispatchRedelivery(TypedDict, total=False):
    reason: str
    by: str


# -- task events ------------------------------------------------------------


class TaskRequested(TypedDict):
    run_id: str
    workflow: str
    step: str
    name: str
    function: str
    backend: str
    queue: str
    priority: int
    args: Any
    retry: dict[str, Any]
    non_retryable: list[str]
    timeout: float
    heartbeat_timeout: float | None
    trace: NotRequired[dict[str, str]]
    flow: NotRequired[dict[str, Any]]


class TaskEnqueued(TypedDict):
    attempt: int
    backend: str


class TaskAttemptStarted(TypedDict):
    attempt: int
    worker: str
    lease_until: str


class TaskAttemptFailed(TypedDict):
    attempt: int
    error: str
    error_type: str
    traceback: NotRequired[str]
    duration: NotRequired[float | None]
    retry_at: str


class TaskCompleted(TypedDict):
    attempt: int
    result: Any
    duration: float | None


class TaskFailed(TypedDict):
    attempt: int
    error: str
    error_type: NotRequired[str]
    traceback: NotRequired[str]
    duration: NotRequired[float | None]


class TaskCancelled(TypedDict):
    reason: str


class TaskResultIgnored(TypedDict):
    attempt: int
    outcome: str
    why: str


class TaskRetried(TypedDict):
    run_id: str


# -- cron events ------------------------------------------------------------


class CronDefinition(TypedDict):
    """A schedule as its trigger declares it (``cron.schedules._definition``)."""

    expression: str
    timezone: str
    misfire: str
    max_catch_up: int
    overlap: str
    next_fire_at: NotRequired[str | None]


class CronRemoved(TypedDict):
    reason: str
    next_fire_at: None


class CronFired(TypedDict):
    scheduled_for: list[str]
    run_ids: list[str]
    skipped: NotRequired[int]
    manual: NotRequired[bool]
    next_fire_at: NotRequired[str | None]


class CronSkipped(TypedDict):
    skipped: int
    scheduled_for: NotRequired[list[str]]
    run_ids: NotRequired[list[str]]
    next_fire_at: NotRequired[str | None]


class CronEnabled(TypedDict):
    next_fire_at: str
    by: NotRequired[str]
    reason: NotRequired[str]


class CronDisabled(TypedDict):
    reason: str
    next_fire_at: NotRequired[None]
    by: NotRequired[str]


#: Every engine event type and its payload's type.
PAYLOADS: dict[str, type[Any]] = {
    ev.RUN_STARTED: RunStarted,
    ev.DEFINITION_SWITCHED: DefinitionSwitched,
    ev.STEP_WAITING: StepWaiting,
    ev.STEP_WAITING_FOR_EVENT: StepWaitingForEvent,
    ev.RETRY_SCHEDULED: RetryScheduled,
    ev.EVENT_MATCHED: EventMatched,
    ev.STEP_RESUMED: StepResumed,
    ev.RUN_COMPLETED: RunCompleted,
    ev.RUN_FAILED: RunFailed,
    ev.RUN_CANCELLED: RunCancelled,
    ev.RUN_RETRIED: RunRetried,
    ev.RUN_WOKEN: RunWoken,
    ev.RUN_RESTARTED: RunRestarted,
    ev.RUN_PAUSED: RunPaused,
    ev.RUN_RESUMED: RunResumed,
    ev.SCOPE_PAUSED: ScopePaused,
    ev.SCOPE_RESUMED: ScopeResumed,
    ev.RUN_RECOVERED: RunRecovered,
    ev.SEGMENT_REFUSED: SegmentRefused,
    ev.STEP_WAITING_FOR_CHILD: StepWaitingForChild,
    ev.STEP_WAITING_BRANCHES: StepWaitingBranches,
    ev.CHILD_SETTLED: ChildSettled,
    ev.COMPENSATION_STARTED: CompensationStarted,
    ev.RUN_ADMITTED: RunAdmitted,
    ev.RUN_DEBOUNCED: RunDebounced,
    ev.RUN_ATTRIBUTES_SET: RunAttributesSet,
    ev.APPROVAL_DECIDED: ApprovalDecided,
    ev.DISPATCH_REQUESTED: DispatchRequested,
    ev.DISPATCH_ATTEMPT_STARTED: DispatchAttemptStarted,
    ev.DISPATCH_ATTEMPT_FAILED: DispatchAttemptFailed,
    ev.DISPATCHED: Dispatched,
    ev.DISPATCH_FAILED: DispatchFailed,
    ev.DISPATCH_CANCELLED: DispatchCancelled,
    ev.DISPATCH_REDELIVERY: DispatchRedelivery,
    ev.TASK_REQUESTED: TaskRequested,
    ev.TASK_ENQUEUED: TaskEnqueued,
    ev.TASK_ATTEMPT_STARTED: TaskAttemptStarted,
    ev.TASK_ATTEMPT_FAILED: TaskAttemptFailed,
    ev.TASK_COMPLETED: TaskCompleted,
    ev.TASK_FAILED: TaskFailed,
    ev.TASK_CANCELLED: TaskCancelled,
    ev.TASK_RESULT_IGNORED: TaskResultIgnored,
    ev.TASK_RETRIED: TaskRetried,
    ev.CRON_REGISTERED: CronDefinition,
    ev.CRON_CHANGED: CronDefinition,
    ev.CRON_REMOVED: CronRemoved,
    ev.CRON_FIRED: CronFired,
    ev.CRON_SKIPPED: CronSkipped,
    ev.CRON_ENABLED: CronEnabled,
    ev.CRON_DISABLED: CronDisabled,
}
