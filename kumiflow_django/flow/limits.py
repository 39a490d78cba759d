"""Operating flow control: ``set_flow_limit`` raises (or lowers) a limit
without a deploy; :func:`purge_idle_keys` deletes the rows of keys nothing uses.

The override is a row (``FlowLimit``) read by every admission (each process
reads the overrides again at most :data:`~kumiflow_django.flow.admission.OVERRIDE_TTL`
seconds later, the calling process at once). Raising a limit wakes the runs
and attempts parked in its scope: they are admitted again by the new limit.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet

from kumiflow_django.definition.flow import MAX_SCOPE_LENGTH
from kumiflow_django.flow.admission import CONCURRENCY, OVERRIDE_TTL, RATE, forget_overrides
from kumiflow_django.flow.models import FlowKey, FlowLimit
from kumiflow_django.projections.runs import FINISHED, RunStatus, WorkflowRun
from kumiflow_django.projections.tasks import StepTask, TaskStatus
from kumiflow_django.store import clock, db
from kumiflow_django.store.audit import check_operator
from kumiflow_django.store.db import for_update
from kumiflow_django.store.errors import KumiflowError
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.wakeups import WorkKind, work_committed

logger = get_logger("kumiflow_django.flow")


def set_flow_limit(
    scope: str,
    *,
    max_active: int | None = None,
    rate_limit: int | None = None,
    by: str = "",
    reason: str = "",
) -> FlowLimit | None:
    """Override the limit (``max_active`` per key) and/or the rate (admissions
    per window) of ``scope``: a workflow's name, or the ``scope=`` of a
    ``Limit``/``Rate`` (a task step's default scope is ``workflow/step``).
    None keeps the declared value; with both None the override is removed.
    Every process admits by it within ``OVERRIDE_TTL`` seconds; the runs and
    attempts parked in the scope are checked again then. Returns the override
    (None when removed)."""
    if (
        not isinstance(scope, str)
        or not 0 < len(scope) <= MAX_SCOPE_LENGTH
        or any(ord(c) < 32 or ord(c) == 127 for c in scope)
    ):
        raise KumiflowError(
            f"a scope is a name of 1 to {MAX_SCOPE_LENGTH} characters without control characters"
        )
    for what, value in (("max_active", max_active), ("rate_limit", rate_limit)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise KumiflowError(f"{what} must be a positive integer or None, not {value!r}")
        if value is not None and value < 1:
            raise KumiflowError(f"{what} must be 1 or more (None: the declared value), not {value}")
    by, reason = check_operator(by, reason)
    with db.atomic():
        if max_active is None and rate_limit is None:
            FlowLimit.objects.filter(scope=scope).delete()
            override = None
        else:
            override, _ = FlowLimit.objects.update_or_create(
                scope=scope,
                defaults={
                    "max_active": max_active,
                    "rate_limit": rate_limit,
                    "changed_by": by,
                    "changed_at": clock.now(),
                },
            )
        woken = _wake_scope(scope)
        db.on_commit(forget_overrides)
    forget_overrides()
    logger.info(
        "flow limit of %s set to max_active=%s rate_limit=%s by %s (%s); %d woken",
        scope,
        max_active,
        rate_limit,
        by or "code",
        reason or "no reason given",
        woken,
    )
    return override


def _wake_scope(scope: str) -> int:
    """Every parked run and attempt of the scope is checked again (and parked
    again where the new limit still holds it), once every process has read the
    new limit (:data:`OVERRIDE_TTL` seconds): a worker that checked it earlier,
    with the old limit cached, would only park it again. The keys' counts of
    parked items are left as they are (an upper bound; too high only costs a
    look)."""
    when = clock.now() + timedelta(seconds=OVERRIDE_TTL + 1)
    runs = WorkflowRun.objects.filter(
        flow_scope=scope, status=RunStatus.QUEUED, held_by__in=[CONCURRENCY, RATE]
    ).update(wake_at=when)
    tasks = StepTask.objects.filter(
        flow_scope=scope, status=TaskStatus.PENDING, held_by__in=[CONCURRENCY, RATE]
    ).update(next_attempt_at=when)
    if runs:
        work_committed(WorkKind.RESUME, when)
    if tasks:
        work_committed(WorkKind.TASK, when)
    return runs + tasks


def purge_idle_keys(created_before: datetime, *, limit: int = 10_000) -> int:
    """Delete the rows of keys created before ``created_before`` that have
    nothing active, queued or parked (a per-run key leaves one row per run).

    Each key is checked and deleted under its own lock, in a transaction of
    its own: an admission that takes the key meanwhile either comes first
    (then the key is kept) or creates the row again after the delete."""
    candidates = list(
        FlowKey.objects.filter(created_at__lt=created_before, held=0)
        .order_by("created_at")
        .values_list("pk", "kind", "scope", "key")[:limit]
    )
    deleted = 0
    for pk, kind, scope, key in candidates:
        with db.atomic():
            row = for_update(FlowKey.objects.filter(pk=pk, held=0)).first()
            if row is None:
                continue
            busy: QuerySet[Any, Any] | None
            if kind == "run":
                busy = WorkflowRun.objects.filter(flow_scope=scope, flow_key=key).exclude(
                    status__in=FINISHED
                )
            elif kind == "task":
                busy = StepTask.objects.filter(
                    flow_scope=scope,
                    flow_key=key,
                    status__in=[TaskStatus.PENDING, TaskStatus.RUNNING],
                )
            else:  # a debounce's lock row: recreated when next needed
                busy = None
            if busy is not None and busy.exists():
                continue
            row.delete()
            deleted += 1
    if deleted:
        logger.info("deleted %d idle flow key(s) created before %s", deleted, created_before)
    return deleted
