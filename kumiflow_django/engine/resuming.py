"""Resuming suspended runs, and waking the runs an appended event satisfies.

A resume locks the run row (skipping locked rows where the database can),
checks that the run is still suspended at the version it was read at,
checks its definition, and continues at its cursor through the segment
runner. The first event it writes, ``step.resumed``, takes the next version
of the run's stream: if another worker got there first, the insert fails on
the log's unique ``(stream, version)`` and this resume is a silent skip.

An appended event wakes the runs waiting for it: inline, in the appending
transaction (``KUMIFLOW_EVENT_WAKE = "inline"``), or by marking them due for
the resume loop (``"worker"``). A run that begins waiting while its event is
being appended in another transaction is found by a check after either
commit.
"""

from __future__ import annotations

import copy
import uuid
from functools import partial
from typing import Any

from django.db import IntegrityError
from django.db.models import Q, QuerySet

from kumiflow_django.conf import settings
from kumiflow_django.definition import matching
from kumiflow_django.definition.context import (
    Trigger,
    TriggerEvent,
    Wake,
    WakeReason,
    check_state,
    state_part,
)
from kumiflow_django.definition.matching import Cutoff, Wait, awaited_as
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.snapshots import remember
from kumiflow_django.definition.workflow import Workflow
from kumiflow_django.engine import admission, compensation
from kumiflow_django.engine.failure import Failure
from kumiflow_django.engine.opening import Opening, Prepared, Steps
from kumiflow_django.engine.pausing import held
from kumiflow_django.engine.runner import execute
from kumiflow_django.engine.segment import Segment
from kumiflow_django.flow.admission import Pending
from kumiflow_django.projections import lock_order
from kumiflow_django.projections.runs import SUSPENDED, RunStatus, WorkflowRun
from kumiflow_django.projections.stream import StaleRow
from kumiflow_django.projections.waits import RunWait
from kumiflow_django.store import clock, db
from kumiflow_django.store import names as ev
from kumiflow_django.store import payloads as pl
from kumiflow_django.store.db import is_transient
from kumiflow_django.store.models import Event
from kumiflow_django.store.telemetry import get_logger, run_log_fields
from kumiflow_django.store.wakeups import WorkKind, work_committed

logger = get_logger("kumiflow_django.engine.resuming")


#: Streams whose outcomes a run awaits from the very transaction that opened
#: them (a task, an awaited delivery): the run waits before the outcome can be
#: appended, so no run can begin waiting concurrently with it.
SETTLED_AFTER_WAIT = frozenset({ev.TASK_STREAM, ev.DISPATCH_STREAM})


def _settles_a_wait_only(event: Event) -> bool:
    """An outcome of a task or an awaited delivery that no workflow awaits by its
    own type: only the run that opened the stream waits for it, and it already
    does (the after-commit check has nothing to find)."""
    return event.stream_type in SETTLED_AFTER_WAIT and not registry.awaited_paths(event.type)


def lock_run(run_id: uuid.UUID, *, skip_locked: bool) -> WorkflowRun | None:
    return lock_order.lock_run(run_id, skip_locked=skip_locked)  # in the lock order


def resume_run(
    run_id: uuid.UUID,
    *,
    wake: Wake | None = None,
    skip_locked: bool = False,
    expected_version: int | None = None,
    recovered: pl.Recovered | None = None,
) -> WorkflowRun | None:
    """Continue a suspended run that is due (or that ``wake.event`` satisfies).

    ``recovered`` names the worker whose lease on the run expired: the
    takeover is recorded on ``step.resumed``.

    Returns the run after its segment, or None when there was nothing to do:
    not due, already resumed by someone else, locked by another worker.
    """

    def prepare() -> Prepared:
        run = lock_run(run_id, skip_locked=skip_locked)
        if run is None or run.status not in SUSPENDED or held(run):
            return None  # a paused run's event was recorded by its caller (_deliver)
        # A run that moved on since it was found due (a child reported, another
        # worker resumed it) is resumed if it is still due; a takeover recorded
        # from that older reading would be stale.
        took_over = recovered if expected_version in (None, run.version) else None
        if wake is not None and wake.reason == WakeReason.EVENT:
            if wake.event is None or not satisfies(run, wake.event):
                return None
        elif run.wake_at is None or run.wake_at > clock.now():
            return None
        if run.status == RunStatus.QUEUED:
            return _admitted(run, took_over)
        return opening(run, wake, took_over)

    updated = execute(prepare)
    if updated is not None:
        after_segment(updated)
        logger.info(
            "run %s of %s resumed -> %s",
            updated.id,
            updated.workflow,
            updated.status,
            extra=run_log_fields(updated),
        )
    return updated


