"""Handshakes for race tests: order two transactions by what the database says,
never by sleeping.

A thread that holds its transaction open waits on a ``threading.Event`` the
test sets; a test that must know whether another connection's statement is
stuck behind a lock asks the server (PostgreSQL's ``pg_stat_activity``,
MariaDB's lock and process views) instead of guessing with a sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django.db import connections

POLL = 0.01


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    """Run ``fn`` in a thread with its own connection; collect what it raises."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def _waiting_statements() -> set[tuple[object, ...]]:
    """Statements of other sessions on this database that wait for a lock (or,
    on MariaDB, are still executing: seen twice in a row, they are stuck)."""
    connection = connections["default"]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
        else:
            cursor.execute(
                "SELECT ID, INFO FROM information_schema.PROCESSLIST WHERE DB = DATABASE() "
                "AND COMMAND = 'Query' AND ID <> CONNECTION_ID()"
            )
        return {tuple(row) for row in cursor.fetchall()}


def wait_until_blocked_or_done(thread: threading.Thread, timeout: float = 30) -> str:
    """``"done"`` once ``thread`` finished, ``"blocked"`` once one of its
    statements waits on a lock held by another transaction (PostgreSQL and
    MariaDB only)."""
    deadline = time.monotonic() + timeout
    seen: set[tuple[object, ...]] = set()
    while time.monotonic() < deadline:
        if not thread.is_alive():
            return "done"
        waiting = _waiting_statements()
        if connections["default"].vendor == "postgresql" and waiting:
            return "blocked"
        if waiting & seen:  # MariaDB: the same statement still running a poll later
            return "blocked"
        seen = waiting
        time.sleep(POLL * 5)
    raise AssertionError(f"{thread.name} neither finished nor waited on a lock in {timeout}s")
