"""Telling the loops that work was committed, so they need not wait for a poll.

A transaction that leaves a due (or soon due) run, dispatch or schedule
calls :func:`work_committed`. After it commits, loops in this process are
woken directly, and on PostgreSQL a ``NOTIFY`` wakes loops in other
processes; hooks registered with :func:`on_committed` (the Django Tasks
wake-up, :mod:`kumiflow_django.tasks`) see every piece of work. The loops'
own polls stay the source of truth: a lost notification only costs latency.

:func:`notify` is the one way the package sends a PostgreSQL notification
(the loops' wake-ups here, the live streams' changed runs): after the
commit, once per payload and transaction.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from enum import StrEnum
from functools import partial
from typing import NamedTuple

from django.db import connections, transaction

from kumiflow_django.conf import settings
from kumiflow_django.store import clock, db
from kumiflow_django.store.telemetry import get_logger, log_fields

logger = get_logger("kumiflow_django.wakeups")

CHANNEL = "kumiflow_work"


class WorkKind(StrEnum):
    """Which loop a piece of committed work is for."""

    RESUME = "resume"
    DISPATCH = "dispatch"
    CRON = "cron"
    TASK = "task"


class Work(NamedTuple):
    """Work that a transaction committed: its kind, when it is due (None: now),
    the run it belongs to, and the item (a task's id), if any."""

    kind: WorkKind
    when: datetime | None = None
    run_id: uuid.UUID | None = None
    item: uuid.UUID | None = None


Listener = Callable[[str], None]
Hook = Callable[[Work], None]
_listeners: list[Listener] = []
_hooks: list[Hook] = []
_lock = threading.Lock()


def subscribe(listener: Listener) -> None:
    """Call ``listener(kind)`` whenever work of some kind is committed (a loop's wake-up)."""
    with _lock:
        _listeners.append(listener)


def unsubscribe(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def on_committed(hook: Hook) -> None:
    """Call ``hook(work)`` after the commit of every piece of work (once per hook)."""
    with _lock:
        if hook not in _hooks:
            _hooks.append(hook)


def work_committed(
    kind: WorkKind,
    when: datetime | None = None,
    run_id: uuid.UUID | None = None,
    item: uuid.UUID | None = None,
) -> None:
    """Announce, after the current transaction commits, work of ``kind`` due at ``when``."""
    db.on_commit(partial(_committed, Work(kind, when, run_id, item)))


def _committed(work: Work) -> None:
    with _lock:
        hooks = list(_hooks)
    for hook in hooks:
        try:
            hook(work)
        except Exception:  # one hook never stops the wake-up of the loops
            fields = log_fields(run_id=work.run_id)
            logger.warning("a wake-up hook failed for %s", work, exc_info=True, extra=fields)
    soon = clock.now() + timedelta(seconds=settings.MAX_INTERVAL)
    if work.when is None or work.when <= soon:  # far away: the loops find it by polling
        announce(work.kind)


def announce_local(kind: str) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(kind)


def announce(kind: str) -> None:
    """Wake the loops of ``kind`` here, and (PostgreSQL) in every other process."""
    announce_local(kind)
    notify(CHANNEL, kind)


class _Batch:
    """What one transaction notifies, sent in one statement by the first of its
    on-commit callbacks that runs. Every call registers a callback of its own
    (the public ``transaction.on_commit``), so a callback dropped with a rolled
    back savepoint cannot take the others' notifications with it (its own may
    still be sent: a notification is a wake-up, and a spurious one costs a
    read); what a rolled back transaction notified is never sent."""

    def __init__(self, transaction_: object) -> None:
        #: The outermost ``atomic`` block of the transaction it belongs to.
        self.transaction = transaction_
        self.pending: dict[tuple[str, str], None] = {}
        #: Set by the first callback that runs: its transaction committed.
        self.committed = False

    def send(self, using: str) -> None:
        if self.committed:
            return
        self.committed = True
        channels, payloads = zip(*self.pending, strict=True) if self.pending else ((), ())
        try:
            with connections[using].cursor() as cursor:
                cursor.execute(
                    "SELECT pg_notify(c, p) FROM unnest(%s::text[], %s::text[]) AS t(c, p)",
                    [list(channels), list(payloads)],
                )
        except Exception:  # a notification is an optimisation, never a failure
            logger.debug("NOTIFY failed", exc_info=True)


_batches = threading.local()


def notify(channel: str, payload: str, using: str | None = None) -> None:
    """``NOTIFY channel, payload`` once the current transaction of ``using``
    commits (at once outside a transaction), once per transaction however
    often it is asked; nothing where the database has no ``LISTEN``.

    After the commit, not inside the transaction: PostgreSQL serialises the
    commits of all transactions that notified, so a NOTIFY inside a segment
    would make every segment wait for the others."""
    using = using or db.alias()
    if not db.supports_listen(using):
        return
    batches: dict[str, _Batch] = _batches.__dict__.setdefault("by_alias", {})
    batch = batches.get(using)
    # A transaction is told apart by its outermost atomic block: a batch left
    # by one that rolled back (no callback of it ran) is not sent with the next.
    blocks = connections[using].atomic_blocks
    outermost = blocks[0] if blocks else None
    if batch is None or batch.committed or batch.transaction is not outermost:
        batch = batches[using] = _Batch(outermost)
    batch.pending[(channel, payload)] = None
    transaction.on_commit(partial(batch.send, using), using=using, robust=True)
