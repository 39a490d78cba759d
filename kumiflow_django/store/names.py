"""The names of the events the engine writes, and the reasons a run fails.

Only the engine writes events under ``kumiflow.``; user code reads them
(projections may subscribe to them) but cannot append them.
"""

from __future__ import annotations

RUN_STREAM = "workflow-run"
DISPATCH_STREAM = "step-dispatch"

RUN_STARTED = "kumiflow.workflow.run-started"
STEP_WAITING = "kumiflow.workflow.step.waiting"
STEP_WAITING_FOR_EVENT = "kumiflow.workflow.step.waiting-for-event"
RETRY_SCHEDULED = "kumiflow.workflow.retry.scheduled"
EVENT_MATCHED = "kumiflow.workflow.event-matched"
STEP_RESUMED = "kumiflow.workflow.step.resumed"
RUN_COMPLETED = "kumiflow.workflow.run-completed"
RUN_FAILED = "kumiflow.workflow.run-failed"
RUN_CANCELLED = "kumiflow.workflow.run-cancelled"
RUN_RETRIED = "kumiflow.workflow.run-retried"
RUN_WOKEN = "kumiflow.workflow.run-woken"
RUN_RECOVERED = "kumiflow.workflow.run-recovered"
#: The database refused to store a segment; it is tried again at ``retry_at``.
SEGMENT_REFUSED = "kumiflow.workflow.segment-refused"
#: The run waits for a child run it started (``child``).
STEP_WAITING_FOR_CHILD = "kumiflow.workflow.step.waiting-for-child"
#: Branches of a parallel step wait, each for its own thing.
STEP_WAITING_BRANCHES = "kumiflow.workflow.step.waiting-branches"
#: A child run this run waits for ended (written by the child's last segment).
CHILD_SETTLED = "kumiflow.workflow.child-settled"
#: The run failed (or was cancelled) after steps with compensations completed:
#: their compensations run now, in reverse order.
COMPENSATION_STARTED = "kumiflow.workflow.compensation-started"
#: A queued run got its slot (and its rate's admission): it starts now.
RUN_ADMITTED = "kumiflow.workflow.run-admitted"
#: A later event of a debounced burst: the run starts with it, later.
RUN_DEBOUNCED = "kumiflow.workflow.run-debounced"
#: A deploy changed the run's definition in steps it has not reached: it
#: carries on on the registered one (docs/deploying.md, "Compatible changes").
DEFINITION_SWITCHED = "kumiflow.workflow.definition-switched"
#: An operator restarted this (finished) run from one of its steps: a new run,
#: linked to it; this run's end stays what it was.
RUN_RESTARTED = "kumiflow.workflow.run-restarted"
#: A step set (or removed) search attributes of the run (``set_attributes``).
RUN_ATTRIBUTES_SET = "kumiflow.workflow.attributes-set"
#: An operator (or code) decided an approval the run waits at (``decide_approval``).
APPROVAL_DECIDED = "kumiflow.workflow.approval-decided"
#: An operator paused the run (or its retries ran out under
#: ``on_exhausted="pause"``): no worker claims it until it is resumed.
RUN_PAUSED = "kumiflow.workflow.run-paused"
#: An operator resumed a paused run: it is claimed again when due.
RUN_RESUMED = "kumiflow.workflow.run-resumed"

RUN_EVENTS = frozenset(
    {
        RUN_STARTED,
        STEP_WAITING,
        STEP_WAITING_FOR_EVENT,
        RETRY_SCHEDULED,
        EVENT_MATCHED,
        STEP_RESUMED,
        RUN_COMPLETED,
        RUN_FAILED,
        RUN_CANCELLED,
        RUN_RETRIED,
        RUN_WOKEN,
        RUN_RECOVERED,
        SEGMENT_REFUSED,
        STEP_WAITING_FOR_CHILD,
        STEP_WAITING_BRANCHES,
        CHILD_SETTLED,
        COMPENSATION_STARTED,
        RUN_ADMITTED,
        RUN_DEBOUNCED,
        DEFINITION_SWITCHED,
        RUN_RESTARTED,
        RUN_ATTRIBUTES_SET,
        APPROVAL_DECIDED,
        RUN_PAUSED,
        RUN_RESUMED,
    }
)

DISPATCH_REQUESTED = "kumiflow.step.dispatch-requested"
DISPATCH_ATTEMPT_STARTED = "kumiflow.step.dispatch-attempt-started"
DISPATCH_ATTEMPT_FAILED = "kumiflow.step.dispatch-attempt-failed"
DISPATCHED = "kumiflow.step.dispatched"
DISPATCH_FAILED = "kumiflow.step.dispatch-failed"
DISPATCH_CANCELLED = "kumiflow.step.dispatch-cancelled"
DISPATCH_REDELIVERY = "kumiflow.step.dispatch-redelivery-requested"

