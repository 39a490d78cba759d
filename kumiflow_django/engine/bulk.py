"""Bulk operations: one operation on every run that matches a filter.

:func:`bulk_runs` records a :class:`BulkOperation` (the action, the filter,
the operator and the reason, the pre-flight count) and works through the
matching runs in batches, in primary-key order (keyset pagination: each
batch is the next ``batch_size`` ids after the cursor, never an offset, so
100,000 runs are never loaded at once and the count of matching runs may
change while it runs). Each run is one short transaction: the run through
the same public function as one run (``cancel_run``, ...; so every run's
event carries the operator and the reason), and the operation's cursor and
counts, committed together. Not one transaction per batch: it would hold
the locks of all its runs (and, on SQLite, the one writer's lock) for the
whole batch; measured here, a 500-run batch held them for 20 to 50 s on a
loaded machine. An interrupted operation (a crash, a deploy) continues at
its cursor with :func:`continue_bulk` (the ``kumiflow_bulk`` command, or
the worker's bulk loop) and does no run twice, nor skips one.

A run the action refuses (its ``refuse_*`` function says why) is counted as
skipped, under that reason, not as an error; a run that loses a lock
conflict is tried again, and counted as an error only if it keeps losing.

An action is one entry of :data:`ACTIONS`: ``{name: (refuse, operation)}``.
Restart takes a step path (``from_step``, each run's own step at that path)
and a definition, kept on the operation and passed to ``refuse_restart`` and
``restart_run``. A restart leaves the old run as it was and starts a new one,
so it takes only the runs started before the operation was recorded: the
new runs it starts (which may match the filter, and whose ids are random)
are never restarted again by the same operation. "Before" is read in the
log, not by a clock: the operation keeps the log's last position when it is
recorded (``log_position``), and a run started after it looked for its
events after that position (its ``since_position``), whatever the clocks of
the host that recorded the operation and of the one that continues it say.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.db import models
from django.db.models import Q, QuerySet
from django.utils.translation import gettext_lazy as _

from kumiflow_django.definition.durations import parse_instant
from kumiflow_django.engine import operations as ops
from kumiflow_django.engine import restart as restarts
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.store import clock, db, limits, sql
from kumiflow_django.store.audit import check_operator
from kumiflow_django.store.db import CONFLICT_ATTEMPTS, for_update
from kumiflow_django.store.errors import (
    InvalidEvent,
    InvalidRunState,
    KumiflowError,
    OperationConflict,
)
from kumiflow_django.store.models import EngineManager, Event
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.engine.bulk")

Refuse = Callable[..., str | None]
Operation = Callable[..., WorkflowRun]

#: Every bulk action: the ``refuse_*`` function that says whether it applies
#: to a run, and the public operation that does it (called with ``run_id``,
#: ``reason``, ``by`` and ``tenant``; restart with ``from_step`` and
#: ``definition`` too, passed to its refuse function as well).
ACTIONS: dict[str, tuple[Refuse, Operation]] = {
    "cancel": (ops.refuse_cancel, ops.cancel_run),
    "retry": (ops.refuse_retry, ops.retry_run),
    "resume": (ops.refuse_resume, ops.resume_run),
    "pause": (ops.refuse_pause, ops.pause_run),
    "fail": (ops.refuse_fail, ops.fail_run),
    "restart": (restarts.refuse_restart, restarts.restart_run),
}
#: The actions that take a step path (``from_step``) and a definition.
STEP_ACTIONS = frozenset({"restart"})

#: The columns the refuse functions read (a batch loads only these); a
#: restart's plan reads the whole row (its definition, key, trigger, parent).
_REFUSE_COLUMNS: tuple[str, ...] = (
    "id",
    "tenant_id",
    "workflow",
    "status",
    "paused",
    "compensation",
    "cursor",
)

#: The filters a bulk operation takes (the run list's, in the admin and the API).
FILTERS = (
    "workflow",
    "status",
    "tenant",
    "tenants",
    "reason",
    "paused",
    "started_after",
    "started_before",
    "parent",
    "roots_only",
    "ids",
)
DEFAULT_BATCH = 500
#: How many different skip reasons (and error texts) an operation keeps.
_MAX_REASONS = 20


class BulkStatus(models.TextChoices):
    RUNNING = "running", _("running")
    DONE = "done", _("done")


class BulkOperation(models.Model):
    """One bulk operation, its progress and its outcome (operational: not a
    projection; every run it changed has its own event in the log)."""

    id = models.UUIDField(_("id"), primary_key=True, default=uuid.uuid4, editable=False)
    action = models.CharField(_("action"), max_length=20)
    filters = models.JSONField(_("filters"), default=dict)
    reason = models.TextField(_("reason"), blank=True)
    by = models.CharField(_("by"), max_length=limits.OPERATOR, blank=True)
    status = models.CharField(
        _("status"), max_length=10, choices=BulkStatus.choices, default=BulkStatus.RUNNING
    )
    batch_size = models.PositiveIntegerField(_("batch size"), default=DEFAULT_BATCH)
    #: A restart's step path (each run's own step at it), and its definition.
    from_step = models.CharField(
        _("from step"), max_length=restarts.MAX_PATH_LENGTH, blank=True, default=""
    )
    definition = models.CharField(_("definition"), max_length=10, blank=True, default="")
    #: The last run id done (runs are taken in primary-key order after it).
    cursor = models.UUIDField(_("cursor"), null=True, blank=True)
    #: The log's last position when it was recorded: a restart takes the runs
    #: started before it (NULL: recorded before 0018, by ``created_at``).
    log_position = models.BigIntegerField(_("log position"), null=True, blank=True)
    #: The matching runs when it was recorded (the pre-flight count).
    total = models.PositiveIntegerField(_("matching runs"), default=0)
    done = models.PositiveIntegerField(_("runs done"), default=0)
    skipped = models.PositiveIntegerField(_("runs skipped"), default=0)
    errors = models.PositiveIntegerField(_("errors"), default=0)
    #: Why runs were skipped (the refusal) or failed: text -> count.
    skipped_reasons = models.JSONField(_("why skipped"), default=dict)
    error_texts = models.JSONField(_("errors seen"), default=dict)
    #: A process working on it, until when (another continues it after).
    lease_until = models.DateTimeField(_("lease until"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"))
    updated_at = models.DateTimeField(_("updated at"))
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    objects: ClassVar[models.Manager[BulkOperation]] = EngineManager()

    class Meta:
        verbose_name = _("bulk operation")
        verbose_name_plural = _("bulk operations")
        indexes = [models.Index(fields=["status", "created_at"], name="kumiflow_bulk_status_idx")]

    def __str__(self) -> str:
        return f"{self.action} {self.id} ({self.status}: {self.done}/{self.total})"


# -- the filter -------------------------------------------------------------------


def check_filters(filters: Mapping[str, Any]) -> dict[str, Any]:
    """``filters`` as stored (JSON); InvalidEvent for an unknown filter or value."""
    if not isinstance(filters, Mapping):
        raise InvalidEvent("filters must be a mapping")
    unknown = sorted(set(filters) - set(FILTERS))
    if unknown:
        raise InvalidEvent(f"unknown run filters {unknown}; known: {list(FILTERS)}")
    clean: dict[str, Any] = {}
    for name, value in filters.items():
        if value is None or value == "":
            continue
        if name == "status":
            values = [value] if isinstance(value, str) else list(value)
            bad = [v for v in values if v not in RunStatus.values]
            if bad:
                raise InvalidEvent(f"unknown run status {bad}")
            clean[name] = values
        elif name in ("tenants", "ids"):
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise InvalidEvent(f"{name} must be a list of strings")
            clean[name] = [str(uuid.UUID(v)) for v in value] if name == "ids" else list(value)
        elif name in ("paused", "roots_only"):
            if not isinstance(value, bool):
                raise InvalidEvent(f"{name} must be true or false")
            clean[name] = value
        elif name in ("started_after", "started_before"):
            try:
                parse_instant(str(value))
            except ValueError as exc:
                raise InvalidEvent(f"{name}: {exc}") from None
            clean[name] = str(value)
        elif name == "parent":
            clean[name] = str(uuid.UUID(str(value)))
        else:
            if not isinstance(value, str):
                raise InvalidEvent(f"{name} must be a string")
            clean[name] = value
    return clean


def matching(filters: Mapping[str, Any]) -> QuerySet[WorkflowRun, WorkflowRun]:
    """The runs ``filters`` (checked) match."""
    q = Q()
    lookups = {
        "workflow": "workflow",
        "reason": "reason",
        "paused": "paused",
        "parent": "parent_id",
    }
    for name, field in lookups.items():
        if name in filters:
            q &= Q(**{field: filters[name]})
    if "status" in filters:
        q &= Q(status__in=filters["status"])
    # A tenant's runs byte for byte (MariaDB's collation takes "ACME" for "acme").
    if "tenant" in filters:
        q &= sql.exact_in("tenant_id", [filters["tenant"]])
    if "tenants" in filters:
        q &= sql.exact_in("tenant_id", filters["tenants"])
    if "ids" in filters:
        q &= Q(pk__in=filters["ids"])
    if "started_after" in filters:
        q &= Q(started_at__gte=parse_instant(filters["started_after"]))
    if "started_before" in filters:
        q &= Q(started_at__lt=parse_instant(filters["started_before"]))
    if filters.get("roots_only"):
        q &= Q(parent_id__isnull=True)
    return WorkflowRun.objects.filter(q)


def preflight(
    action: str,
    filters: Mapping[str, Any],
    *,
    from_step: str | None = None,
    definition: str = "run",
) -> int:
    """How many runs match (the pre-flight count; the action may skip some)."""
    _action(action)
    check_options(action, from_step, definition)
    return matching(check_filters(filters)).count()


def check_options(action: str, from_step: str | None, definition: str) -> dict[str, str]:
    """The step action's options as its functions take them (``{}`` for the
    others); InvalidEvent for a missing or malformed step path, or a step path
    given to an action that takes none."""
    if action not in STEP_ACTIONS:
        if from_step not in (None, ""):
            raise InvalidEvent(f"the bulk action {action!r} takes no from_step")
        return {}
    if not isinstance(from_step, str) or not from_step:
        raise InvalidEvent(f"the bulk action {action!r} needs from_step (a step path: '2')")
    if len(from_step) > restarts.MAX_PATH_LENGTH:
        raise InvalidEvent(f"from_step is at most {restarts.MAX_PATH_LENGTH} characters")
    try:
        restarts.parse_path(from_step)
    except ValueError as exc:
        raise InvalidEvent(f"from_step: {exc}") from None
    if definition not in restarts.DEFINITIONS:
        raise InvalidEvent(f"definition must be 'run' or 'current', not {definition!r}")
    return {"from_step": from_step, "definition": definition}


def _options(operation: BulkOperation) -> dict[str, str]:
    if operation.action not in STEP_ACTIONS:
        return {}
    return {"from_step": operation.from_step, "definition": operation.definition or "run"}


def _action(action: str) -> tuple[Refuse, Operation]:
    try:
        return ACTIONS[action]
    except KeyError:
        raise InvalidEvent(f"unknown bulk action {action!r}; known: {sorted(ACTIONS)}") from None


# -- running it ---------------------------------------------------------------------


def bulk_runs(
    action: str,
    *,
    filters: Mapping[str, Any],
    reason: str = "",
    by: str = "",
    batch_size: int = DEFAULT_BATCH,
    run: bool = True,
    from_step: str | None = None,
    definition: str = "run",
) -> BulkOperation:
    """Do ``action`` (a key of :data:`ACTIONS`: cancel, retry, resume, pause,
    fail, restart) on every run that matches ``filters`` (:data:`FILTERS`),
    in batches. ``restart`` needs ``from_step`` (a step path, as
    :func:`~kumiflow_django.restart_run` takes it) and may take
    ``definition="current"``; a run it does not apply to is skipped with the
    refusal of ``refuse_restart``.

    Returns the operation with its counts (done, skipped with reasons,
    errors). ``run=False`` only records it, for :func:`continue_bulk` to do
    (the worker, the ``kumiflow_bulk`` command).
    """
    _action(action)
    options = check_options(action, from_step, definition)
    by, reason = check_operator(by, reason)
    clean = check_filters(filters)
    if not isinstance(batch_size, int) or not 1 <= batch_size <= 10_000:
        raise InvalidEvent("batch_size must be an integer from 1 to 10000")
    now = clock.now()
    operation = BulkOperation.objects.create(
        action=action,
        filters=clean,
        reason=reason,
        by=by,
        batch_size=batch_size,
        **options,
        log_position=Event.objects.last_position(),
        total=matching(clean).count(),
        created_at=now,
        updated_at=now,
    )
    logger.info(
        "bulk %s %s of %d runs by %s (%s)",
        operation.id,
        action,
        operation.total,
        by or "code",
        reason or "no reason given",
    )
    return continue_bulk(operation.id) if run else operation


def continue_bulk(
    operation_id: uuid.UUID | str, *, budget: float | None = None, lease_seconds: float = 60.0
) -> BulkOperation:
    """Work through a recorded operation from its cursor, batch after batch,
    until it is done (or ``budget`` seconds passed: it stays running, and the
    next call continues it). Two callers at once take turns per batch (the
    operation's row is locked with its batch) and never do a run twice."""
    deadline = None if budget is None else time.monotonic() + budget
    pk = uuid.UUID(str(operation_id))
    while True:
        operation, more = _batch(pk, lease_seconds)
        if not more:
            return operation
        if deadline is not None and time.monotonic() >= deadline:
            # Left for the next call (this process's or another's): no lease to wait out.
            BulkOperation.objects.filter(pk=pk).update(lease_until=None)
            operation.lease_until = None
            return operation


def unfinished() -> QuerySet[BulkOperation, BulkOperation]:
    """Operations not done whose lease (if any) ran out: to continue."""
    now = clock.now()
    return BulkOperation.objects.filter(status=BulkStatus.RUNNING).filter(
        Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    )


def _batch(operation_id: uuid.UUID, lease_seconds: float) -> tuple[BulkOperation, bool]:
    """One batch: the next ``batch_size`` matching runs after the cursor (one
    indexed read of a few columns), then each run in a transaction of its own
    with the operation's cursor and counts. Returns the operation and whether
    there is more to do."""
    with db.atomic():
        operation = for_update(BulkOperation.objects.filter(pk=operation_id)).get()
        if operation.status == BulkStatus.DONE:
            return operation, False
        runs = matching(operation.filters)
        if operation.action in STEP_ACTIONS:  # never the runs its restarts started
            runs = runs.filter(_started_before(operation))
        else:
            runs = runs.only(*_REFUSE_COLUMNS)
        if operation.cursor is not None:
            runs = runs.filter(pk__gt=operation.cursor)
        batch = list(runs.order_by("pk")[: operation.batch_size])
        now = clock.now()
        if not batch:
            _finish(operation, now)
            return operation, False
        operation.lease_until = now + timedelta(seconds=lease_seconds)
        operation.save(update_fields=["lease_until"])
    refuse, operate = ACTIONS[operation.action]
    options = _options(operation)
    for run in batch:
        operation = _run_one(operation_id, run, refuse, operate, options)
    if len(batch) < operation.batch_size and operation.status != BulkStatus.DONE:
        with db.atomic():  # nothing after it: done
            operation = for_update(BulkOperation.objects.filter(pk=operation_id)).get()
            if operation.cursor is not None and not _after(operation.cursor, batch[-1].pk):
                _finish(operation, clock.now())
                return operation, False
    return operation, operation.status != BulkStatus.DONE


def _started_before(operation: BulkOperation) -> Q:
    """The runs started before ``operation`` was recorded, by the log: a run
    looks for its events after the last position its start saw (``since``),
    which is below the operation's position if the run-started event was in
    the log then, and at or above it if the run started after. (A debounced
    run's ``since`` moves on with each debounce: one debounced after the
    operation was recorded counts as started then; it was not finished then,
    so no restart would have taken it.) An operation recorded before
    ``log_position`` existed compares the clocks, as it did."""
    if operation.log_position is None:
        return Q(started_at__lte=operation.created_at)
    return Q(since_position__lt=operation.log_position)


def _run_one(
    operation_id: uuid.UUID,
    run: WorkflowRun,
    refuse: Refuse,
    operate: Operation,
    options: Mapping[str, str],
) -> BulkOperation:
    """The action on one run and the operation's progress, committed together
    (so an interruption never does a run twice nor loses one). A lost lock
    conflict is tried again (the operation row is this loop's alone: it is
    never locked by the engine, so the conflict was over the run)."""
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        try:
            with db.atomic():
                operation = for_update(BulkOperation.objects.filter(pk=operation_id)).get()
                if not _after(operation.cursor, run.pk):
                    return operation  # another process did it meanwhile
                _one(
                    operation,
                    run,
                    refuse,
                    operate,
                    options,
                    last_try=attempt == CONFLICT_ATTEMPTS,
                )
                _progress(operation, run.pk, clock.now())
                return operation
        except OperationConflict:
            logger.info("bulk %s: run %s lost a lock conflict; again", operation_id, run.pk)
    raise AssertionError("unreachable")  # pragma: no cover - the last try counts it


def _after(cursor: uuid.UUID | None, pk: uuid.UUID) -> bool:
    """Whether run ``pk`` comes after ``cursor`` in the database's order of
    run ids, the order the batches are read in. Asked of the database, never
    of Python: MariaDB's native UUID type sorts with the timestamp fields
    swapped, so ``uuid.UUID`` comparison disagrees with its ``ORDER BY``."""
    if cursor is None:
        return True
    return WorkflowRun.objects.filter(pk=pk, pk__gt=cursor).exists()


def _progress(operation: BulkOperation, cursor: uuid.UUID, now: datetime) -> None:
    operation.cursor = cursor
    operation.updated_at = now
    operation.save()


def _finish(operation: BulkOperation, now: datetime) -> None:
    operation.status = BulkStatus.DONE
    operation.finished_at = now
    operation.lease_until = None
    operation.updated_at = now
    operation.save()
    logger.info(
        "bulk %s %s done: %d done, %d skipped, %d errors",
        operation.id,
        operation.action,
        operation.done,
        operation.skipped,
        operation.errors,
    )


def _one(
    operation: BulkOperation,
    run: WorkflowRun,
    refuse: Refuse,
    operate: Operation,
    options: Mapping[str, str],
    *,
    last_try: bool,
) -> None:
    """Do the action on one run (in a savepoint): done, skipped or an error. A
    lost lock conflict undoes the run's transaction (tried again), but on the
    last try, where it is counted as an error."""
    refusal = refuse(run, **options)
    if refusal is None:
        try:
            with db.atomic():
                operate(
                    run.pk,
                    reason=operation.reason,
                    by=operation.by,
                    tenant=run.tenant_id,
                    **options,
                )
        except InvalidRunState as exc:  # it moved on since the batch was read
            refusal = str(exc).split(": ", 1)[-1]
        except OperationConflict:
            if not last_try:
                raise
            operation.errors += 1
            _count(operation.error_texts, "lost to concurrent transactions; try again")
            return
        except KumiflowError as exc:
            _count(operation.error_texts, f"{type(exc).__name__}: {exc}"[:300])
            operation.errors += 1
            logger.warning("bulk %s: run %s: %s", operation.id, run.pk, exc)
            return
        else:
            operation.done += 1
            return
    operation.skipped += 1
    _count(operation.skipped_reasons, str(refusal))


def _count(counts: dict[str, int], text: str) -> None:
    if text in counts or len(counts) < _MAX_REASONS:
        counts[text] = counts.get(text, 0) + 1
    else:
        counts["(other reasons)"] = counts.get("(other reasons)", 0) + 1
