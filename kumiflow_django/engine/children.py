"""Child runs, and what a run leaves behind when it ends.

A ``child`` step starts a child run in its parent's segment: the child's
``run-started`` is written with the parent's events (same transaction), with
links to its parent and to the root of the tree. A child whose workflow
starts inline (the default) runs its first segment there too, like any
inline start; a deferred one runs on the resume loop once that commits.
A child that ends in its first segment hands its outcome to the parent's
segment at once. When a child the parent waits for ends, its
last segment appends ``child-settled`` to the parent's stream (the parent is
locked first): the parent's state holds the outcome and the parent is due.

Runs are locked in the lock order (``projections/lock_order.py``):
ancestors before descendants, so a run that may end and tell its parent has
that parent locked first, as a cancel of the parent locks the parent and
then its children.

When a run ends, or stops to compensate, :func:`after_end` cleans up after
it in the same transaction: its tasks that have not settled are cancelled;
a cancelled run cancels its deliveries not yet made and its children (those
whose policy is ``cancel``, and theirs, to the last level); a failed one
cancels the children it was waiting for.
"""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from kumiflow_django.definition import matching
from kumiflow_django.definition.context import Cancellation, ChildRequest, TriggerEvent
from kumiflow_django.definition.registry import registry
from kumiflow_django.definition.snapshots import remember
from kumiflow_django.engine.run_start import ParentLink, RunStart
from kumiflow_django.flow import admission
from kumiflow_django.flow.admission import Item
from kumiflow_django.outbox.actions import cancel_dispatch
from kumiflow_django.projections.dispatches import DELIVERABLE, Dispatch
from kumiflow_django.projections.lock_order import lock_runs
from kumiflow_django.projections.runs import FINISHED, RUNS, RunStatus, WorkflowRun
from kumiflow_django.projections.stream import Change, write
from kumiflow_django.projections.tasks import OPEN as OPEN_TASKS
from kumiflow_django.projections.tasks import StepTask
from kumiflow_django.projections.tasks import append as append_task
from kumiflow_django.projections.waits import sync as sync_waits
from kumiflow_django.projections.waits import waits_events
from kumiflow_django.store import clock, db
from kumiflow_django.store import names as ev
from kumiflow_django.store.db import for_update
from kumiflow_django.store.models import Event
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.wakeups import WorkKind, work_committed

logger = get_logger("kumiflow_django.engine.children")

#: How deep a tree of runs may grow (a child of a child of …): a workflow that
#: starts itself under a condition that always holds stops here, failed.
MAX_TREE_DEPTH = 32


class ChildStartRefused(Exception):  # noqa: N818 - the condition, as the engine names it
    """A child run cannot be started (unknown workflow, a tree too deep, a key taken)."""


#: Starts a run in the parent's transaction (the runner's ``start``).
Starter = Callable[[RunStart], WorkflowRun | None]

#: Parents whose children run their first segment right now (inline): such a
#: child that ends at once reports to the segment, not to the parent's stream.
_inline_parents: contextvars.ContextVar[frozenset[uuid.UUID]] = contextvars.ContextVar(
    "kumiflow_inline_parents", default=frozenset()
)


