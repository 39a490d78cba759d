"""What "active" and "parked" mean for runs and for task attempts.

A run is active from its admission until it finishes (running, waiting,
sleeping, retrying: "started and not finished"); a queued run is parked
(``held_by="concurrency"`` and no wake time) until a slot frees. A task
attempt is active while it runs; a parked attempt has no next attempt time.
Waking sets the wake time to now, in order of priority, then of arrival
(the start, then the log's position at the start: starts in one instant).
A parked run another transaction holds is waited for when it is next in
line: an operator's check, a worker's read or a cancellation may hold it,
and none of them takes the key afterwards (a parked run's end frees no slot,
:func:`kumiflow_django.engine.admission.holds_slot`). A parked attempt is
only ever held by what ends it (a cancellation, which then takes its key):
it is skipped.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, QuerySet

from kumiflow_django.definition.durations import parse_duration
from kumiflow_django.flow.admission import (
    CONCURRENCY,
    Concurrency,
    RateSpec,
    admit,
    lock_bucket,
    lock_key,
    pending_count,
    release,
    window_of,
)
from kumiflow_django.flow.models import FlowKey
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.projections.tasks import StepTask, TaskStatus
from kumiflow_django.store import clock, db
from kumiflow_django.store.db import for_update
from kumiflow_django.store.wakeups import WorkKind, work_committed

#: A run in one of these states holds a slot of its key.
ACTIVE = (
    RunStatus.PENDING,
    RunStatus.RUNNING,
    RunStatus.WAITING,
    RunStatus.WAITING_EVENT,
    RunStatus.RETRY_SCHEDULED,
)


class Runs:
    kind = "run"

    def active_rows(self) -> QuerySet[WorkflowRun, WorkflowRun]:
        return WorkflowRun.objects.filter(status__in=ACTIVE)

    def active(self, scope: str, key: str) -> int:
        """Active rows, and runs admitted in this transaction not written yet."""
        written = self.active_rows().filter(flow_scope=scope, flow_key=key).count()
        return written + pending_count(scope, key)

    def woken(self, scope: str, key: str) -> int:
        return WorkflowRun.objects.filter(
            flow_scope=scope,
            flow_key=key,
            status=RunStatus.QUEUED,
            held_by=CONCURRENCY,
            wake_at__isnull=False,
        ).count()

    def wake(self, scope: str, key: str, n: int) -> tuple[int, bool]:
        parked = WorkflowRun.objects.filter(
            flow_scope=scope,
            flow_key=key,
            status=RunStatus.QUEUED,
            held_by=CONCURRENCY,
            wake_at__isnull=True,
        )
        ids, everyone = _lock_first(
            parked, ("-priority", "started_at", "since_position"), n, wait=True
        )
        if ids:
            now = clock.now()
            WorkflowRun.objects.filter(pk__in=ids).update(wake_at=now)
            work_committed(WorkKind.RESUME, now)
        return len(ids), everyone


class Tasks:
    kind = "task"

    def active_rows(self) -> QuerySet[StepTask, StepTask]:
        return StepTask.objects.filter(status=TaskStatus.RUNNING)

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
        parked = StepTask.objects.filter(
            flow_scope=scope,
            flow_key=key,
            status=TaskStatus.PENDING,
            held_by=CONCURRENCY,
            next_attempt_at__isnull=True,
        )
        ids, everyone = _lock_first(parked, ("-priority", "created_at"), n, wait=False)
        if ids:
            now = clock.now()
            # held_by stays: a woken attempt takes a free slot without queueing again.
            StepTask.objects.filter(pk__in=ids).update(next_attempt_at=now)
            rows = StepTask.objects.filter(pk__in=ids).values_list("id", "run_id", "backend")
            for task_id, run_id, backend in rows:
                work_committed(WorkKind.TASK, now, run_id, task_id if backend else None)
        return len(ids), everyone


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


def unkeyed(gate: Runs | Tasks) -> list[tuple[str, str]]:
    """The invariant the count under a key's lock relies on, written once:
    every active limited item has its key's row (created by its admission,
    or by :func:`~kumiflow_django.flow.admission.lock_key` wherever an item
    becomes active otherwise, as ``retry_run`` does; deleted only when the
    key has nothing active or parked). A key without its row is taken for a
    new one, and admits without counting. Returns the (scope, key) of the
    active items that break it: none, unless something wrote around it."""
    keyed = FlowKey.objects.filter(
        kind=gate.kind, scope=OuterRef("flow_scope"), key=OuterRef("flow_key")
    )
    broken = gate.active_rows().exclude(flow_key="").filter(~Exists(keyed))
    return sorted(set(broken.values_list("flow_scope", "flow_key")))


def task_limits(task: StepTask) -> tuple[Concurrency | None, RateSpec | None]:
    """A task's concurrency limit and rate, as its ``task.requested`` recorded them."""
    flow = task.flow or {}
    concurrency = None
    if task.flow_key and "max" in flow:
        concurrency = Concurrency(task.flow_scope, task.flow_key, int(flow["max"]))
    rate = None
    if flow.get("rate"):
        r = flow["rate"]
        rate = RateSpec(r["scope"], r["key"], int(r["limit"]), parse_duration(r["per"]))
    return concurrency, rate


