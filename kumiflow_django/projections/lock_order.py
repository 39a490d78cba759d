"""The lock order, written once (docs/architecture.md, "Lock order").

A transaction that locks several rows takes them in this order, so two that
meet wait for each other in one direction only: runs, ancestors before
descendants (by depth in their tree, then by key); then the rows a run owns
(its task attempts, its dispatches), each after its run; flow keys and rate
buckets last. Runs are locked here and nowhere else; a task or a dispatch
whose outcome may wake (and end) its run is locked here too, after its run.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from django.db import models
from django.db.models import Field, Subquery

from kumiflow_django.projections.dispatches import Dispatch
from kumiflow_django.projections.runs import WorkflowRun
from kumiflow_django.projections.tasks import StepTask
from kumiflow_django.store import sql
from kumiflow_django.store.db import for_update


def lock_runs(
    ids: Collection[uuid.UUID], *, tenant: str | None = None, skip_locked: bool = False
) -> list[WorkflowRun]:
    """Lock the runs ``ids`` (of ``tenant``), and before them the parents that
    wait for them, in the lock order: by depth in their trees, then by primary
    key, one statement per depth (rows of a ``pk IN`` are locked in key order on
    every database). A run that ends in this transaction tells its parent
    (``engine.children.settle_parent``), and a cancel of that parent locks it
    before its children: the parent must come first here too.

    ``skip_locked``: leave out those of ``ids`` another transaction holds (the
    parents are waited for; nothing is held while waiting for them). Returns the
    locked runs of ``ids`` (not the parents), by depth and key.
    """
    qs = WorkflowRun.objects.filter(pk__in=list(ids))
    if tenant is not None:
        qs = qs.filter(tenant_id=tenant)
    # parent_id, parent_waits and depth are written once, by run-started: read
    # without a lock, they cannot change before the lock is taken.
    placed = {
        pk: Placed(depth, parent, waits)
        for pk, depth, parent, waits in qs.values_list("pk", "depth", "parent_id", "parent_waits")
    }
    return lock_placed(placed, skip_locked=skip_locked)


class Placed(NamedTuple):
    """Where a run is in the lock order: written once, by its ``run-started``."""

    depth: int
    parent_id: uuid.UUID | None
    parent_waits: bool


def lock_placed(
    placed: Mapping[uuid.UUID, Placed], *, skip_locked: bool = False
) -> list[WorkflowRun]:
    """Lock the runs of ``placed``, read already where they are in the lock
    order (a look-up that found them read it too: the wake-up by an event),
    as :func:`lock_runs` does."""
    levels: dict[int, set[uuid.UUID]] = {}
    wanted = set(placed)
    for pk, (depth, parent, waits) in placed.items():
        levels.setdefault(depth, set()).add(pk)
        if waits and parent is not None:
            levels.setdefault(depth - 1, set()).add(parent)
    locked: list[WorkflowRun] = []
    for depth in sorted(levels):
        group = levels[depth]
        skip = skip_locked and group <= wanted
        # Built once per shape (``store.sql``): the ORM's compiler costs more
        # than the database on the wake-up by an event, one lock per append.
        if group.isdisjoint(wanted):
            # Parents only: locked, not read (a parent of a thousand children
            # would be read once per child, its whole state with it).
            sql.lock_by_pk(WorkflowRun, group, skip_locked=skip)
            continue
        rows = sql.by_pk(WorkflowRun, group, lock=True, skip_locked=skip)
        locked += [run for run in rows if run.pk in wanted]
    return locked


def lock_run(
    run_id: uuid.UUID,
    *,
    tenant: str | None = None,
    skip_locked: bool = False,
    placed: Placed | None = None,
) -> WorkflowRun | None:
    """One run, locked in the lock order (see :func:`lock_runs`); None if it does
    not exist (in ``tenant``) or, with ``skip_locked``, another transaction holds it.

    ``placed``: where the run is in the lock order, as the caller read it with
    the run already (the lease of a due run): not read again. Written once, by
    ``run-started``, it is the same whenever it was read; not with ``tenant``."""
    if placed is None:
        locked = lock_runs([run_id], tenant=tenant, skip_locked=skip_locked)
    elif tenant is None:
        locked = lock_placed({run_id: placed}, skip_locked=skip_locked)
    else:
        raise TypeError("lock_run: placed= is read without a tenant's filter; not both")
    return locked[0] if locked else None


def lock_owned[M: (StepTask, Dispatch)](
    model: type[M], pk: uuid.UUID, *, skip_locked: bool = False, **also: object
) -> M | None:
    """A task or a dispatch (``also``: further conditions), locked after its run
    (and the run's waiting parent): its outcome may wake and end the run, and a
    cancel of the run locks the run, then the rows it owns. ``run_id`` is written
    once, by the row's first event: read without a lock, it cannot change.

    Its run's place in the lock order is read by the row's key in one statement
    built once (the run whose key the row names), the row itself by key: a task's
    outcome is recorded once per attempt, and the ORM's compiler cost more than
    the database on it. The run is locked whether or not ``also`` holds: one
    lock more, in the order, and the row is None."""
    using = sql.routed(model, lock=True)  # where the locks are taken, never a replica
    owner = sql.values(
        ("lock-owned", model, using),
        lambda: WorkflowRun.objects.filter(
            pk=Subquery(
                model._default_manager.filter(pk=sql.Slot("pk", _pk(model))).values("run_id")[:1]
            )
        ).values_list("pk", "depth", "parent_id", "parent_waits"),
        using=using,
        pk=pk,
    )
    for run_id, depth, parent, waits in owner:
        lock_placed({run_id: Placed(depth, parent, waits)})
    if also:
        return for_update(
            model._default_manager.filter(pk=pk, **also), skip_locked=skip_locked
        ).first()
    rows = sql.by_pk(model, [pk], lock=True, skip_locked=skip_locked)
    return rows[0] if rows else None


def _pk(model: type[models.Model]) -> Field[Any, Any]:
    pk = model._meta.pk
    assert pk is not None
    return pk
