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
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db import IntegrityError

from kumiflow_django.conf import settings
from kumiflow_django.definition import matching, serving
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
from kumiflow_django.engine import compensation, deploys
from kumiflow_django.engine.failure import Failure
from kumiflow_django.engine.opening import Opening, Prepared, Steps
from kumiflow_django.engine.pausing import held
from kumiflow_django.engine.runner import execute
from kumiflow_django.engine.segment import Segment
from kumiflow_django.flow import admission
from kumiflow_django.flow.admission import Item, Unwritten
from kumiflow_django.projections import lock_order, waits
from kumiflow_django.projections.runs import SUSPENDED, RunStatus, WorkflowRun
from kumiflow_django.projections.stream import StaleRow
from kumiflow_django.projections.waits import ROOT, RunWait, waits_events
from kumiflow_django.store import clock, db, sql, telemetry
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


def lock_run(
    run_id: uuid.UUID, *, skip_locked: bool, placed: lock_order.Placed | None = None
) -> WorkflowRun | None:
    return lock_order.lock_run(run_id, skip_locked=skip_locked, placed=placed)  # in the lock order


def resume_run(
    run_id: uuid.UUID,
    *,
    wake: Wake | None = None,
    skip_locked: bool = False,
    expected_version: int | None = None,
    recovered: pl.Recovered | None = None,
    placed: lock_order.Placed | None = None,
) -> WorkflowRun | None:
    """Continue a suspended run that is due (or that ``wake.event`` satisfies).

    ``recovered`` names the worker whose lease on the run expired: the
    takeover is recorded on ``step.resumed``. ``placed``: where the run is in
    the lock order, read by the caller with the run (the resume loop's lease):
    the lock does not read it again.

    Returns the run after its segment, or None when there was nothing to do:
    not due, already resumed by someone else, locked by another worker.
    """

    def prepare() -> Prepared:
        run = lock_run(run_id, skip_locked=skip_locked, placed=placed)
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
        if not _served_here(run):
            if wake is not None and wake.event is not None:
                _match(run, wake.event)
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
    found = _definition(run)
    if isinstance(found, Failure):
        return Opening(run.id, run.tenant_id, run, first=[], failure=found)
    # Nothing of it ran yet: a queued run across a deploy starts on the current
    # definition (``run-admitted`` says so; a deploy does not fail the queue).
    workflow = found.workflow
    if workflow.fingerprint != run.fingerprint:
        remember(workflow)
    item = Item.run(run, workflow)
    admitted = admission.admit(item)  # parked again when it is still held
    if admitted.hold is not None:
        return None
    # Its row says queued until the segment is written: a start in the segment
    # (an event it appends) must count it as active all the same.
    unwritten = admission.unwritten(item, admitted)
    return opening(run, None, recovered, workflow=workflow, unwritten=unwritten)


def resume_locked(run: WorkflowRun, wake: Wake) -> WorkflowRun | None:
    """Continue a run the caller has locked and checked (an awaited event woke it)."""
    if not _served_here(run):
        if wake.event is not None:
            _match(run, wake.event)
        return None
    updated = execute(lambda: opening(run, wake))
    if updated is not None:
        after_segment(updated)
    return updated


def satisfies(run: WorkflowRun, event: Event, found: list[Wait] | None = None) -> bool:
    """Whether ``event`` satisfies a wait of the locked ``run``. ``found``: the
    run's waits for events like it, read with the run at the version it has
    now (the wake-up's look-up); else they are read here."""
    if not _waits_now(run):
        return False
    candidates = found if found is not None else run_waits(run, event.type)
    return any(wait.accepts(event) for wait in candidates)


def _waits_now(run: WorkflowRun) -> bool:
    """It waits for an event: in ``wait_for_event``, or in its branches."""
    return run.status == RunStatus.WAITING_EVENT or (
        run.status == RunStatus.WAITING and run.branch_waits > 0
    )


def _wait(run: WorkflowRun, event_type: str, match: Any, after: int, own: Any) -> Wait:
    return Wait(
        event_type,
        run.tenant_id,
        match or {},
        Cutoff.of(after, own, run.since_position, run.since_gaps),
    )


def run_waits(run: WorkflowRun, event_type: str | None = None) -> list[Wait]:
    """The run's waits (its ``RunWait`` rows, the one place a wait is stored),
    those that an event of ``event_type`` may satisfy when it is given."""
    rows = RunWait.objects.filter(run_id=run.id)
    if event_type is not None:
        rows = rows.filter(event_type__in=awaited_as(event_type))
    return [
        _wait(run, *row)
        for row in rows.order_by("id").values_list("event_type", "match", "after", "gaps")
    ]