def admit_task(task: StepTask, now: datetime) -> bool:
    """Whether the task's next attempt may start now; if not, it is parked
    (no next attempt time until a slot frees, or the rate's next window)."""
    concurrency, rate = task_limits(task)
    if concurrency is None and rate is None:
        return True
    hold = admit(TASKS, concurrency, rate, new=task.held_by != CONCURRENCY, now=now).hold
    if hold is None:
        if task.held_by:  # operational, like the parking: not an event
            StepTask.objects.filter(pk=task.id).update(held_by="")
            task.held_by = ""
        return True
    parked: dict[str, object] = {"next_attempt_at": hold.until, "held_by": hold.why}
    if task.backend:  # handed to its backend again once it is due
        parked["enqueued_attempt"] = task.attempt
    StepTask.objects.filter(pk=task.id).update(**parked)
    return False


def release_task(task: StepTask) -> None:
    """A limited attempt stopped running (in this transaction): wake parked ones."""
    concurrency, _ = task_limits(task)
    if concurrency is not None:
        release(TASKS, concurrency)


def wake_stranded_tasks(limit: int) -> int:
    """The task half of the safety net under the wakes
    (:class:`~kumiflow_django.engine.admission.StrandedSweep`): parked attempts
    whose key has a free slot. A release wakes parked attempts with SKIP
    LOCKED, so one that another transaction held at that moment is passed
    over and nothing else looks at it again (seen on MariaDB under four
    workers: 16 attempts parked, none running). Reads at most ``limit``
    parked attempts (the due index: no next attempt time) and checks each
    of their keys once, under the key's lock, as a release does."""
    rows = StepTask.objects.filter(
        next_attempt_at__isnull=True, status=TaskStatus.PENDING, held_by=CONCURRENCY
    ).values_list("id", "flow_scope", "flow_key")[:limit]
    first_of_key: dict[tuple[str, str], Any] = {}
    for pk, scope, key in rows:
        if key:
            first_of_key.setdefault((scope, key), pk)
    woken = 0
    for pk in first_of_key.values():
        with db.atomic():
            task = StepTask.objects.filter(pk=pk).first()
            concurrency = task_limits(task)[0] if task is not None else None
            if concurrency is not None:
                woken += release(TASKS, concurrency, recheck=True)
    return woken


def lock_batch(tasks: list[StepTask], now: datetime) -> None:
    """Lock the keys, then the rate buckets, of a batch of attempts about to be
    admitted, each in sorted order: the order one admission takes them in."""
    keys = set()
    buckets = set()
    for task in tasks:
        concurrency, rate = task_limits(task)
        if concurrency is not None:
            keys.add((concurrency.scope, concurrency.key))
        if rate is not None:
            buckets.add((rate.scope, rate.key, window_of(now, rate.period)))
    for scope, key in sorted(keys):
        lock_key(TASKS.kind, scope, key)  # (a new row is locked as it is inserted)
    for scope, key, window in sorted(buckets):
        lock_bucket(scope, key, window)
