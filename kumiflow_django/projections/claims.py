"""Claiming due work: one way for runs, task attempts, deliveries and cron.

Every loop finds its due work with an indexed query, then claims it: in one
short transaction of its own, it locks the rows no other claim holds right
now and, under those locks, checks each again (still due, still free) and
starts it: a run's lease, a task attempt's or a delivery attempt's start
event, a cron occurrence's runs. Two rules hold for every kind:

- **disjoint claims**: a row another worker is claiming at this moment is
  skipped (``SKIP LOCKED`` where the database has it; SQLite lets one writer
  in at a time), so workers take different work instead of queueing for the
  same rows (:func:`unclaimed`);
- **a lost race is no claim**: a concurrent writer that got there first (the
  log's version guard refused our start event, a row moved on under its
  version) makes the whole claim a no-op: nothing of it is kept, and the work
  is found again by a later poll if it is still due (:func:`claim`).

Where the database can (``db.claims_in_one_statement``), a run's lease is
one statement, which locks, checks and leases at once: a transaction of its
own, with the same two rules (``claim(..., one_statement=True)``).

When a claimed item's lease is free is the one rule of
:mod:`kumiflow_django.store.leases`.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import IntegrityError
from django.db.models import Model, QuerySet

from kumiflow_django.projections.stream import StaleRow
from kumiflow_django.store import db
from kumiflow_django.store.db import for_update


def unclaimed[M: Model](rows: QuerySet[M, M]) -> QuerySet[M, M]:
    """``rows`` locked for a claim, leaving out those another claim holds."""
    return for_update(rows, skip_locked=True)


def claim[T](take: Callable[[], T], *, lost: T, one_statement: bool = False) -> T:
    """Run ``take`` (which locks with :func:`unclaimed`, checks and starts the
    work) in one transaction of its own; ``lost`` when a concurrent writer got
    there first. ``one_statement``: ``take`` sends one statement, which
    outside a transaction is a transaction of its own (no ``BEGIN``, no
    ``COMMIT``: where ``db.claims_in_one_statement``). Such a statement has
    no transaction to bound its waits in (``db.bound_waits``), and a
    session's ``SET`` would outlive it on a pooled server connection: like the
    due probe before it, it waits for a table lock (a migration) as long as
    the lock is held; what it leases is guarded by the stream's version."""
    try:
        if one_statement and db.connection().get_autocommit():
            return take()
        with db.atomic():
            return take()
    except (IntegrityError, StaleRow):
        return lost