def _admitted(run: WorkflowRun, recovered: pl.Recovered | None) -> Prepared:
    """A due queued run: its first segment if flow control admits it now, else
    it is parked again (nothing is written to its stream)."""
    workflow = _definition(run)
    if isinstance(workflow, Failure):
        if not registry.is_registered(run.workflow):
            return Opening(run.id, run.tenant_id, run, first=[], failure=workflow)
        # Nothing of it ran yet: it starts on the current definition (a deploy
        # while runs are queued does not fail the queue).
        workflow = registry.get(run.workflow)
        remember(workflow)
    hold = admission.admit_queued(run, workflow)
    if hold is not None:
        admission.park(run, hold)
        return None
    # Its row says queued until the segment is written: a start in the segment
    # (an event it appends) must count it as active all the same.
    entry = Pending(run.flow_scope, run.flow_key, quiet=False) if run.flow_key else None
    return opening(run, None, recovered, workflow=workflow, flow_entry=entry)


def resume_locked(run: WorkflowRun, wake: Wake) -> WorkflowRun | None:
    """Continue a run the caller has locked and checked (an awaited event woke it)."""
    updated = execute(lambda: opening(run, wake))
    if updated is not None:
        after_segment(updated)
    return updated


def satisfies(run: WorkflowRun, event: Event) -> bool:
    if run.status == RunStatus.WAITING and run.branch_waits:
        return any(wait.accepts(event) for wait in branch_waits(run, event.type))
    return run.status == RunStatus.WAITING_EVENT and awaited(run).accepts(event)


def awaited(run: WorkflowRun) -> Wait:
    """The wait of a run suspended in ``wait_for_event`` (the run row's columns)."""
    return Wait(
        run.awaited_event_type or "",
        run.tenant_id,
        run.awaited_match or {},
        Cutoff.of(run.awaited_after or 0, run.awaited_gaps, run.since_position, run.since_gaps),
    )


def branch_waits(run: WorkflowRun, event_type: str | None = None) -> list[Wait]:
    """The waits of a run's branches (its ``RunWait`` rows), those that an
    event of ``event_type`` may satisfy when it is given."""
    rows = RunWait.objects.filter(run_id=run.id)
    if event_type is not None:
        rows = rows.filter(event_type__in=awaited_as(event_type))
    return [
        Wait(
            awaited_type,
            run.tenant_id,
            match,
            Cutoff.of(after, own, run.since_position, run.since_gaps),
        )
        for awaited_type, match, after, own in rows.values_list(
            "event_type", "match", "after", "gaps"
        )
    ]


def lookback(run: WorkflowRun) -> Event | None:
    """The first event since the wait's cut-off that satisfies the waiting run."""
    return awaited(run).lookback()


def _definition(run: WorkflowRun) -> Workflow | Failure:
    if not registry.is_registered(run.workflow):
        return Failure(
            ev.NOT_REGISTERED,
            f'Workflow "{run.workflow}" is not registered: cannot resume run {run.id}.',
        )
    workflow = registry.find(run.workflow, run.workflow_version or None)
    if workflow is not None and workflow.fingerprint == run.fingerprint:
        return workflow
    current = registry.get(run.workflow)
    return Failure(
        ev.DEFINITION_CHANGED,
        f'Workflow "{run.workflow}" definition changed since run {run.id} started '
        f"(expected {run.fingerprint[:12]}…, current {current.fingerprint[:12]}…). "
        "Cancel the run or wait for it to complete before deploying definition changes, "
        "or keep the old definition registered with its version=.",
    )


