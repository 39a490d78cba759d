"""The shape every background loop shares (resume, dispatch, cron).

A loop does a batch of work, then sleeps until its next known due time,
bounded by ``max_interval``, or until it is told that new work was
committed (in this process, or by PostgreSQL ``NOTIFY`` from another).
``stop()`` makes it finish the item at hand and return. Commands are thin
shells around these classes; tests call ``run_once()`` directly.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any, ClassVar

from django.conf import settings as django_settings
from django.db import reset_queries
from django.db.backends.signals import connection_created

from kumiflow_django.store import clock, db, wakeups
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.workers.loop")


class Loop:
    name: ClassVar[str] = "loop"
    #: The kinds of committed work (see ``wakeups``) that wake this loop.
    kinds: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, batch_size: int = 100, max_interval: float = 5.0) -> None:
        self.batch_size = batch_size
        self.max_interval = max_interval
        self._stopping = threading.Event()
        self._wake = threading.Event()

    # -- to implement ------------------------------------------------------
    def run_once(self) -> int:
        """Handle one batch of due work; return how many items were handled."""
        raise NotImplementedError

    def next_due(self) -> datetime | None:
        """When the next known item becomes due, if any."""
        return None

    # -- running -----------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def notify(self, kind: str) -> None:
        if kind in self.kinds:
            self._wake.set()

    def sleep_seconds(self) -> float:
        due = self.next_due()
        if due is None:
            return self.max_interval
        seconds = (due - clock.now()).total_seconds()
        return min(max(seconds, 0.0), self.max_interval)

    def run_forever(self) -> None:
        wakeups.subscribe(self.notify)
        logger.info("%s loop started", self.name)
        try:
            while not self.stopping:
                refresh_connection()
                if django_settings.DEBUG:
                    reset_queries()
                try:
                    handled = self.run_once()
                except Exception:
                    logger.exception("%s loop: a batch failed; trying again", self.name)
                    handled = 0
                if self._stopping.is_set():
                    break
                if handled >= self.batch_size:
                    continue  # more is due: no sleep
                try:
                    pause = self.sleep_seconds()
                except Exception:
                    logger.exception("%s loop: finding the next due time failed", self.name)
                    pause = self.max_interval
                logger.debug("%s loop: idle for up to %.1f s", self.name, pause)
                self._wake.wait(pause)
                self._wake.clear()
        finally:
            wakeups.unsubscribe(self.notify)
            self.close()
            db.connection().close()
            logger.info("%s loop stopped", self.name)

    def drain(self) -> None:
        """Wait for the work ``run_once`` started elsewhere (a pool's threads) to end."""

    def close(self) -> None:
        """Release what the loop holds besides this thread's connection."""


def refresh_connection() -> None:
    """Keep this thread's connection from one poll to the next, unless it broke.

    Django's ``close_old_connections()`` closes it after every "request" when
    ``CONN_MAX_AGE`` is 0 (the default): for a loop that polls every few
    seconds, reconnecting would cost more than the poll itself. A positive
    ``CONN_MAX_AGE`` is honoured.
    """
    connection = db.connection()
    if connection.connection is None:
        return
    if connection.errors_occurred and not connection.is_usable():
        connection.close()
        return
    max_age = connection.settings_dict.get("CONN_MAX_AGE")
    if max_age and connection.close_at is not None and time.monotonic() >= connection.close_at:
        connection.close()


def limit_idle_transactions(seconds: float) -> None:
    """Make the database end a worker's transaction that sits idle longer than
    the lease (a hung step): its locks are freed and another worker goes on."""

    def configure(sender: Any, connection: Any, **kwargs: Any) -> None:
        if connection.alias != db.alias():
            return
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"SET idle_in_transaction_session_timeout = {int(seconds * 1000)}")
            elif connection.vendor == "mysql" and connection.mysql_is_mariadb:
                cursor.execute(f"SET SESSION idle_transaction_timeout = {max(1, int(seconds))}")
                # MariaDB's lock and statement limits are per session, not per
                # transaction: set on the workers' own connections only.
                bounds = db.wait_bounds()
                if lock_ms := bounds["lock_timeout"]:
                    cursor.execute(
                        f"SET SESSION innodb_lock_wait_timeout = {max(1, lock_ms // 1000)}"
                    )
                if statement_ms := bounds["statement_timeout"]:
                    cursor.execute(f"SET SESSION max_statement_time = {statement_ms / 1000}")

    connection_created.connect(configure, dispatch_uid="kumiflow-idle-transactions", weak=False)