#: The awaited "event type" of a step that waits for its delivery: either outcome.
SETTLED = "kumiflow.step.dispatch-settled"
OUTCOME_TYPES = (DISPATCHED, DISPATCH_FAILED)

DISPATCH_EVENTS = frozenset(
    {
        DISPATCH_REQUESTED,
        DISPATCH_ATTEMPT_STARTED,
        DISPATCH_ATTEMPT_FAILED,
        DISPATCHED,
        DISPATCH_FAILED,
        DISPATCH_CANCELLED,
        DISPATCH_REDELIVERY,
    }
)

TASK_STREAM = "step-task"

TASK_REQUESTED = "kumiflow.task.requested"
#: A Django Tasks backend accepted an attempt (kumiflow's pool needs no such step).
TASK_ENQUEUED = "kumiflow.task.enqueued"
TASK_ATTEMPT_STARTED = "kumiflow.task.attempt-started"
TASK_ATTEMPT_FAILED = "kumiflow.task.attempt-failed"
TASK_COMPLETED = "kumiflow.task.completed"
TASK_FAILED = "kumiflow.task.failed"
TASK_CANCELLED = "kumiflow.task.cancelled"
#: A result that came too late (its attempt timed out, its task was cancelled).
TASK_RESULT_IGNORED = "kumiflow.task.result-ignored"
#: An operator retried a run whose task had failed: the task runs again.
TASK_RETRIED = "kumiflow.task.retried"

#: The error type of a task attempt given up because its lease ran out with no
#: result: its worker was lost (killed, cut off) or the attempt is stuck.
WORKER_LOST = "WorkerLost"

#: The awaited "event type" of a task step: either outcome of its task.
TASK_SETTLED = "kumiflow.task.settled"
TASK_OUTCOME_TYPES = (TASK_COMPLETED, TASK_FAILED)

TASK_EVENTS = frozenset(
    {
        TASK_REQUESTED,
        TASK_ENQUEUED,
        TASK_ATTEMPT_STARTED,
        TASK_ATTEMPT_FAILED,
        TASK_COMPLETED,
        TASK_FAILED,
        TASK_CANCELLED,
        TASK_RESULT_IGNORED,
        TASK_RETRIED,
    }
)

# Reasons of run-failed (machine-readable; the error text says more).
STEP_FAILED = "step_failed"
DEFINITION_CHANGED = "workflow_definition_changed"
NOT_REGISTERED = "workflow_not_registered"
#: No live worker process served the run's definition for KUMIFLOW_UNKNOWN_DEFINITION_GRACE.
DEFINITION_NOT_SERVED = "workflow_definition_not_served"
TRIGGER_UNAVAILABLE = "trigger_event_unavailable"
AWAITED_UNAVAILABLE = "awaited_event_unavailable"
CORRUPT_STATE = "corrupt_state"
START_DEPTH_EXCEEDED = "start_depth_exceeded"
STATE_TOO_LARGE = "state_too_large"
TASK_FAILED_REASON = "task_failed"
CHILD_FAILED_REASON = "child_failed"
UNSTORABLE_STATE = "unstorable_state"
#: An operator failed the run (``fail_run``).
FAILED_BY_OPERATOR = "failed_by_operator"
#: A key resolver of the workflow's concurrency limit or rate raised (or
#: returned something that is not a short string): the run never started.
FLOW_KEY_FAILED = "flow_key_failed"
#: A search attribute's resolver raised (or returned a value the index cannot
#: store) at the start: the run is recorded as failed, like a flow key's.
ATTRIBUTE_FAILED = "attribute_failed"

CRON_STREAM = "cron-schedule"
#: A schedule's stream id is this prefix and its workflow's name.
CRON_STREAM_PREFIX = "cron:"
CRON_REGISTERED = "kumiflow.cron.schedule-registered"
CRON_CHANGED = "kumiflow.cron.schedule-changed"
CRON_REMOVED = "kumiflow.cron.schedule-removed"
CRON_FIRED = "kumiflow.cron.fired"
CRON_SKIPPED = "kumiflow.cron.skipped"
CRON_ENABLED = "kumiflow.cron.enabled"
CRON_DISABLED = "kumiflow.cron.disabled"

CRON_EVENTS = frozenset(
    {
        CRON_REGISTERED,
        CRON_CHANGED,
        CRON_REMOVED,
        CRON_FIRED,
        CRON_SKIPPED,
        CRON_ENABLED,
        CRON_DISABLED,
    }
)

#: Paused scopes: one stream per workflow or tenant an operator paused
#: (``pause:workflow:<name>``, ``pause:tenant:<id>``).
PAUSE_STREAM = "pause-scope"
PAUSE_STREAM_PREFIX = "pause:"
SCOPE_PAUSED = "kumiflow.pause.scope-paused"
SCOPE_RESUMED = "kumiflow.pause.scope-resumed"

PAUSE_EVENTS = frozenset({SCOPE_PAUSED, SCOPE_RESUMED})