def started(
    requests: list[ChildRequest],
    parent: WorkflowRun,
    *,
    start: Starter,
) -> dict[str, dict[str, Any]]:
    """Start the child runs a segment's ``child`` steps ask for, each one
    :class:`~kumiflow_django.engine.run_start.RunStart` like any other run
    (flow control, priority, its trace origin and the depth check included),
    in the parent's transaction; returns the outcomes of the children that
    ended already (a key found one that had; an inline child that ran to its
    end in its first segment), for the parent's state."""
    settled: dict[str, dict[str, Any]] = {}
    since = Event.objects.last_position()
    depth = (parent.depth or 0) + 1
    due: datetime | None = None
    remembered: set[str] = set()
    # The start gaps below ``since``: looked up once, for the first child that
    # awaits events, and shared by the others.
    gaps: list[int] | None = None
    for request in requests:
        workflow = None
        if registry.is_registered(request.workflow):
            workflow = (
                registry.get(request.workflow)
                if request.version is None
                else registry.find(request.workflow, request.version)
            )
        if workflow is None:
            raise ChildStartRefused(
                f"child workflow {request.workflow!r} version {request.version!r} is not registered"
            )
        if depth > MAX_TREE_DEPTH:
            raise ChildStartRefused(
                f"runs started children {MAX_TREE_DEPTH} levels deep (a workflow that starts "
                "itself without end?)"
            )
        if request.idempotency_key is not None:
            existing = WorkflowRun.objects.filter(
                tenant_id=parent.tenant_id,
                workflow=workflow.name,
                idempotency_key=request.idempotency_key,
            ).first()
            if existing is not None:
                if request.wait:
                    if existing.status not in FINISHED:
                        raise ChildStartRefused(
                            f"a run of {workflow.name!r} with the idempotency key "
                            f"{request.idempotency_key!r} is running already ({existing.id}); "
                            "a child step waits only for a run it starts"
                        )
                    settled[str(request.id)] = outcome(existing)
                continue
        if workflow.awaited and gaps is None:
            gaps = [] if db.one_writer_at_a_time() else matching.gaps_below(since)
        link = ParentLink(
            id=parent.id,
            root=parent.root_id or parent.id,
            step=request.step,
            wait=request.wait,
            cancel_with_parent=request.cancel_with_parent,
            depth=depth,
        )
        child_start = RunStart(
            workflow,
            TriggerEvent(type="child", payload=request.payload, tenant_id=parent.tenant_id),
            parent.tenant_id,
            since,
            key=request.idempotency_key,
            input=request.payload,
            parent=link,
            run_id=request.id,
            gaps=gaps,
        )
        if workflow.fingerprint not in remembered:  # the definition it starts on, once
            remember(workflow)
            remembered.add(workflow.fingerprint)
        token = _inline_parents.set(_inline_parents.get() | {parent.id})
        try:
            child = start(child_start)
        finally:
            _inline_parents.reset(token)
        if child is None:
            continue
        if child.status in FINISHED:
            if request.wait:
                settled[str(request.id)] = outcome(child)
        elif child.wake_at is not None and (due is None or child.wake_at < due):
            due = child.wake_at
    if due is not None:  # after commit, the resume loop runs them (one wake-up for all)
        work_committed(WorkKind.RESUME, due)
    return settled


def outcome(run: WorkflowRun) -> dict[str, Any]:
    """How a child ended, as its parent's state keeps it."""
    settled: dict[str, Any] = {
        "status": run.status,
        "workflow": run.workflow,
        "run_id": str(run.id),
    }
    if run.status == RunStatus.COMPLETED:
        settled["result"] = run.result
    else:
        settled["error"] = run.last_error
        settled["reason"] = run.reason
    return settled


def ended(
    run: WorkflowRun,
    *,
    had_waits: bool,
    cancelled: bool,
    release: bool = True,
    notify_parent: bool = True,
) -> None:
    """What every end of a run does in its transaction once its row is
    written, whoever ended it (``Segment.write``, the cancel of a child run):
    its waits go, its concurrency key's slot frees and wakes
    what is parked behind it, and :func:`after_end` cleans up after it."""
    if had_waits:
        sync_waits(run.id, run.tenant_id, [], had=True)
    # after_end locks the run's open tasks (and its subtree) first, the flow
    # key last: the lock order (projections/lock_order.py) puts tasks before
    # flow keys, and a recorder of a task's result holds the task, then waits
    # for the run, never for a key.
    after_end(run, cancelled=cancelled, notify_parent=notify_parent)
    if release and run.flow_key:
        admission.release(Item.run(run))


def after_end(run: WorkflowRun, *, cancelled: bool, notify_parent: bool = True) -> None:
    """Clean up after a run that ended (or stops to compensate), in its transaction.

    A completed run leaves nothing open (its branches' were cancelled when
    their join was met): it only tells a waiting parent, without a query.
    """
    if run.status == RunStatus.COMPLETED:
        if notify_parent and run.parent_id and run.parent_waits:
            settle_parent(run)
        return
    lock_subtree(run, cancelled=cancelled)
    for task in for_update(StepTask.objects.filter(run_id=run.id, status__in=OPEN_TASKS)):
        cancelled_task = append_task(
            task, ev.TASK_CANCELLED, {"reason": f"run {run.id} is {run.status}"}
        )
        admission.release(Item.attempt(cancelled_task))  # a limited attempt's slot frees
    if cancelled:
        pending = Dispatch.objects.filter(run_id=run.id, status__in=DELIVERABLE)
        for dispatch_id in pending.values_list("id", flat=True):
            cancel_dispatch(dispatch_id, reason=f"run {run.id} was cancelled")
    for child_id in _ending_children(run, cancelled).order_by("pk").values_list("id", flat=True):
        cancel_child(child_id, reason=f"its parent run {run.id} is {run.status}")
    if notify_parent and run.status in FINISHED and run.parent_id and run.parent_waits:
        settle_parent(run)


