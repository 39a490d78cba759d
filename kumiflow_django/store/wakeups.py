"""Telling the loops that work was committed, so they need not wait for a poll.

A transaction that leaves a due (or soon due) run, dispatch or schedule
calls :func:`work_committed`. After it commits, loops in this process are
told directly, and on PostgreSQL a ``NOTIFY`` tells loops in other
processes (in the one statement that sends all of the transaction's
notifications, :func:`notify`); hooks registered with :func:`on_committed` (the Django Tasks
wake-up, :mod:`kumiflow_django.tasks`) see every piece of work. Each loop is
told the kind and when it is due: work due now wakes it, a timer earlier
than the one it sleeps for shortens its sleep (``Loop.notify``). The
``NOTIFY`` payload is the kind, then ``@`` and the wake time in ISO 8601
when it is later than now (``resume@2026-12-02T05:30:00.250000+00:00``);
only timers due within ``KUMIFLOW_MAX_INTERVAL`` are notified to other
processes (a later one is read by their next poll, before it is due). The
loops' own polls stay the source of truth: a lost notification only costs
latency.

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


#: ``listener(kind, when)``: work of ``kind`` committed, due at ``when`` (None: now).
Listener = Callable[[str, datetime | None], None]
Hook = Callable[[Work], None]
_listeners: list[Listener] = []
_hooks: list[Hook] = []
_lock = threading.Lock()


def subscribe(listener: Listener) -> None:
    """Call ``listener(kind, when)`` whenever work of some kind is committed (a loop's wake-up)."""
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
    """Announce, after the current transaction commits, work of ``kind`` due at ``when``.

    Other processes' loops are told in the transaction's one ``NOTIFY``
    statement (:func:`notify`), with the runs it changed, not in a round
    trip of its own after the commit; this process's loops and the hooks
    are told by an on-commit callback. Work announced inside a savepoint
    that rolls back may still reach other processes (a spurious wake-up:
    a poll that finds nothing), never this process's loops or the hooks."""
    _add(db.alias(), lambda batch: batch.work.setdefault((kind, when)))
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
    announce_local(work.kind, _later(work.when, clock.now()))


def _later(when: datetime | None, now: datetime) -> datetime | None:
    """``when`` if it is later than ``now``, else None (due now). A time that
    does not compare with ours (a naive one) counts as now, as in :func:`parse`:
    a spurious poll, never a lost wake-up, nor the transaction's other ones."""
    try:
        return when if when is not None and when > now else None
    except TypeError:
        return None


def announce_local(kind: str, when: datetime | None = None) -> None:
    """Tell the loops of this process about work of ``kind`` due at ``when`` (None: now)."""
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(kind, when)


def payload(kind: str, when: datetime | None = None) -> str:
    """The ``NOTIFY`` payload of work of ``kind`` due at ``when`` (None: now)."""
    return kind if when is None else f"{kind}@{when.isoformat()}"


def parse(text: str) -> tuple[str, datetime | None]:
    """The kind and wake time of a ``NOTIFY`` payload; a wake time that does
    not parse counts as now (a spurious wake-up costs a poll, a lost one a delay)."""
    kind, _, at = text.partition("@")
    try:
        when = datetime.fromisoformat(at) if at else None
    except ValueError:
        when = None
    if when is not None and when.tzinfo is None:
        when = None
    return kind, when


class _Batch:
    """What one transaction notifies, sent in one statement by the first of its
    on-commit callbacks that runs. Every call registers a callback of its own
    (the public ``transaction.on_commit``), so a callback dropped with a rolled
    back savepoint cannot take the others' notifications with it (its own may
    still be sent: a notification is a wake-up, and a spurious one costs a
    read); what a rolled back transaction notified is not sent (but see
    :func:`_add` for a function decorated with ``atomic``)."""

    def __init__(self, transaction_: object) -> None:
        #: The outermost ``atomic`` block of the transaction it belongs to.
        self.transaction = transaction_
        self.pending: dict[tuple[str, str], None] = {}
        #: (kind, wake time) of the work the transaction committed: which of it
        #: other processes are told is decided after the commit (:meth:`send`).
        self.work: dict[tuple[str, datetime | None], None] = {}
        #: Set by the first callback that runs: its transaction committed.
        self.committed = False

    def send(self, using: str) -> None:
        if self.committed:
            return
        self.committed = True
        try:
            pending = dict(self.pending)
            now = clock.now()
            horizon = now + timedelta(seconds=settings.MAX_INTERVAL)
            for kind, when in self.work:
                later = _later(when, now)
                # Far away (after the commit): their next poll reads it, before it is due.
                if later is None or later <= horizon:
                    pending[(CHANNEL, payload(kind, later))] = None
            if not pending:  # only timers far away: nothing to send
                return
            channels, payloads = zip(*pending, strict=True)
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
    _add(using or db.alias(), lambda batch: batch.pending.setdefault((channel, payload)))


def _add(using: str, put: Callable[[_Batch], object]) -> None:
    """``put`` something in the batch of the current transaction of ``using``,
    and register one more on-commit callback that sends the batch (at once
    outside a transaction); nothing where the database has no ``LISTEN``."""
    if not db.supports_listen(using):
        return
    batches: dict[str, _Batch] = _batches.__dict__.setdefault("by_alias", {})
    batch = batches.get(using)
    # A transaction is told apart by its outermost atomic block: a batch left
    # by one that rolled back (no callback of it ran) is not sent with the
    # next, unless the next enters the same block object (a function
    # decorated with ``atomic``, called again): then its notifications go
    # with the next one's, spurious wake-ups (Django's list of callbacks,
    # which would tell, is private; tests/test_architecture.py).
    blocks = connections[using].atomic_blocks
    outermost = blocks[0] if blocks else None
    if batch is None or batch.committed or batch.transaction is not outermost:
        batch = batches[using] = _Batch(outermost)
    put(batch)
    transaction.on_commit(partial(batch.send, using), using=using, robust=True)