def _trigger(run: WorkflowRun) -> Trigger:
    if run.trigger_position is None:
        return TriggerEvent(type=run.trigger_type, payload=run.input or {}, tenant_id=run.tenant_id)
    event = Event.objects.filter(position=run.trigger_position, tenant_id=run.tenant_id).first()
    if event is None:
        raise Failure(
            ev.TRIGGER_UNAVAILABLE,
            f"the trigger event at position {run.trigger_position} is no longer in the log",
        )
    return event


def _wake(run: WorkflowRun, wake: Wake | None) -> Wake:
    if run.status in (RunStatus.PENDING, RunStatus.QUEUED):
        return Wake(WakeReason.START)
    if run.status == RunStatus.RETRY_SCHEDULED:
        return Wake(WakeReason.RETRY)
    if run.status == RunStatus.WAITING:
        return wake or Wake(WakeReason.TIMER)
    # waiting for an event
    if wake is not None and wake.reason == WakeReason.EVENT:
        return wake
    if run.matched_position is not None:
        event = Event.objects.filter(position=run.matched_position).first()
        if event is None:
            raise Failure(
                ev.AWAITED_UNAVAILABLE,
                f"the awaited event at position {run.matched_position} is no longer in the log",
            )
        return Wake(WakeReason.EVENT, event)
    # The timeout is over: a matching event may have slipped in since the wait began.
    found = lookback(run)
    return Wake(WakeReason.EVENT, found) if found is not None else Wake(WakeReason.TIMEOUT)


def opening(
    run: WorkflowRun,
    wake: Wake | None,
    recovered: pl.Recovered | None = None,
    *,
    workflow: Workflow | None = None,
    flow_entry: Pending | None = None,
) -> Opening:
    """The segment that continues a locked, suspended run (or records why it
    cannot). ``workflow``: the definition an admitted queued run starts on."""
    found = workflow if workflow is not None else _definition(run)
    if isinstance(found, Failure):  # nothing runs: no step.resumed
        return Opening(run.id, run.tenant_id, run, first=[], failure=found)
    workflow = found
    gave_up: list[tuple[str, pl.Payload]] = (
        [(ev.RUN_ADMITTED, pl.RunAdmitted(held_by=run.held_by))]
        if run.status == RunStatus.QUEUED
        else [(ev.STEP_RESUMED, pl.StepResumed(cursor=run.cursor))]
    )
    try:
        state = check_state(copy.deepcopy(run.state))
        if run.child_waits:
            state_part(state, "settled").update(children_settled(run))
        cursor = None if run.status in (RunStatus.PENDING, RunStatus.QUEUED) else run.cursor
        if cursor is not None and compensation.active(cursor):
            compensation.check(workflow, cursor, state)
        elif cursor is not None:
            workflow.step_at(cursor)
        elif run.status not in (RunStatus.PENDING, RunStatus.QUEUED):
            raise ValueError("a suspended run has no cursor")
    except (ValueError, TypeError, AttributeError) as exc:
        failure = Failure(ev.CORRUPT_STATE, f"the run's stored state is unusable: {exc}")
        return Opening(run.id, run.tenant_id, run, first=gave_up, failure=failure)
    try:
        trigger = _trigger(run)
        actual = _wake(run, wake)
    except Failure as failure:
        return Opening(run.id, run.tenant_id, run, first=gave_up, failure=failure)
    if run.status == RunStatus.QUEUED:  # admitted: its first segment
        admitted: pl.RunAdmitted = {"held_by": run.held_by}
        if workflow.fingerprint != run.fingerprint:  # queued across a deploy
            admitted["fingerprint"] = workflow.fingerprint
            admitted["version"] = workflow.version
        if recovered:
            admitted["recovered"] = recovered
        return Opening(
            run.id,
            run.tenant_id,
            run,
            first=[(ev.RUN_ADMITTED, admitted)],
            steps=Steps(workflow, trigger, cursor=None, state=state, wake=actual),
            flow_entry=flow_entry,
        )
    resumed: pl.StepResumed = {"cursor": cursor, "by": actual.reason, "attempt": run.attempt}
    if recovered:
        resumed["recovered"] = recovered
    if actual.event is not None:
        resumed["event"] = {
            "position": actual.event.position,
            "event_id": str(actual.event.event_id),
        }
    return Opening(
        run.id,
        run.tenant_id,
        run,
        first=[(ev.STEP_RESUMED, resumed)],
        steps=Steps(workflow, trigger, cursor=cursor, state=state, wake=actual),
    )