def _ending_children(run: WorkflowRun, cancelled: bool) -> QuerySet[WorkflowRun, WorkflowRun]:
    """The children the end of ``run`` cancels: all but the abandoned ones when
    it was cancelled, else those it waited for."""
    children = WorkflowRun.objects.filter(parent_id=run.id, cancel_with_parent=True).exclude(
        status__in=FINISHED
    )
    return children if cancelled else children.filter(parent_waits=True)


def lock_subtree(run: WorkflowRun, *, cancelled: bool) -> None:
    """Lock the children the end of ``run`` cancels and theirs, to the last level,
    before any of them is cancelled: level by level, so no run is locked after
    one deeper in the tree (the cancel itself goes depth first)."""
    level = list(_ending_children(run, cancelled).values_list("id", flat=True))
    while level:
        lock_runs(level)
        level = list(
            WorkflowRun.objects.filter(parent_id__in=level, cancel_with_parent=True)
            .exclude(status__in=FINISHED)
            .values_list("id", flat=True)
        )


def cancel_child(child_id: uuid.UUID | str, *, reason: str) -> None:
    """Cancel a child run (and its children), without telling its parent: the
    parent is the one cancelling it."""
    child = for_update(WorkflowRun.objects.filter(pk=child_id)).first()  # its parent is held
    if child is None or child.status in FINISHED:
        return
    had_waits, held_slot = waits_events(child), admission.holds_slot(child)
    change = Change(RUNS, str(child.id), child.tenant_id, child, now=clock.now())
    child.lease_owner, child.lease_until = "", None
    change.add(ev.RUN_CANCELLED, {"reason": reason})
    write([change])
    ended(change.saved, had_waits=had_waits, cancelled=True, release=held_slot, notify_parent=False)
    logger.info("run %s cancelled: %s", child_id, reason)


def settle_parent(child: WorkflowRun) -> None:
    """Tell the parent that waits for ``child`` how it ended (its stream; the
    parent is due).

    The parent is locked already (``lock_runs`` takes it before the child);
    this lock is then only a read of it. A thousand children may end one after
    the other, each locking their parent: this loads only the parent row's few
    columns the fold of ``child-settled`` reads and changes, never its state,
    whatever its size, and writes them through the fold like any change.
    """
    if child.parent_id is None or child.parent_id in _inline_parents.get():
        return  # no parent, or one whose segment takes the outcome itself
    parent = (
        for_update(WorkflowRun.objects.filter(pk=child.parent_id)).only(*SETTLE_COLUMNS).first()
    )
    if parent is None or parent.status in FINISHED:
        return
    change = Change(RUNS, str(parent.id), parent.tenant_id, parent, now=clock.now())
    change.add(ev.CHILD_SETTLED, {"child_id": str(child.id), **outcome(child)})
    write([change])
    work_committed(WorkKind.RESUME, change.saved.wake_at, parent.id)


#: What the fold of ``child-settled`` reads and writes of the parent's row.
SETTLE_COLUMNS = ("id", "tenant_id", "version", "status", "wake_at", "updated_at")


def cancel(run: WorkflowRun, cancellations: list[Cancellation]) -> None:
    """Cancel what branches that were cancelled left behind (after the run's write)."""
    for item in cancellations:
        try:
            target = uuid.UUID(item.id)
        except ValueError:
            continue
        if item.what == "task":
            task = for_update(StepTask.objects.filter(pk=target, run_id=run.id)).first()
            if task is not None and task.status in OPEN_TASKS:
                cancelled_task = append_task(
                    task, ev.TASK_CANCELLED, {"reason": "its branch was cancelled"}
                )
                admission.release(Item.attempt(cancelled_task))
        elif item.what == "dispatch":
            dispatch = Dispatch.objects.filter(pk=target, run_id=run.id, status__in=DELIVERABLE)
            if dispatch.exists():
                cancel_dispatch(target, reason="its branch was cancelled")
        elif item.what == "child":
            child = WorkflowRun.objects.filter(pk=target, parent_id=run.id).first()
            if child is not None and child.cancel_with_parent:
                cancel_child(target, reason="its branch of the parent run was cancelled")
