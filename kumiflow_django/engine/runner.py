"""The one segment runner: start, resume and failure go through :func:`execute`.

A segment opens (a new run, or a locked suspended one), runs its steps,
folds the events into the row and writes everything in one transaction
(a savepoint inside a caller's transaction). What can happen:

- the steps suspend or finish: the segment commits;
- a step fails (or the run cannot go on: a changed definition, an erased
  trigger): the segment is rolled back as a whole, and the failure is
  recorded in a second transaction, at the version the segment began at;
- another writer got there first (the stream's version is taken, or the
  row moved on): nothing is written, the caller skips;
- the database is unreachable or broke a deadlock: the error propagates,
  and the same work is tried again soon;
- the database refuses to store the segment (a value or a check it will
  refuse again): the refusal is recorded and the run is tried again after
  a backoff; after :data:`MAX_REFUSALS` refusals the run fails with reason
  ``unstorable_state``. One poison run never spins a worker, and the
  transaction of a caller whose event started or woke the run commits.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from kumiflow_django.definition.backoff import BackoffPolicy
from kumiflow_django.definition.context import WakeReason
from kumiflow_django.definition.durations import isoformat
from kumiflow_django.engine import compensation, observed, pausing
from kumiflow_django.engine.failure import Failure
from kumiflow_django.engine.opening import Opening, Prepared, keyed_run
from kumiflow_django.engine.run_start import RunStart
from kumiflow_django.engine.segment import Segment, advance
from kumiflow_django.flow.admission import counted_until_written
from kumiflow_django.projections import lock_order
from kumiflow_django.projections.runs import WorkflowRun
from kumiflow_django.projections.stream import StaleRow
from kumiflow_django.store import clock, db, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store import payloads as pl
from kumiflow_django.store.models import Event
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.values import clean_text

logger = get_logger("kumiflow_django.engine.runner")

#: Refusals of one run's segment before the run fails with ``unstorable_state``.
MAX_REFUSALS = 5
#: The wait after each refusal: 2, 4, 8, 16 seconds.
REFUSAL_BACKOFF = BackoffPolicy(attempts=MAX_REFUSALS, base=2.0, max_delay=300.0)
#: The run table's unique key of keyed runs.
IDEMPOTENCY_CONSTRAINT = "kumiflow_run_idempotency_uq"


def execute(prepare: Callable[[], Prepared]) -> WorkflowRun | None:
    """Run one segment. ``prepare`` runs inside the segment's transaction (it
    locks and checks the run); see the module docstring for the outcomes.

    Returns the run as the segment (or the recorded failure or refusal) left
    it, or None when there was nothing to do. The caller announces the work
    the run left behind (``resuming.after_segment``) after this returns.
    """
    with observed.Watch() as watch:  # telemetry: the segment's span, log fields, metrics
        return watch.done(_execute(prepare, watch))


def _execute(prepare: Callable[[], Prepared], watch: observed.Watch) -> WorkflowRun | None:
    opening: Opening | None = None
    try:
        # Its RELEASE is left to an append's or a start's block it is directly in.
        with db.atomic(leaves_release=True):
            prepared = prepare()
            if not isinstance(prepared, Opening):
                return prepared
            opening = prepared
            watch.open(opening)
            with counted_until_written(opening.unwritten):
                return _run(opening)
    except Failure as failure:  # a step failed: its segment was rolled back as a whole
        assert opening is not None
        fields = telemetry.log_fields(step_path=failure.cursor)
        logger.warning("run %s failed: %s", opening.run_id, failure, extra=fields)
        return _record(opening, opening.first, (ev.RUN_FAILED, failure.payload()), failure)
    except StaleRow:
        return None
    except Exception as exc:
        # A broken outer transaction cannot record the refusal (nor read how
        # many came before): the caller gets the error that broke it.
        if opening is None or db.is_transient(exc) or db.transaction_broken() is not None:
            raise
        if db.is_version_clash(exc):
            logger.info("run %s: another writer moved it on first; skipped", opening.run_id)
            return None
        if opening.key is not None and db.is_unique_violation(exc, IDEMPOTENCY_CONSTRAINT):
            return keyed_run(opening.tenant, opening.workflow_name, opening.key)
        watch.refused = True
        return _refuse(opening, exc)


def _run(opening: Opening) -> WorkflowRun:
    segment = Segment(opening.run_id, opening.tenant, opening.row)
    for type_, payload in opening.first:
        observed.stamp(segment.add(type_, dict(payload)), opening)
    if opening.failure is not None:  # known before anything runs: nothing to roll back
        fields = telemetry.log_fields(step_path=opening.failure.cursor)
        logger.warning("run %s failed: %s", opening.run_id, opening.failure, extra=fields)
        segment.add(ev.RUN_FAILED, opening.failure.payload())
    elif opening.steps is not None:
        steps = opening.steps
        advance(
            segment,
            steps.workflow,
            steps.trigger,
            cursor=steps.cursor,
            state=steps.state,
            wake=steps.wake,
            start_child=start,
        )
    return segment.write()


def start(run_start: RunStart) -> WorkflowRun | None:
    """Start a run (see :mod:`kumiflow_django.engine.run_start`): every start,
    a trigger's, a call's, cron's or a child step's, goes through here. In a
    savepoint of the caller's transaction; returns the run as its start left
    it (or the keyed run that existed already). The caller has remembered
    the definition it starts on (``snapshots.remember``, once per definition
    and transaction: a fan-out of a thousand children stores it once)."""
    return execute(run_start.prepare)


def _record(
    opening: Opening,
    first: list[tuple[str, pl.Payload]],
    closing: tuple[str, pl.Payload],
    failure: Failure | None = None,
) -> WorkflowRun | None:
    """Write ``first`` and ``closing`` in a transaction of their own, at the
    version the segment began at; None if the run moved on meanwhile.

    A run that fails after steps with compensations completed (in committed
    segments) starts compensating instead (see ``engine.compensation``); a
    run of a workflow with ``on_exhausted="pause"`` is paused instead
    (``engine.pausing``).
    """
    try:
        with db.atomic():
            row = None
            if not opening.new:
                row = lock_order.lock_run(opening.run_id)
                if row is None or row.version != opening.version:
                    return None
            if failure is not None:
                # on_exhausted="pause": paused where it stood, not failed nor compensated
                paused = pausing.exhausted_pause(opening, row, failure)
                if paused is not None:
                    closing = paused
                elif row is not None:
                    closing = compensation.start(row, failure) or closing
            segment = Segment(opening.run_id, opening.tenant, row)
            for type_, payload in [*first, closing]:
                observed.stamp(segment.add(type_, dict(payload)), opening)
            return segment.write()
    except StaleRow:
        return None
    except Exception as exc:
        if db.is_version_clash(exc):
            return None
        if opening.key is not None and db.is_unique_violation(exc, IDEMPOTENCY_CONSTRAINT):
            return keyed_run(opening.tenant, opening.workflow_name, opening.key)
        raise


def _refuse(opening: Opening, error: Exception) -> WorkflowRun | None:
    """Record that the database refused the segment; give up after MAX_REFUSALS."""
    attempt = refusals(opening) + 1
    text = clean_text(f"{type(error).__name__}: {error}", 1000)
    # A new run keeps its start; a suspended one stays where it was.
    first = [item for item in opening.first if item[0] == ev.RUN_STARTED]
    if attempt >= MAX_REFUSALS:
        logger.error(
            "run %s: the database refused its segment %d times; failed (%s)",
            opening.run_id,
            attempt,
            text,
        )
        failed: pl.RunFailed = {
            "reason": ev.UNSTORABLE_STATE,
            "error": f"the database refused to store the run's segment {attempt} times: {text}",
            "trail": [],
        }
        closing: tuple[str, pl.Payload] = (ev.RUN_FAILED, failed)
    else:
        delay: timedelta = REFUSAL_BACKOFF.delay(attempt)
        logger.warning(
            "run %s: the database refused its segment (%s); trying again in %ds",
            opening.run_id,
            text,
            delay.total_seconds(),
        )
        payload: pl.SegmentRefused = {
            "attempt": attempt,
            "error": text,
            "retry_at": isoformat(clock.now() + delay),
        }
        steps = opening.steps
        if steps is not None and steps.wake.reason == WakeReason.EVENT and steps.wake.event:
            event = steps.wake.event
            payload["event"] = {"position": event.position, "event_id": str(event.event_id)}
        closing = (ev.SEGMENT_REFUSED, payload)
    return _record(opening, first, closing)


def refusals(opening: Opening) -> int:
    """How many times in a row the run's segment was refused (its last event says)."""
    if opening.new:
        return 0
    last = (
        Event.objects.filter(
            tenant_id=opening.tenant, stream_id=str(opening.run_id), version=opening.version
        )
        .values_list("type", "payload")
        .first()
    )
    if last is None or last[0] != ev.SEGMENT_REFUSED:
        return 0
    attempt = last[1].get("attempt") if isinstance(last[1], dict) else None
    return attempt if isinstance(attempt, int) and attempt > 0 else 0
