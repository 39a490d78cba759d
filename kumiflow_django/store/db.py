"""The one seam where the database shows through: which one, its locks, its errors.

**What it can do.** The only module that asks which database it is: the
others ask for a capability by what it means (:func:`supports_listen`,
:func:`one_writer_at_a_time`, :func:`supports_on_conflict`, ...).

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

A **lock conflict** (a deadlock broken, a serialization failure, a lock wait
that timed out) is the transient error a public operation can still lose
when it meets another transaction: :func:`retrying` runs it again (bounded,
with jitter) and answers :class:`~kumiflow_django.store.errors.OperationConflict`
when it keeps losing, never the raw database error. The order in which
transactions take their locks is in docs/architecture.md ("Lock order").
"""

from __future__ import annotations

import contextvars
import functools
import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, IntegrityError, InterfaceError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model, QuerySet
from django.db.transaction import TransactionManagementError

from kumiflow_django.conf import settings
from kumiflow_django.store.errors import OperationConflict
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.store.db")


def alias() -> str:
    """The database alias of every kumiflow-django table (``KUMIFLOW_DATABASE``)."""
    return str(settings.DATABASE)


def connection() -> BaseDatabaseWrapper:
    """This thread's connection to kumiflow-django's database."""
    return connections[alias()]


@contextmanager
def atomic(
    *, savepoint: bool = True, takes_nested: bool = False, leaves_release: bool = False
) -> Iterator[None]:
    """``transaction.atomic`` on kumiflow-django's database. A transaction the
    engine opens itself (not a block inside the caller's) gets bounded waits
    (:func:`bound_waits`), so a worker that is cut off mid-transaction cannot
    hold its locks for longer than those bounds.

    **A savepoint left to its enclosing block.** Releasing a savepoint right
    before the enclosing block releases its own (or commits) is one statement
    for nothing: the enclosing RELEASE releases the savepoints inside it too.
    A block with ``leaves_release`` that succeeds leaves its RELEASE to the
    block it is directly in, when that block ``takes_nested`` (an append, whose
    receivers start and wake runs, ``start_workflow``, the recording of a
    task's outcome and the match of an awaited event), at most
    :data:`MAX_LEFT_TO_ENCLOSING` times per block: each savepoint left open
    nests the next one inside it, and PostgreSQL pays for every level when it
    releases them. A block that fails still rolls back to its own savepoint,
    and drops the on-commit hooks registered in it, exactly as before.

    Django's atomic releases the savepoint whose id is last in the
    connection's ``savepoint_ids`` (a private attribute, unchanged since
    Django 1.6): the id is handed over by setting it to None, what an atomic
    block without a savepoint leaves there. Where Django no longer has it,
    every block releases its own; tests/test_savepoints.py and the query
    budgets (tests/test_query_budget.py) would say so."""
    conn = connection()
    owned = not conn.in_atomic_block and conn.get_autocommit()
    with transaction.atomic(using=alias(), savepoint=savepoint):
        if owned:
            bound_waits(conn)
        ids: list[str | None] | None = getattr(conn, "savepoint_ids", None)
        depth = -1 if ids is None else len(ids)
        token = _taker.set(_Taker(conn, depth)) if takes_nested and ids is not None else None
        try:
            yield
        finally:
            if token is not None:
                _taker.reset(token)
        if leaves_release and ids is not None:
            _leave_release(conn, ids, depth)


#: At most this many savepoints are left open to one enclosing block.
MAX_LEFT_TO_ENCLOSING = 8


class _Taker:
    """An enclosing block that releases the savepoints left to it."""

    __slots__ = ("connection", "depth", "taken")

    def __init__(self, connection: BaseDatabaseWrapper, depth: int) -> None:
        self.connection = connection
        self.depth = depth  # the length of ``savepoint_ids`` inside it
        self.taken = 0


_taker: contextvars.ContextVar[_Taker | None] = contextvars.ContextVar(
    "kumiflow_savepoint_taker", default=None
)


def _leave_release(conn: BaseDatabaseWrapper, ids: list[str | None], depth: int) -> None:
    """Leave this block's savepoint (last in ``ids``) to the block it is
    directly in, if that one takes it; else Django releases it."""
    taker = _taker.get()
    if (
        taker is None
        or taker.connection is not conn
        or taker.depth + 1 != depth
        or len(ids) != depth
        or ids[-1] is None
        or conn.needs_rollback  # Django rolls back to the savepoint: it must be there
        or taker.taken >= MAX_LEFT_TO_ENCLOSING
    ):
        return
    ids[-1] = None
    taker.taken += 1


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


