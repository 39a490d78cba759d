"""What "active", "woken" and "parked" mean for each kind of item flow
control admits: runs and task attempts. The rules (when an item is admitted,
parked, woken, released) are :mod:`kumiflow_django.flow.admission`'s; this
module is each kind's rows, nothing else.

A run is active from its admission until it finishes (running, waiting,
sleeping, retrying: "started and not finished"); a queued run is parked
(``held_by="concurrency"`` and no wake time) until a slot frees. A task
attempt is active while it runs; a parked attempt has no next attempt time.
Waking sets the wake time to now, in order of priority, then of arrival
(the start, then the log's position at the start: starts in one instant).
A parked run another transaction holds is waited for when it is next in
line: an operator's check, a worker's read or a cancellation may hold it,
and none of them takes the key afterwards (a parked run's end frees no slot,
:func:`kumiflow_django.flow.admission.holds_slot`). A parked attempt is
only ever held by what ends it (a cancellation, which then takes its key):
it is skipped.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol, TypeVar

from django.db.models import QuerySet

from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.projections.tasks import StepTask, TaskStatus
from kumiflow_django.store import clock
from kumiflow_django.store.db import for_update
from kumiflow_django.store.wakeups import WorkKind, work_committed

#: What holds an item (its ``held_by``): a full key, a used-up rate, a debounce.
CONCURRENCY = "concurrency"
RATE = "rate"
DEBOUNCE = "debounce"

#: A run in one of these states holds a slot of its key.
ACTIVE = (
    RunStatus.PENDING,
    RunStatus.RUNNING,
    RunStatus.WAITING,
    RunStatus.WAITING_EVENT,
    RunStatus.RETRY_SCHEDULED,
)

Row_contra = TypeVar("Row_contra", WorkflowRun, StepTask, contravariant=True)


class Gate(Protocol[Row_contra]):
    """How flow control counts, wakes and parks the items of one kind.

    ``wake`` returns how many it woke, and whether it found every parked item
    (fewer than it looked for, read without a lock): only then may the key's
    count of parked items go back to zero."""

    kind: str

    def active_rows(self) -> QuerySet[Any, Any]: ...

    def parked_rows(self) -> QuerySet[Any, Any]: ...

    def active(self, scope: str, key: str) -> int: ...

    def woken(self, scope: str, key: str) -> int:
        """Items woken and not admitted yet: a slot is theirs."""
        ...

    def wake(self, scope: str, key: str, n: int) -> tuple[int, bool]: ...

    def park(self, row: Row_contra, why: str, until: datetime | None) -> None: ...

    def admitted(self, row: Row_contra) -> None: ...


class Runs:
    kind = "run"

    def active_rows(self) -> QuerySet[WorkflowRun, WorkflowRun]:
        return WorkflowRun.objects.filter(status__in=ACTIVE)

    def parked_rows(self) -> QuerySet[WorkflowRun, WorkflowRun]:
        return WorkflowRun.objects.filter(
            status=RunStatus.QUEUED, held_by=CONCURRENCY, wake_at__isnull=True
        )

    def active(self, scope: str, key: str) -> int:
        """Active rows (runs admitted in this transaction whose row is not
        written yet are the admission's to add)."""
        return self.active_rows().filter(flow_scope=scope, flow_key=key).count()

    def woken(self, scope: str, key: str) -> int:
        return WorkflowRun.objects.filter(
            flow_scope=scope,
            flow_key=key,
            status=RunStatus.QUEUED,
            held_by=CONCURRENCY,
            wake_at__isnull=False,
        ).count()

    def wake(self, scope: str, key: str, n: int) -> tuple[int, bool]:
        parked = self.parked_rows().filter(flow_scope=scope, flow_key=key)
        ids, everyone = _lock_first(
            parked, ("-priority", "started_at", "since_position"), n, wait=True
        )
        if ids:
            now = clock.now()
            WorkflowRun.objects.filter(pk__in=ids).update(wake_at=now)
            work_committed(WorkKind.RESUME, now)
        return len(ids), everyone

    def park(self, row: WorkflowRun, why: str, until: datetime | None) -> None:
        """A due queued run that may not run yet waits again (not an event: the
        log says it is queued; when it is checked again is the worker's business)."""
        WorkflowRun.objects.filter(pk=row.id).update(
            wake_at=until, held_by=why, lease_owner="", lease_until=None
        )

    def admitted(self, row: WorkflowRun) -> None:
        """Nothing to write: the run's ``run-admitted`` says so, in its segment."""


class Tasks:
    kind = "task"

    def active_rows(self) -> QuerySet[StepTask, StepTask]:
        return StepTask.objects.filter(status=TaskStatus.RUNNING)

    def parked_rows(self) -> QuerySet[StepTask, StepTask]:
        return StepTask.objects.filter(
            status=TaskStatus.PENDING, held_by=CONCURRENCY, next_attempt_at__isnull=True
        )

    def active(self, scope: str, key: str) -> int:
        return self.active_rows().filter(flow_scope=scope, flow_key=key).count()

    def woken(self, scope: str, key: str) -> int:
        return StepTask.objects.filter(
            flow_scope=scope,
            flow_key=key,
            status=TaskStatus.PENDING,
            held_by=CONCURRENCY,
            next_attempt_at__isnull=False,
        ).count()

    def wake(self, scope: str, key: str, n: int) -> tuple[int, bool]:
        parked = self.parked_rows().filter(flow_scope=scope, flow_key=key)
        ids, everyone = _lock_first(parked, ("-priority", "created_at"), n, wait=False)
        if ids:
            now = clock.now()
            # held_by stays: a woken attempt takes a free slot without queueing again.
            StepTask.objects.filter(pk__in=ids).update(next_attempt_at=now)
            rows = StepTask.objects.filter(pk__in=ids).values_list("id", "run_id", "backend")
            for task_id, run_id, backend in rows:
                work_committed(WorkKind.TASK, now, run_id, task_id if backend else None)
        return len(ids), everyone

    def park(self, row: StepTask, why: str, until: datetime | None) -> None:
        """Operational, not an event: no next attempt time until a slot frees
        (or the rate's next window); a backend's task is handed to it again
        once it is due."""
        parked = StepTask.objects.filter(pk=row.id)
        if row.backend:
            parked.update(next_attempt_at=until, held_by=why, enqueued_attempt=row.attempt)
        else:
            parked.update(next_attempt_at=until, held_by=why)

    def admitted(self, row: StepTask) -> None:
        """An attempt that was held is not any more (operational, like the parking)."""
        if row.held_by:
            StepTask.objects.filter(pk=row.id).update(held_by="")
            row.held_by = ""


def _lock_first(
    parked: QuerySet[Any, Any], order: tuple[str, ...], n: int, *, wait: bool
) -> tuple[list[Any], bool]:
    """The first ``n`` parked rows in ``order``, locked, and whether they were all
    the parked rows there are.

    Found without a lock, then locked by primary key: a locking read through a
    secondary index locks every entry it passes on MariaDB, and waits for them
    even with SKIP LOCKED (two wakers deadlocked over the due index). Rows
    another transaction holds are skipped in one statement; with ``wait``, one
    that is next in line is then waited for, alone by its primary key: a
    skipped row nobody wakes later stays parked for good (the key's last
    release skipped its last parked run while a worker's read held it)."""
    ids = list(parked.order_by(*order).values_list("pk", flat=True)[: n + WAKE_SLACK])
    if not ids:
        return [], True
    manager = parked.model._default_manager
    free = set(
        for_update(manager.filter(pk__in=ids), skip_locked=True).values_list("pk", flat=True)
    )
    # Locked now: still parked? (read again without a lock: it cannot change under us)
    still = set(parked.filter(pk__in=free).values_list("pk", flat=True))
    chosen: list[Any] = []
    for pk in ids:
        if len(chosen) == n:
            break
        if pk in free:
            parked_still = pk in still
        elif wait:  # waits for its holder; it may have ended it, or not
            locked = for_update(manager.filter(pk=pk)).values_list("pk", flat=True)
            parked_still = bool(locked) and parked.filter(pk=pk).exists()
        else:
            parked_still = False
        if parked_still:
            chosen.append(pk)
    # Every parked row was read, and none was skipped: nothing stays parked.
    return chosen, len(ids) < n + WAKE_SLACK and len(chosen) == len(ids)


#: Extra rows read beyond those to wake, in case some are held by others.
WAKE_SLACK = 8

RUNS = Runs()
TASKS = Tasks()