def children_settled(run: WorkflowRun) -> dict[str, dict[str, Any]]:
    """The outcomes of the run's children that ended since it suspended."""
    events = Event.objects.filter(
        tenant_id=run.tenant_id,
        stream_id=str(run.id),
        type=ev.CHILD_SETTLED,
        version__gt=run.suspended_version,
    )
    return {
        p["child_id"]: {k: v for k, v in p.items() if k != "child_id"}
        for p in events.order_by("version").values_list("payload", flat=True)
    }


def after_segment(run: WorkflowRun) -> None:
    """Tell the loops (after commit) about work a segment left behind."""
    if run.status == RunStatus.WAITING_EVENT or run.branch_waits:
        recheck_after_commit(run)
    if run.wake_at is not None:
        work_committed(WorkKind.RESUME, run.wake_at, run.id)


# --- awaited events ---------------------------------------------------------


def _waiting_query(event: Event) -> QuerySet[WorkflowRun, WorkflowRun] | None:
    """Runs of the event's tenant that wait for an event like this one (or None):
    on their own row, or in a branch (``RunWait``)."""
    condition = None
    branches = None
    for awaited in awaited_as(event.type):
        path_sets = registry.awaited_paths(awaited)
        keys = matching.keys_for_event(event, path_sets) if path_sets else []
        if keys:
            q = Q(awaited_event_type=awaited, correlation_key__in=keys)
            condition = q if condition is None else condition | q
            w = Q(event_type=awaited, correlation_key__in=keys)
            branches = w if branches is None else branches | w
    if condition is None or branches is None:
        return None
    # No cut-off in SQL: an event that commits late may have a position below
    # a run's cut-off and still count (a gap of its start); ``satisfies`` decides.
    single = WorkflowRun.objects.filter(condition).filter(
        tenant_id=event.tenant_id, status=RunStatus.WAITING_EVENT
    )
    if not any(registry.awaited_in_branches(a) for a in awaited_as(event.type)):
        return single.order_by("started_at")
    in_branches = RunWait.objects.filter(branches, tenant_id=event.tenant_id).values("run_id")
    runs = WorkflowRun.objects.filter(
        Q(pk__in=single.values("pk")) | Q(pk__in=in_branches, status=RunStatus.WAITING)
    )
    return runs.order_by("started_at")


def waiting_for(event: Event) -> list[uuid.UUID]:
    qs = _waiting_query(event)
    return [] if qs is None else list(qs.values_list("id", flat=True))


def is_awaited(event_type: str) -> bool:
    return any(registry.awaited_paths(a) for a in awaited_as(event_type))