def awaited(run: WorkflowRun) -> Wait | None:
    """The wait of a run suspended in ``wait_for_event`` (its row of the root
    branch), or None."""
    if run.status != RunStatus.WAITING_EVENT:
        return None
    row = (
        RunWait.objects.filter(run_id=run.id, branch=ROOT)
        .values_list("event_type", "match", "after", "gaps")
        .first()
    )
    return _wait(run, *row) if row is not None else None


def lookback(run: WorkflowRun) -> Event | None:
    """The first event since the wait's cut-off that satisfies the waiting run."""
    wait = awaited(run)
    return wait.lookback() if wait is not None else None


def _served_here(run: WorkflowRun) -> bool:
    """Whether this process may resume the run: it has the run's definition (or
    takes its runs over). Otherwise the run is left, due, for a process that
    has it: never failed here for a definition this process lacks."""
    if serving.here(run.workflow, run.fingerprint, queued=run.status == RunStatus.QUEUED):
        return True
    logger.info(
        "run %s: left for a worker with definition %s of %s",
        run.id,
        run.fingerprint[:12],
        run.workflow,
        extra=run_log_fields(run),
    )
    return False


@dataclass(frozen=True)
class Definition:
    """The definition a resuming run continues on, and the switch to it (if any)."""

    workflow: Workflow
    switched: pl.DefinitionSwitched | None = None


def _definition(run: WorkflowRun) -> Definition | Failure:
    """The one place a resume decides which definition the run continues on
    (``engine.deploys.decide``, which ``kumiflow_plan`` asks too)."""
    decision = deploys.decide(deploys.RunFacts.of(run))
    if decision.fate == deploys.Fate.WAITS:
        return Failure(
            ev.NOT_REGISTERED,
            f'Workflow "{run.workflow}" is not registered: cannot resume run {run.id}.',
        )
    if decision.workflow is None:
        return Failure(ev.DEFINITION_CHANGED, decision.why)
    return Definition(decision.workflow, decision.switched(deploys.RunFacts.of(run)))


def _trigger(run: WorkflowRun) -> Trigger:
    if run.trigger_position is None:
        return TriggerEvent(type=run.trigger_type, payload=run.input or {}, tenant_id=run.tenant_id)
    event = sql.select_one(Event, position=run.trigger_position, tenant_id=run.tenant_id)
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
    unwritten: Unwritten | None = None,
) -> Opening:
    """The segment that continues a locked, suspended run (or records why it
    cannot). ``workflow``: the definition an admitted queued run starts on."""
    found = Definition(workflow) if workflow is not None else _definition(run)
    if isinstance(found, Failure):  # nothing runs: no step.resumed
        return Opening(run.id, run.tenant_id, run, first=[], failure=found)
    workflow = found.workflow
    # A compatible change: the run carries on on the registered definition,
    # recorded first in its segment (and folded into its row).
    switch: list[tuple[str, pl.Payload]] = []
    if found.switched is not None:
        switch = [(ev.DEFINITION_SWITCHED, found.switched)]
        remember(workflow)
        logger.info(
            "run %s of %s carried on from definition %s to %s",
            run.id,
            run.workflow,
            run.fingerprint[:12],
            workflow.fingerprint[:12],
            extra=run_log_fields(run),
        )
        db.on_commit(
            partial(
                telemetry.count,
                telemetry.DEFINITION_SWITCHES,
                workflow=run.workflow,
                classification=found.switched["classification"],
            )
        )
    gave_up: list[tuple[str, pl.Payload]] = (
        [(ev.RUN_ADMITTED, pl.RunAdmitted(held_by=run.held_by))]
        if run.status == RunStatus.QUEUED
        else [*switch, (ev.STEP_RESUMED, pl.StepResumed(cursor=run.cursor))]
    )
    try:
        state = check_state(copy.deepcopy(run.state))
        if run.child_waits:
            state_part(state, "settled").update(children_settled(run))
        # A run that has not begun has no cursor, but a restarted one (its from-step).
        cursor = run.cursor
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
            steps=Steps(workflow, trigger, cursor=cursor, state=state, wake=actual),
            unwritten=unwritten,
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
        first=[*switch, (ev.STEP_RESUMED, resumed)],
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
    if waits_events(run):
        recheck_after_commit(run)
    if run.wake_at is not None:
        work_committed(WorkKind.RESUME, run.wake_at, run.id)


# --- awaited events ---------------------------------------------------------


def _awaited(event: Event) -> waits.Awaited | None:
    """The waits an event like this one may satisfy (None: no wait can be
    for it), for the look-up (:func:`waits.awaiting`)."""
    awaited: list[tuple[str, list[str]]] = []
    for awaited_type in awaited_as(event.type):
        path_sets = registry.awaited_paths(awaited_type)
        keys = matching.keys_for_event(event, path_sets) if path_sets else []
        if keys:
            awaited.append((awaited_type, keys))
    return waits.Awaited(event.tenant_id, awaited) if awaited else None


