"""Append-only in the database itself: triggers on the event table, and the one
sanctioned way past them.

The ORM guards of :class:`~kumiflow_django.models.Event` stop ``save()``,
``update()`` and ``delete()`` in Python; these triggers stop what bypasses
the ORM (``QuerySet(Event).update()``, ``_base_manager``, raw SQL):

- ``UPDATE`` of an event is always refused;
- ``DELETE`` (and ``TRUNCATE`` on PostgreSQL) is refused unless the
  connection holds an :func:`erasure_permit`, which only erasure
  (``erase_stream``), retention and ``manage.py flush`` open.

How a connection holds the permit differs by backend: a transaction-local
setting on PostgreSQL (``kumiflow.erasure``), a session variable on
MariaDB/MySQL (``@kumiflow_erasure``), a function the app registers on
each SQLite connection (``kumiflow_erasure_permitted()``; a connection
without it, such as the ``sqlite3`` shell, cannot delete events at all).
Schema changes (``DROP TRIGGER``, ``DROP TABLE``) are outside this
guarantee: a database user allowed to change the schema can remove it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from django.db import connections, transaction

from kumiflow_django.store import db
from kumiflow_django.store.models import allow_writes

#: Set while an SQLite connection of this thread holds the permit.
_sqlite_permit: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "kumiflow_sqlite_erasure_permit", default=False
)

POSTGRESQL_INSTALL = [
    """
    CREATE OR REPLACE FUNCTION kumiflow_event_append_only() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' THEN
            RAISE EXCEPTION 'kumiflow: UPDATE of an event is refused (append-only log)'
                USING ERRCODE = 'restrict_violation';
        END IF;
        IF coalesce(current_setting('kumiflow.erasure', true), '') <> 'on' THEN
            RAISE EXCEPTION 'kumiflow: % of an event is refused (append-only log)', TG_OP
                USING ERRCODE = 'restrict_violation',
                      HINT = 'Erase a stream with kumiflow_django.erase_stream().';
        END IF;
        RETURN OLD;
    END
    $$
    """,
    """
    CREATE TRIGGER kumiflow_event_append_only BEFORE UPDATE OR DELETE ON kumiflow_event
    FOR EACH ROW EXECUTE FUNCTION kumiflow_event_append_only()
    """,
    """
    CREATE TRIGGER kumiflow_event_no_truncate BEFORE TRUNCATE ON kumiflow_event
    FOR EACH STATEMENT EXECUTE FUNCTION kumiflow_event_append_only()
    """,
]
POSTGRESQL_UNINSTALL = [
    "DROP TRIGGER IF EXISTS kumiflow_event_no_truncate ON kumiflow_event",
    "DROP TRIGGER IF EXISTS kumiflow_event_append_only ON kumiflow_event",
    "DROP FUNCTION IF EXISTS kumiflow_event_append_only()",
]

MYSQL_INSTALL = [
    """
    CREATE TRIGGER kumiflow_event_no_update BEFORE UPDATE ON kumiflow_event
    FOR EACH ROW SIGNAL SQLSTATE '45000'
        SET MESSAGE_TEXT = 'kumiflow: UPDATE of an event is refused (append-only log)'
    """,
    """
    CREATE TRIGGER kumiflow_event_no_delete BEFORE DELETE ON kumiflow_event FOR EACH ROW
    BEGIN
        IF @kumiflow_erasure IS NULL OR @kumiflow_erasure <> 1 THEN
            SIGNAL SQLSTATE '45000'
                SET MESSAGE_TEXT = 'kumiflow: DELETE of an event is refused (append-only log)';
        END IF;
    END
    """,
]
MYSQL_UNINSTALL = [
    "DROP TRIGGER IF EXISTS kumiflow_event_no_update",
    "DROP TRIGGER IF EXISTS kumiflow_event_no_delete",
]

SQLITE_INSTALL = [
    """
    CREATE TRIGGER kumiflow_event_no_update BEFORE UPDATE ON kumiflow_event
    BEGIN
        SELECT RAISE(ABORT, 'kumiflow: UPDATE of an event is refused (append-only log)');
    END
    """,
    """
    CREATE TRIGGER kumiflow_event_no_delete BEFORE DELETE ON kumiflow_event
    WHEN kumiflow_erasure_permitted() IS NOT 1
    BEGIN
        SELECT RAISE(ABORT, 'kumiflow: DELETE of an event is refused (append-only log)');
    END
    """,
]
SQLITE_UNINSTALL = [
    "DROP TRIGGER IF EXISTS kumiflow_event_no_update",
    "DROP TRIGGER IF EXISTS kumiflow_event_no_delete",
]

_SQL = {
    "postgresql": (POSTGRESQL_INSTALL, POSTGRESQL_UNINSTALL),
    "mysql": (MYSQL_INSTALL, MYSQL_UNINSTALL),
    "sqlite": (SQLITE_INSTALL, SQLITE_UNINSTALL),
}


def install(apps: Any, schema_editor: Any) -> None:
    """Migration step: create the triggers of this backend."""
    _execute(schema_editor.connection, _SQL.get(schema_editor.connection.vendor, ((), ()))[0])


def uninstall(apps: Any, schema_editor: Any) -> None:
    _execute(schema_editor.connection, _SQL.get(schema_editor.connection.vendor, ((), ()))[1])


def _execute(connection: Any, statements: Any) -> None:
    # A plain cursor without parameters: the bodies contain '%' (PL/pgSQL).
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def register_sqlite_function(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: give each SQLite connection the permit check."""
    if db.runs_python_functions(connection):
        connection.connection.create_function(
            "kumiflow_erasure_permitted", 0, lambda: int(_sqlite_permit.get())
        )


@contextlib.contextmanager
def erasure_permit(using: str | None = None) -> Iterator[None]:
    """Allow deleting events on this connection, inside one transaction.

    Only erasure, retention and ``flush`` use it: every other path that
    deletes or changes an event is refused by the database.
    """
    using = using or db.alias()
    connection = connections[using]
    permit = db.erasure_permit_sql(using)  # None: SQLite's permit is the context variable
    with allow_writes(), transaction.atomic(using=using):
        if permit is not None:
            with connection.cursor() as cursor:
                cursor.execute(permit[0])
        token = _sqlite_permit.set(True)
        try:
            yield
        except BaseException:
            if permit is not None and not permit[2]:  # a session variable: not transactional
                _close_permit(connection, permit[1])
            raise  # PostgreSQL: the rollback of this block undoes the setting
        finally:
            _sqlite_permit.reset(token)
        # Closed before the block ends: the caller's transaction goes on without it.
        if permit is not None:
            with connection.cursor() as cursor:
                cursor.execute(permit[1])


def _close_permit(connection: Any, statement: str) -> None:
    with contextlib.suppress(Exception), connection.cursor() as cursor:
        cursor.execute(statement)
