"""Runs whose definition no live worker process serves: left, shown, and failed after a grace.

A run is pinned to the fingerprint of the definition it started on. The
resume loop claims only what this process can run (:func:`claim_filter`);
every other resume (an appended event woken inline, a Django Tasks wake-up)
asks :func:`~kumiflow_django.definition.serving.here` and leaves the run
due for a process that has its definition. A run nobody can take stays due
and is counted (:func:`waiting`, shown in the console and in ``/metrics``);
after ``KUMIFLOW_UNKNOWN_DEFINITION_GRACE`` a worker's sweep fails it
(:func:`fail_overdue`) through the segment runner, with a reason that names
the missing definition.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.db.models import Q, QuerySet

from kumiflow_django.conf import settings
from kumiflow_django.definition.serving import Served, claimable
from kumiflow_django.definition.snapshots import DefinitionSnapshot
from kumiflow_django.engine.failure import Failure
from kumiflow_django.engine.opening import Opening, Prepared
from kumiflow_django.engine.runner import execute
from kumiflow_django.projections import lock_order
from kumiflow_django.projections.runs import SUSPENDED, RunStatus, WorkflowRun
from kumiflow_django.store import clock
from kumiflow_django.store import names as ev
from kumiflow_django.store.telemetry import get_logger, run_log_fields

logger = get_logger("kumiflow_django.engine.unserved")


def claim_filter(served: Served | None = None, *, takeover: bool = True) -> Q:
    """The due runs this process may claim: those on a definition it has (or
    one it takes over, see :func:`~kumiflow_django.definition.serving.claimable`),
    and the queued runs of its workflows (nothing of them ran yet: they start
    on the current definition). ``takeover=False``: none of other
    definitions (a worker not up long enough to know every live one)."""
    fingerprints, workflows = claimable(served or Served.read(), takeover=takeover)
    return Q(fingerprint__in=sorted(fingerprints)) | Q(
        status=RunStatus.QUEUED, workflow__in=sorted(workflows)
    )


def taken_over(served: Served) -> frozenset[str]:
    """Fingerprints no live process serves, but that a live process takes its
    runs over from (older than the definition it starts new runs on)."""
    if not served.current:
        return frozenset()
    rows = DefinitionSnapshot.objects.filter(workflow__in=list(served.current)).values_list(
        "fingerprint", "workflow", "created_at"
    )
    known = {fp: (workflow, created) for fp, workflow, created in rows}
    newest: dict[str, datetime] = {}
    for workflow, fps in served.current.items():
        dates = [known[fp][1] for fp in fps if fp in known]
        if len(dates) < len(fps):  # a current definition never stored: newest of all
            newest[workflow] = datetime.max.replace(tzinfo=clock.now().tzinfo)
        elif dates:
            newest[workflow] = max(dates)
    return frozenset(
        fp
        for fp, (workflow, created) in known.items()
        if fp not in served.fingerprints and workflow in newest and created <= newest[workflow]
    )


def waiting(
    now: datetime | None = None, served: Served | None = None
) -> QuerySet[WorkflowRun, WorkflowRun]:
    """Due runs that wait for a worker with their definition: no live worker
    process serves their fingerprint or takes them over (a queued run: no
    live process has its workflow)."""
    now = now or clock.now()
    served = served or Served.read(now)
    runnable = served.fingerprints | taken_over(served)
    queued = Q(status=RunStatus.QUEUED)
    return (
        WorkflowRun.objects.due(now)
        .exclude(~queued & Q(fingerprint__in=sorted(runnable)))
        .exclude(queued & Q(workflow__in=sorted(served.current)))
    )


def describe(run: WorkflowRun) -> str:
    """The definition a run waits for, as the console and the failure name it."""
    version = f' version "{run.workflow_version}"' if run.workflow_version else ""
    return f'definition {run.fingerprint[:12]} of "{run.workflow}"{version}'


def fail_overdue(now: datetime | None = None, *, limit: int = 100) -> int:
    """Fail the runs that have waited longer than the grace for a worker with
    their definition. Each in a segment of its own (the one end of a run)."""
    now = now or clock.now()
    grace = timedelta(seconds=settings.UNKNOWN_DEFINITION_GRACE)
    served = Served.read(now)
    overdue = list(
        waiting(now, served)
        .filter(wake_at__lte=now - grace)
        .order_by("wake_at")
        .values_list("id", flat=True)[:limit]
    )
    failed = 0
    for run_id in overdue:
        if _fail(run_id, now - grace) is not None:
            failed += 1
    return failed


def _fail(run_id: uuid.UUID, before: datetime) -> WorkflowRun | None:
    """Fail one overdue run, if it still is once locked. The pass's reading of
    the heartbeat rows is old by then: a worker that came up since, or a lease
    a worker took on the run since, is asked again under the lock, so the
    sweep never fails a run that a live worker is about to resume."""

    def prepare() -> Prepared:
        run = lock_order.lock_run(run_id, skip_locked=True)
        if run is None or run.status not in SUSPENDED:
            return None
        if run.wake_at is None or run.wake_at > before:
            return None
        if run.lease_until is not None and run.lease_until > clock.now():
            return None  # a worker claimed it since the pass began
        served = Served.read()
        if run.status == RunStatus.QUEUED and run.workflow in served.current:
            return None
        if run.fingerprint in served.fingerprints | taken_over(served):
            return None
        failure = Failure(
            ev.DEFINITION_NOT_SERVED,
            f"No live worker process served {describe(run)} (fingerprint {run.fingerprint}) "
            f"for {settings.UNKNOWN_DEFINITION_GRACE:g}s after run {run.id} became due. "
            "Deploy a worker with that definition, or keep it registered with its "
            "version=, then retry the run.",
        )
        logger.warning("run %s: %s", run.id, failure.error, extra=run_log_fields(run))
        return Opening(run.id, run.tenant_id, run, first=[], failure=failure)

    return execute(prepare)