def waiting_for(event: Event) -> list[uuid.UUID]:
    awaited = _awaited(event)
    if awaited is None:
        return []
    return list(dict.fromkeys(row[0] for row in waits.awaiting(awaited)))


def is_awaited(event_type: str) -> bool:
    return any(registry.awaited_paths(a) for a in awaited_as(event_type))


class _Found:
    """A waiting run as the wake-up's look-up read it: where it is in the lock
    order, its version then, and its waits for the event."""

    def __init__(self, depth: int, parent: uuid.UUID | None, parent_waits: bool, version: int):
        self.order = lock_order.Placed(depth, parent, parent_waits)
        self.version = version
        self.waits: list[tuple[str, Any, int, Any]] = []


def _found(awaited: waits.Awaited) -> dict[uuid.UUID, _Found]:
    """The look-up's one statement: the waits, with what the lock order needs
    of their runs and their versions."""
    found: dict[uuid.UUID, _Found] = {}
    for run_id, depth, parent, parent_waits, version, *wait in waits.awaiting(awaited):
        entry = found.setdefault(run_id, _Found(depth, parent, parent_waits, version))
        entry.waits.append((wait[0], wait[1], wait[2], wait[3]))
    return found


def wake_waiters(event: Event) -> None:
    """Wake the runs an appended event satisfies, in the appending transaction:
    resumed there (``KUMIFLOW_EVENT_WAKE``), or marked matched for the resume loop."""
    awaited = _awaited(event)
    if awaited is not None:
        # Find them without locking, then lock them by primary key, in the
        # lock order (their waiting parents first): a locking read through a
        # secondary index would lock every row it scans on MariaDB, and two
        # appenders that wake different runs could deadlock. The look-up
        # reads what the lock order needs and the runs' waits with them.
        # (Not the runs' triggers: a trigger is read under the run's lock,
        # so an erasure committed while the appender waited for it is seen.)
        inline = settings.EVENT_WAKE == "inline"
        found = _found(awaited)
        if found:
            placed = {run_id: entry.order for run_id, entry in found.items()}
            for run in lock_order.lock_placed(placed):
                entry = found[run.id]
                # Read at the version the run still has: its waits as read.
                waits = (
                    [_wait(run, *w) for w in entry.waits] if entry.version == run.version else None
                )
                if satisfies(run, event, waits):
                    # Paused, read under the run's lock (a scope's pause
                    # locks no run: one that committed after the look-up
                    # is seen only so): recorded, taken when it is resumed.
                    if not inline or held(run):
                        _match(run, event)
                    else:
                        _wake_inline(run, event)
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
    with db.atomic(takes_nested=True):
        run = lock_run(run_id, skip_locked=False)
        if run is None or not satisfies(run, event):
            return
        _match(run, event)


def _match(run: WorkflowRun, event: Event) -> None:
    """Record the awaited event on the locked run: it is due for the resume loop."""
    if run.matched_position is not None:
        return
    try:
        # Its RELEASE is left to the enclosing append's or recording's.
        with db.atomic(leaves_release=True):
            segment = Segment(run.id, run.tenant_id, run)
            matched: pl.EventMatched = {
                "event": {"position": event.position, "event_id": str(event.event_id)}
            }
            segment.add(ev.EVENT_MATCHED, matched)
            segment.write()
    except (IntegrityError, StaleRow):
        return
    work_committed(WorkKind.RESUME, event.created_at, run.id)


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
    each of its branches' events). One statement reads the run's waits with
    the columns of its row they need, at the version it suspended at (none:
    it moved on, or it waits for no event)."""
    rows = (
        RunWait.objects.filter(run_id=run_id, run__version=version)
        .order_by("id")
        .values_list(
            "run__status",
            "run__branch_waits",
            "run__matched_position",
            "run__tenant_id",
            "run__since_position",
            "run__since_gaps",
            "event_type",
            "match",
            "after",
            "gaps",
        )
    )
    for status, in_branches, matched, tenant, since, since_gaps, *wait in rows:
        if status == RunStatus.WAITING_EVENT and matched is not None:
            return  # its event is recorded: the resume loop takes it
        if status != RunStatus.WAITING_EVENT and not (status == RunStatus.WAITING and in_branches):
            return
        event_type, match, after, own = wait
        found = Wait(
            event_type, tenant, match or {}, Cutoff.of(after, own, since, since_gaps)
        ).lookback()
        if found is not None:
            _deliver(run_id, found)
            return
