"""Telling the loops that work was committed, so they need not wait for a poll.

After commit, a segment that left a due (or soon due) run or dispatch calls
:func:`work_committed`. Loops in this process are woken directly; on
PostgreSQL a ``NOTIFY`` wakes loops in other processes. The loops' own polls
stay the source of truth: a lost notification only costs latency.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial

from django.db import connection, transaction

from kumiflow_django import clock
from kumiflow_django.conf import settings

logger = logging.getLogger("kumiflow_django.wakeups")

CHANNEL = "kumiflow_work"

Listener = Callable[[str], None]
_listeners: list[Listener] = []
_lock = threading.Lock()


def subscribe(listener: Listener) -> None:
    with _lock:
        _listeners.append(listener)


def unsubscribe(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def work_committed(
    kind: str, when: datetime | None = None, run_id: uuid.UUID | None = None
) -> None:
    """Announce, after the current transaction commits, work of ``kind`` due at
    ``when`` (and enqueue the run's wake-up task when tasks are configured)."""
    alias = settings.TASKS_BACKEND
    if alias and run_id is not None and kind == "resume":
        from kumiflow_django import tasks

        transaction.on_commit(partial(tasks.enqueue, alias, run_id, when), robust=True)
    if when is not None and when > clock.now() + timedelta(seconds=settings.MAX_INTERVAL):
        return  # far away: the loops will find it by polling
    transaction.on_commit(partial(announce, kind), robust=True)


def announce_local(kind: str) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(kind)


def announce(kind: str) -> None:
    announce_local(kind)
    if connection.vendor == "postgresql":
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, kind])
        except Exception:  # a notification is an optimisation, never a failure
            logger.debug("NOTIFY failed", exc_info=True)
