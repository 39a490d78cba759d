"""The one seam where the database shows through: which one, its locks, its errors.

**Which database.** Every table of kumiflow-django lives in the database of
``KUMIFLOW_DATABASE`` (default ``"default"``): the models' managers, the
engine's transactions, its locks and its notifications all use
:func:`alias`. Events appended in your transaction are atomic with your
own writes only when your models live in that database too.

**Locks.** ``SELECT … FOR UPDATE`` where the database has it, ``SKIP
LOCKED`` where it has that too; SQLite has neither and needs neither (its
``IMMEDIATE`` transactions let one writer in at a time). Everywhere, the
stream versions are the guard that holds: these locks only save work.

**Errors.** Telling apart what a database error means for the engine:

- a **version clash**: the log's version guard refused a second event at one
  stream version, because another writer got there first; the loser skips;
- a **transient** error: the database is unreachable, restarting, or broke a
  deadlock or a lock wait; the same work is tried again soon;
- anything else is a **refusal**: the database will refuse the same write
  again (a value it cannot store, a check constraint, a trigger), so the work
  is retried a bounded number of times with backoff, then given up with a
  reason, never retried at once forever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, IntegrityError, InterfaceError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model, QuerySet

from kumiflow_django.conf import settings


def alias() -> str:
    """The database alias of every kumiflow-django table (``KUMIFLOW_DATABASE``)."""
    return str(settings.DATABASE)


def connection() -> BaseDatabaseWrapper:
    """This thread's connection to kumiflow-django's database."""
    return connections[alias()]


@contextmanager
def atomic(*, savepoint: bool = True) -> Iterator[None]:
    """``transaction.atomic`` on kumiflow-django's database. A transaction the
    engine opens itself (not a block inside the caller's) gets bounded waits
    (:func:`bound_waits`), so a worker that is cut off mid-transaction cannot
    hold its locks for longer than those bounds."""
    conn = connection()
    owned = not conn.in_atomic_block and conn.get_autocommit()
    with transaction.atomic(using=alias(), savepoint=savepoint):
        if owned:
            bound_waits(conn)
        yield


def wait_bounds() -> dict[str, int]:
    """PostgreSQL's limits for the engine's own transactions, in milliseconds:
    ``KUMIFLOW_LOCK_TIMEOUT`` (None: half the lease, so that a lock wait ends
    as a lock timeout, a transient error, before the statement's limit),
    ``KUMIFLOW_STATEMENT_TIMEOUT`` (None: the lease) and the lease as the
    idle-in-transaction limit; 0 leaves the server's value."""
    lease = float(settings.LEASE_SECONDS)
    return {
        "lock_timeout": _ms(settings.LOCK_TIMEOUT, lease / 2),
        "statement_timeout": _ms(settings.STATEMENT_TIMEOUT, lease),
        "idle_in_transaction_session_timeout": _ms(None, lease),
    }


def _ms(seconds: float | None, default: float) -> int:
    if seconds is None:
        seconds = default
    return 0 if seconds <= 0 else max(1, round(seconds * 1000))


def bound_waits(conn: BaseDatabaseWrapper) -> None:
    """Set the limits of :func:`wait_bounds` for the current transaction only
    (``set_config(..., true)`` is ``SET LOCAL``): the caller's own transactions
    on the same connection keep theirs. One round trip, PostgreSQL only
    (MariaDB's are per session: the workers set them, ``workers/loop.py``)."""
    if conn.vendor != "postgresql":
        return
    bounds = {name: ms for name, ms in wait_bounds().items() if ms}
    if not bounds:
        return
    sql = ", ".join("set_config(%s, %s, true)" for _ in bounds)
    params = [value for name, ms in bounds.items() for value in (name, f"{ms}ms")]
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT {sql}", params)


def on_commit(fn: Callable[[], Any]) -> None:
    """Run ``fn`` after the current transaction of kumiflow-django's database
    commits (at once outside a transaction). Robust: what it raises is logged,
    never passed to the committer, whose commit succeeded."""
    transaction.on_commit(fn, using=alias(), robust=True)


def in_transaction() -> bool:
    return bool(connection().in_atomic_block)


def one_writer_at_a_time() -> bool:
    """Whether the database lets one write transaction in at a time (SQLite's
    IMMEDIATE transactions): then no two writers interleave, and a log
    position below a committed one is never still in flight."""
    return connection().vendor == "sqlite"


def for_update[M: Model](qs: QuerySet[M, M], *, skip_locked: bool = False) -> QuerySet[M, M]:
    """``qs`` locking its rows where the database can (skipping locked ones if asked)."""
    features = connections[qs.db].features
    if not features.has_select_for_update:
        return qs
    return qs.select_for_update(
        skip_locked=skip_locked and features.has_select_for_update_skip_locked
    )


#: The unique constraint that is the log's version guard.
VERSION_CONSTRAINT = "kumiflow_event_stream_version_uq"

# PostgreSQL SQLSTATEs: serialization failure, deadlock, lock not available,
# admin/crash shutdown, cannot connect now, connection exceptions, idle timeouts.
_PG_TRANSIENT = {"40001", "40P01", "55P03", "57P01", "57P02", "57P03", "25P03", "57P05"}
# MySQL/MariaDB error numbers: lock wait timeout, deadlock, too many
# connections, server gone away, lost connection, cannot connect,
# connection killed, idle disconnect.
_MYSQL_TRANSIENT = {1205, 1213, 1040, 2006, 2013, 2003, 1927, 4031}
_SQLITE_TRANSIENT = ("database is locked", "database table is locked")


def constraint_name(error: BaseException) -> str | None:
    """The name of the constraint a PostgreSQL error names, if any."""
    diag = getattr(error.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)


def is_version_clash(error: BaseException) -> bool:
    """Whether the log's version guard refused the insert (a concurrent writer won)."""
    if not isinstance(error, IntegrityError):
        return False
    named = constraint_name(error)
    if named is not None:  # PostgreSQL
        return named == VERSION_CONSTRAINT
    text = str(error)
    return (
        VERSION_CONSTRAINT in text  # MariaDB/MySQL name the unique key
        or "kumiflow_event.stream_id, kumiflow_event.version" in text  # SQLite names columns
    )


def is_unique_violation(error: BaseException, constraint: str) -> bool:
    """Whether a unique constraint of that name refused the write."""
    if not isinstance(error, IntegrityError):
        return False
    named = constraint_name(error)
    return named == constraint if named is not None else constraint in str(error)


def is_transient(error: BaseException) -> bool:
    """Whether trying the same work again soon may well succeed."""
    if isinstance(error, InterfaceError):
        return True  # the connection is closed or broken
    if not isinstance(error, DatabaseError):
        return False
    cause = error.__cause__
    # MySQL's error number first: PyMySQL 1.1+ also gives a SQLSTATE, the
    # generic HY000 for a lock wait timeout or an idle disconnect.
    args = getattr(cause, "args", None) or error.args
    if args and isinstance(args[0], int):
        return args[0] in _MYSQL_TRANSIENT
    sqlstate = getattr(cause, "sqlstate", None)
    if isinstance(sqlstate, str):
        return sqlstate in _PG_TRANSIENT or sqlstate.startswith("08")
    text = str(error).lower()
    if any(phrase in text for phrase in _SQLITE_TRANSIENT):
        return True
    # psycopg reports a dropped connection as OperationalError without a SQLSTATE.
    return type(cause).__name__ == "OperationalError" and sqlstate is None and "closed" in text