def transaction_broken() -> BaseException | None:
    """The error that left the caller's transaction unable to run another
    statement, or None while it can go on.

    Django marks a transaction for rollback when a query in it failed (and
    the code that caught the error went on), or when a savepoint could not be
    rolled back (the database ended the transaction itself, as MariaDB does
    on a deadlock). The next query would raise ``TransactionManagementError``
    and hide the cause; a block that then ends without an error is rolled
    back to its savepoint *silently*, and what it wrote is gone while its
    caller goes on. Whoever notices raises this error instead."""
    conn = connection()
    if not (conn.in_atomic_block and conn.needs_rollback):
        return None
    cause: BaseException | None = getattr(conn, "rollback_exc", None)  # not in django-stubs
    return cause or TransactionManagementError("the transaction was marked for rollback")


def for_update[M: Model](qs: QuerySet[M, M], *, skip_locked: bool = False) -> QuerySet[M, M]:
    """``qs`` locking its rows where the database can (skipping locked ones if asked)."""
    features = connections[qs.db].features
    if not features.has_select_for_update:
        return qs
    return qs.select_for_update(
        skip_locked=skip_locked and features.has_select_for_update_skip_locked
    )


# -- What the database can do ----------------------------------------------
# The only place that asks which database it is (tests/test_architecture.py
# checks it): everywhere else asks for the capability by its name.


#: A database alias, or a connection (one Django opens outside the aliases,
#: such as PostgreSQL's ``__no_db__`` while it creates the test database).
Using = str | BaseDatabaseWrapper | None


def _connection(using: Using) -> BaseDatabaseWrapper:
    if isinstance(using, BaseDatabaseWrapper):
        return using
    return connections[using or alias()]


def _vendor(using: Using) -> str:
    return str(_connection(using).vendor)


def supports_listen(using: Using = None) -> bool:
    """Whether ``LISTEN``/``NOTIFY`` reach other processes (PostgreSQL)."""
    return _vendor(using) == "postgresql"


def one_writer_at_a_time(using: Using = None) -> bool:
    """Whether write transactions run one after the other (SQLite, IMMEDIATE):
    nothing is in flight beside a writer, and threads would only queue."""
    return _vendor(using) == "sqlite"


def runs_python_functions(using: Using = None) -> bool:
    """Whether SQL can call functions of this process (SQLite is embedded)."""
    return _vendor(using) == "sqlite"


def supports_on_conflict(using: Using = None) -> bool:
    """``INSERT … ON CONFLICT DO NOTHING`` (PostgreSQL, SQLite), else ``INSERT IGNORE``."""
    return _vendor(using) != "mysql"


def reads_head_in_insert(using: Using = None) -> bool:
    """Whether an append reads its stream's head inside its INSERT (one
    statement, ``sql.insert_after_head``): PostgreSQL and SQLite read it from
    the statement's snapshot and return the new rows. Not MariaDB: InnoDB takes
    shared locks on the rows an ``INSERT ... SELECT`` reads, which concurrent
    appends to one stream would then deadlock on; it reads the head first."""
    connection = _connection(using)
    return connection.vendor != "mysql" and connection.features.can_return_rows_from_bulk_insert


def claims_in_one_statement(using: Using = None) -> bool:
    """Whether a claim locks, checks and leases its rows in one statement, a
    transaction of its own (``UPDATE … FROM (SELECT … FOR UPDATE SKIP
    LOCKED) … RETURNING`` the rows as they were: ``sql.update_selected``):
    PostgreSQL. MariaDB's UPDATE returns no rows, and SQLite's RETURNING
    cannot name the rows as they were; they lock, check and lease in a
    short transaction."""
    return _vendor(using) == "postgresql"


def writes_in_one_statement(using: Using = None) -> bool:
    """Whether one write's INSERTs and UPDATEs go in one statement, data-modifying
    statements inside ``WITH`` (``sql.write_together``): PostgreSQL. MariaDB and
    SQLite have no such statements; there each is a statement of its own."""
    return _vendor(using) == "postgresql"


def explicit_ids_leave_sequence_behind(using: Using = None) -> bool:
    """Whether inserting a row with its own id leaves the id sequence where it
    was (PostgreSQL); MariaDB's and SQLite's counters move past it by themselves."""
    return _vendor(using) == "postgresql"