def wake_waiters(event: Event) -> None:
    """Wake the runs an appended event satisfies, in the appending transaction."""
    qs = _waiting_query(event)
    if qs is not None:
        if settings.EVENT_WAKE == "inline":
            # Find them without locking, then lock them by primary key, in the
            # lock order (their waiting parents first): a locking read through a
            # secondary index would lock every row it scans on MariaDB, and two
            # appenders that wake different runs could deadlock.
            ids = list(qs.values_list("id", flat=True))
            if ids:
                for run in lock_order.lock_runs(ids):
                    if satisfies(run, event):
                        if held(run):  # paused: recorded, taken when it is resumed
                            mark_matched(run.id, event)
                        else:
                            _wake_inline(run, event)
        else:
            for run_id in qs.values_list("id", flat=True):
                mark_matched(run_id, event)
    if not _settles_a_wait_only(event) and not writers_serialized():
        # robust: the appender's commit succeeded; a failing check must not
        # look like a failed commit to it (the resume loop finds the run later).
        db.on_commit(partial(_recheck_event, event))


def _wake_inline(run: WorkflowRun, event: Event) -> None:
    """Resume a waiting run in the appending transaction; never fail the append.

    A refused segment is recorded by the runner; if even that is refused, the
    run stays waiting (its event is in the log: a later look-back finds it)
    and the appender's transaction goes on.
    """
    try:
        resume_locked(run, Wake(WakeReason.EVENT, event))
    except Exception as exc:
        if is_transient(exc):
            raise
        logger.exception(
            "run %s: could not be woken by event %s",
            run.id,
            event.position,
            extra=run_log_fields(run),
        )


def _deliver(run_id: uuid.UUID, event: Event) -> None:
    if settings.EVENT_WAKE == "inline" and not _held(run_id):
        resume_run(run_id, wake=Wake(WakeReason.EVENT, event))
    else:
        mark_matched(run_id, event)


def _held(run_id: uuid.UUID) -> bool:
    run = WorkflowRun.objects.filter(pk=run_id).only("paused", "workflow", "tenant_id").first()
    return run is not None and held(run)


def mark_matched(run_id: uuid.UUID, event: Event) -> None:
    """Record the awaited event on the run and make it due for the resume loop."""
    with db.atomic():
        run = lock_run(run_id, skip_locked=False)
        if run is None or not satisfies(run, event) or run.matched_position is not None:
            return
        try:
            with db.atomic():
                segment = Segment(run.id, run.tenant_id, run)
                matched: pl.EventMatched = {
                    "event": {"position": event.position, "event_id": str(event.event_id)}
                }
                segment.add(ev.EVENT_MATCHED, matched)
                segment.write()
        except (IntegrityError, StaleRow):
            return
        work_committed(WorkKind.RESUME, event.created_at, run_id)


def writers_serialized() -> bool:
    """One write transaction at a time (SQLite): a suspension and an append
    cannot interleave there, so the after-commit checks are not needed."""
    return db.one_writer_at_a_time()


def _recheck_event(event: Event) -> None:
    """After the append committed: a run that began waiting concurrently (its
    transaction did not yet see the event, ours did not yet see the run) is
    found now."""
    for run_id in waiting_for(event):
        _deliver(run_id, event)


def recheck_after_commit(run: WorkflowRun) -> None:
    if writers_serialized():
        return
    look_back_after_commit(run)


def look_back_after_commit(run: WorkflowRun) -> None:
    """After commit, look back once for the event(s) the run waits for (a
    resumed run: an event that came while it was paused and found no wait to
    mark, in a race with the pause, is taken now)."""
    run_id, version = run.id, run.version
    db.on_commit(partial(_recheck_run, run_id, version))


def _recheck_run(run_id: uuid.UUID, version: int) -> None:
    """After a suspension committed: look back once more for its event (for
    each of its branches' events)."""
    run = WorkflowRun.objects.filter(pk=run_id, version=version).first()
    if run is None:
        return
    if run.status == RunStatus.WAITING and run.branch_waits:
        for wait in branch_waits(run):
            found = wait.lookback()
            if found is not None:
                _deliver(run_id, found)
                return
        return
    if run.status != RunStatus.WAITING_EVENT or run.matched_position is not None:
        return
    found = lookback(run)
    if found is not None:
        _deliver(run_id, found)
