"""Flow control of runs: keys resolved at the start, admission, release.

A workflow with ``concurrency=``, ``rate=`` or a debounced trigger records
its keys on ``run-started`` (``flow``); a run that may not start yet is
recorded as ``queued`` with what holds it, and nothing of it runs. The
resume loop takes a queued run when it is due (its rate's next window, the
end of its debounce, a slot freed) and admits it (``run-admitted``, then
its first segment) or parks it again. A limited run that finishes wakes
the runs parked behind its key, in the same transaction.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from kumiflow_django.definition.context import Trigger
from kumiflow_django.definition.durations import isoformat
from kumiflow_django.definition.flow import resolve_key
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.workflow import Workflow
from kumiflow_django.engine.failure import Failure
from kumiflow_django.flow import admission, gates
from kumiflow_django.flow.admission import Admission, Concurrency, Hold, RateSpec
from kumiflow_django.flow.gates import ACTIVE, RUNS
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.store import db
from kumiflow_django.store import names as ev
from kumiflow_django.store.db import is_transient
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.values import clean_text

logger = get_logger("kumiflow_django.flow")

#: A run whose workflow lost its limit keeps its key: every parked run is woken.
UNLIMITED = 2**31 - 1


def scope_of(workflow: Workflow) -> str:
    limit = workflow.concurrency
    return (limit.scope if limit is not None else None) or workflow.name


def rate_scope_of(workflow: Workflow) -> str:
    rate = workflow.rate
    return (rate.scope if rate is not None else None) or workflow.name


def resolve(workflow: Workflow, trigger: Trigger) -> dict[str, Any] | None:
    """The run's flow keys (for ``run-started``); raises Failure when a key
    resolver raises or returns something that is not a short string."""
    if workflow.concurrency is None and workflow.rate is None:
        return None
    flow: dict[str, Any] = {}
    try:
        if workflow.concurrency is not None:
            flow["scope"] = scope_of(workflow)
            flow["key"] = resolve_key(workflow.concurrency.key, trigger, "the concurrency key")
        if workflow.rate is not None:
            flow["rate_key"] = resolve_key(workflow.rate.key, trigger, "the rate key")
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # user code: SystemExit fails the start like any error
        if is_transient(exc):
            raise
        raise Failure(
            ev.FLOW_KEY_FAILED,
            clean_text(f"{type(exc).__name__} resolving a flow key: {exc}", 600),
        ) from exc
    return flow


def _concurrency(workflow: Workflow | None, scope: str, key: str) -> Concurrency | None:
    if not key:
        return None
    limit = workflow.concurrency if workflow is not None else None
    return Concurrency(scope, key, limit.max if limit is not None else UNLIMITED)


def _rate(workflow: Workflow, key: str) -> RateSpec | None:
    rate = workflow.rate
    if rate is None or not key:
        return None
    return RateSpec(rate_scope_of(workflow), key, rate.limit, rate.period)


def admit_new(workflow: Workflow, flow: dict[str, Any] | None) -> Admission:
    """Whether a run starting now may run, or what holds it (see
    :func:`kumiflow_django.flow.admission.admit`)."""
    if not flow:
        return Admission(None)
    return admission.admit(
        RUNS,
        _concurrency(workflow, flow.get("scope", ""), flow.get("key", "")),
        _rate(workflow, flow.get("rate_key", "")),
        new=True,
    )


def admit_queued(run: WorkflowRun, workflow: Workflow) -> Hold | None:
    """Whether a due queued run may run now (None), or what holds it now."""
    return admission.admit(
        RUNS,
        _concurrency(workflow, run.flow_scope, run.flow_key),
        _rate(workflow, run.rate_key),
        # A debounced run was never in a key's line, nor a rate-held one.
        new=run.held_by != admission.CONCURRENCY,
    ).hold


def held_payload(hold: Hold) -> dict[str, Any]:
    held: dict[str, Any] = {"why": hold.why}
    if hold.until is not None:
        held["until"] = isoformat(hold.until)
    if hold.detail:
        held["detail"] = hold.detail
    return held


def park(run: WorkflowRun, hold: Hold) -> None:
    """A due queued run that may not run yet waits again (not an event: the
    log says it is queued; when it is checked again is the worker's business)."""
    WorkflowRun.objects.filter(pk=run.id).update(
        wake_at=hold.until, held_by=hold.why, lease_owner="", lease_until=None
    )


def holds_slot(run: WorkflowRun) -> bool:
    """Whether the run, as its row is before its end, holds a slot of its key
    or was given one (woken, not admitted yet): only then does its end free
    one. A run parked behind its key holds nothing, and its end takes no key
    lock: a waker holding the key waits for the parked rows it wakes."""
    if run.status in ACTIVE:
        return True
    return (
        run.status == RunStatus.QUEUED
        and run.held_by == admission.CONCURRENCY
        and run.wake_at is not None
    )


def release(run: WorkflowRun, *, recheck: bool = False) -> int:
    """A limited run stopped being active (in this transaction): wake the runs
    parked behind its key (``recheck``: see :func:`wake_stranded`). Returns
    how many were woken."""
    if not run.flow_key:
        return 0
    workflow = registry.find(run.workflow, run.workflow_version or None)
    if workflow is None and registry.is_registered(run.workflow):
        workflow = registry.get(run.workflow)
    concurrency = _concurrency(workflow, run.flow_scope, run.flow_key)
    if concurrency is None:
        return 0
    return admission.release(RUNS, concurrency, recheck=recheck)


#: Parked runs the sweep reads per pass (each pass goes on where the last stopped).
SWEEP_BATCH = 500


class StrandedSweep:
    """The safety net under the wakes: parked runs whose key has a free slot.

    A parked run waits for the end of an active run of its key, and nothing
    else looks at it: a wake that was lost (a release that did not run, a
    count of parked runs that is too low) would leave it parked for good.
    Each pass reads the next :data:`SWEEP_BATCH` parked runs, newest start
    first (the status index: queued rows only, never the finished ones),
    and checks each of their keys once, under the key's lock, as a release
    does: free slots wake the first in line; a run parked behind an
    active one stays parked."""

    def __init__(self) -> None:
        #: Where the next pass starts (None: from the newest parked run).
        self.after: datetime | None = None

    def __call__(self, limit: int = SWEEP_BATCH) -> int:
        parked = WorkflowRun.objects.filter(
            status=RunStatus.QUEUED, held_by=admission.CONCURRENCY, wake_at__isnull=True
        )
        if self.after is not None:
            parked = parked.filter(started_at__lte=self.after)
        # Newest first, the order of the status index (status, -started_at).
        rows = list(
            parked.order_by("-started_at").values_list(
                "pk", "started_at", "flow_scope", "flow_key"
            )[:limit]
        )
        if len(rows) < limit:
            self.after = None  # a full lap: the next pass starts again from the newest
        else:
            last = rows[-1][1]
            # A batch of one instant moves on past it (else it would be read again and again).
            self.after = last if last != self.after else last - timedelta(microseconds=1)
        first_of_key: dict[tuple[str, str], Any] = {}
        for pk, _, scope, key in rows:
            if key:
                first_of_key.setdefault((scope, key), pk)
        woken = 0
        for pk in first_of_key.values():
            with db.atomic():
                run = WorkflowRun.objects.filter(pk=pk).first()
                if run is not None:
                    woken += release(run, recheck=True)
        if woken:
            logger.warning("flow control: woke %d parked run(s) whose key had a free slot", woken)
        tasks = gates.wake_stranded_tasks(limit)
        if tasks:
            logger.warning(
                "flow control: woke %d parked task attempt(s) whose key had a free slot", tasks
            )
        return woken + tasks


def wake_stranded(limit: int = SWEEP_BATCH) -> int:
    """One pass of :class:`StrandedSweep` from the newest parked run."""
    return StrandedSweep()(limit)


def hold_text(run: WorkflowRun, now: datetime) -> str:
    """Why a queued run is not running yet, for people."""
    if run.held_by == admission.CONCURRENCY:
        if run.wake_at is not None:
            return f"a slot of {run.flow_scope} key {run.flow_key!r} freed: it starts next"
        return f"waits for a slot: {run.flow_scope} key {run.flow_key!r} is at its limit"
    if run.held_by == admission.RATE:
        when = isoformat(run.wake_at) if run.wake_at else "the next window"
        return f"rate of key {run.rate_key!r} used up: waits for {when}"
    if run.held_by == admission.DEBOUNCE:
        when = isoformat(run.wake_at) if run.wake_at else "?"
        return f"debounced (key {run.debounce_key!r}): starts at {when} unless more events come"
    return ""