def json_compares_text(using: Using = None) -> bool:
    """Whether JSON equality in SQL compares the stored text (MariaDB: escaped
    strings, numbers as written, so 1 misses a stored 1.0)."""
    return _vendor(using) == "mysql"


def text_equality_is_exact(using: Using = None) -> bool:
    """Whether ``=`` on a text column compares exactly: MariaDB's collations
    ignore case, accents and trailing spaces."""
    return _vendor(using) != "mysql"


def uuid_prefix_is_a_range(using: Using = None) -> bool:
    """Whether the ids that start with a prefix are a range of the primary key:
    not on MariaDB's own UUID type, which orders a UUID by its last group first."""
    connection = _connection(using)
    return not (connection.vendor == "mysql" and connection.features.has_native_uuid_field)


def prefix_needs_range(using: Using = None) -> bool:
    """Whether ``startswith`` needs an explicit range to use an index (SQLite's
    ``LIKE`` is case-insensitive, so its index cannot serve it)."""
    return _vendor(using) == "sqlite"


def session_limits(connection: BaseDatabaseWrapper, seconds: float) -> list[str]:
    """The statements that bound a worker connection's session: its transaction
    ends when it sits idle longer than ``seconds``; on MariaDB, whose lock and
    statement limits are per session, not per transaction, also those of
    :func:`wait_bounds` (PostgreSQL sets them per transaction, :func:`bound_waits`)."""
    if connection.vendor == "postgresql":
        return [f"SET idle_in_transaction_session_timeout = {int(seconds * 1000)}"]
    if connection.vendor == "mysql" and getattr(connection, "mysql_is_mariadb", False):
        statements = [f"SET SESSION idle_transaction_timeout = {max(1, int(seconds))}"]
        bounds = wait_bounds()
        if lock_ms := bounds["lock_timeout"]:
            statements.append(f"SET SESSION innodb_lock_wait_timeout = {max(1, lock_ms // 1000)}")
        if statement_ms := bounds["statement_timeout"]:
            statements.append(f"SET SESSION max_statement_time = {statement_ms / 1000}")
        return statements
    return []


def replica_lag(using: str) -> float | None:
    """How far the replica of alias ``using`` is behind its primary, in seconds
    (0.0: it has replayed everything it received); None when it cannot tell
    (not a standby, another database, a replica without the privilege to ask).
    A connection error is raised: the replica is unreachable.

    PostgreSQL: the age of the last transaction it replayed while WAL is still
    waiting to be replayed or it does not stream; MariaDB: ``Seconds_Behind_Master``."""
    conn = connections[using]
    if conn.vendor == "postgresql":
        with conn.cursor() as cursor:
            # 0 only while it streams and has replayed all it received; else the
            # age of its last replayed transaction (too high on an idle primary:
            # a page then says it may be staler than it is, never fresher)
            cursor.execute(
                "SELECT CASE WHEN NOT pg_is_in_recovery() THEN NULL"
                " WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() AND EXISTS"
                " (SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming') THEN 0"
                " ELSE EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()) END"
            )
            row = cursor.fetchone()
        return None if row is None or row[0] is None else max(0.0, float(row[0]))
    if conn.vendor == "mysql":
        with conn.cursor() as cursor:
            try:
                cursor.execute("SHOW SLAVE STATUS")
            except (InterfaceError, DatabaseError) as exc:
                if is_transient(exc):
                    raise
                return None  # no privilege to ask: the lag is unknown
            names = [column[0] for column in cursor.description or ()]
            row = cursor.fetchone()
        if row is None or "Seconds_Behind_Master" not in names:
            return None
        value = row[names.index("Seconds_Behind_Master")]
        return None if value is None else float(value)
    return None


def erasure_permit_sql(using: Using = None) -> tuple[str, str, bool] | None:
    """The statements that open and close the log's erasure permit on this
    connection, and whether a rollback closes it too (PostgreSQL's setting is
    transactional, MariaDB's session variable is not); None: the permit is a
    Python function (SQLite)."""
    vendor = _vendor(using)
    if vendor == "postgresql":
        return (
            "SELECT set_config('kumiflow.erasure', 'on', true)",
            "SELECT set_config('kumiflow.erasure', '', true)",
            True,
        )
    if vendor == "mysql":
        return "SET @kumiflow_erasure = 1", "SET @kumiflow_erasure = NULL", False
    return None


def configured_isolation(config: Mapping[str, Any]) -> str | None:
    """The isolation level a ``DATABASES`` entry asks for, lower case, when it
    asks for one on PostgreSQL or MySQL/MariaDB (whose default is READ
    COMMITTED); None otherwise. Read from the settings: no connection needed."""
    vendor = str(config.get("ENGINE", "")).rsplit(".", 1)[-1]
    options = config.get("OPTIONS") or {}
    if vendor not in ("postgresql", "mysql") or "isolation_level" not in options:
        return None  # SQLite has one writer at a time; the others default to READ COMMITTED
    level = options["isolation_level"]
    if vendor == "postgresql":
        from django.db.backends.postgresql.psycopg_any import IsolationLevel

        try:
            # the driver's constant (psycopg 2 and 3 number the levels differently)
            return str(IsolationLevel(level).name.replace("_", " ").lower())
        except ValueError:
            return None  # Django itself refuses it when it connects
    # MySQL and MariaDB: a name, or None for the server's default
    return "the server's default" if level is None else str(level).lower()


#: The unique constraint that is the log's version guard.
VERSION_CONSTRAINT = "kumiflow_event_tenant_stream_version_uq"

# PostgreSQL SQLSTATEs: serialization failure, deadlock, lock not available,
# admin/crash shutdown, cannot connect now, connection exceptions, idle timeouts.
_PG_TRANSIENT = {"40001", "40P01", "55P03", "57P01", "57P02", "57P03", "25P03", "57P05"}
# MySQL/MariaDB error numbers: lock wait timeout, deadlock, too many
# connections, server gone away, lost connection, cannot connect,
# connection killed, idle disconnect.
_MYSQL_TRANSIENT = {1205, 1213, 1040, 2006, 2013, 2003, 1927, 4031}
_SQLITE_TRANSIENT = ("database is locked", "database table is locked")
# The lock conflicts among them: serialization failure, deadlock, lock not
# available; deadlock, lock wait timeout.
_PG_CONFLICT = {"40001", "40P01", "55P03"}
_MYSQL_CONFLICT = {1213, 1205}


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
        # SQLite names the columns
        or "kumiflow_event.tenant_id, kumiflow_event.stream_id, kumiflow_event.version" in text
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
    # psycopg reports a dropped or refused connection as OperationalError without a SQLSTATE.
    lost = "closed" in text or "connection failed" in text
    return type(cause).__name__ == "OperationalError" and sqlstate is None and lost


def is_lock_conflict(error: BaseException) -> bool:
    """Whether the database aborted the transaction because it met another one
    (a deadlock, a serialization failure, a lock wait that timed out): the same
    transaction, run again, may well succeed."""
    if not isinstance(error, DatabaseError):
        return False
    cause = error.__cause__
    sqlstate = getattr(cause, "sqlstate", None)
    if isinstance(sqlstate, str):
        return sqlstate in _PG_CONFLICT
    args = getattr(cause, "args", None) or error.args
    if args and isinstance(args[0], int):
        return args[0] in _MYSQL_CONFLICT
    return any(phrase in str(error).lower() for phrase in _SQLITE_TRANSIENT)


#: How many times a public operation runs when it loses lock conflicts.
CONFLICT_ATTEMPTS = 5
#: The first wait between two runs of it, in seconds; it doubles (with jitter).
CONFLICT_BACKOFF = 0.02


def retrying[**P, T](fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` (a function that runs whole transactions of its own) run again when
    the database aborted it for a lock conflict (:func:`is_lock_conflict`): up
    to :data:`CONFLICT_ATTEMPTS` times, after a random wait that doubles, so two
    callers that met stop meeting. The one retry of lost lock conflicts.

    When it keeps losing, or when it runs inside the caller's transaction (which
    only the caller can run again), it raises
    :class:`~kumiflow_django.store.errors.OperationConflict`: nothing was changed,
    the caller may try again. Other errors pass through at once.
    """

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            nested = in_transaction()
            try:
                return fn(*args, **kwargs)
            except DatabaseError as exc:
                if not is_lock_conflict(exc):
                    raise
                if nested or attempt == CONFLICT_ATTEMPTS:
                    raise OperationConflict(
                        f"{fn.__name__} lost to a concurrent transaction "
                        f"({'in the caller' if nested else f'{attempt} times'}): "
                        "nothing was changed; try again"
                    ) from exc
                delay = random.uniform(0, CONFLICT_BACKOFF * 2**attempt)  # noqa: S311 - jitter
                logger.info(
                    "%s lost a lock conflict (%s); running it again in %.3f s",
                    fn.__name__,
                    exc,
                    delay,
                )
                time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    return run
