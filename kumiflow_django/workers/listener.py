"""Relaying PostgreSQL notifications to this process's loops.

Work committed in another process (a web request, another worker) sends a
``NOTIFY`` on :data:`~kumiflow_django.store.wakeups.CHANNEL`; one listener
thread per worker process ``LISTEN``s on its own connection and wakes the
loops here.

**Behind a transaction-pooling PgBouncer** ``LISTEN`` is accepted but
useless: it runs on whichever server connection the pooler lends for that
one statement, and the listener's connection is lent none while it waits,
so no notification ever reaches it (and the pooled server connection keeps
listening for whoever borrows it next). So before it listens, the listener
*probes*: it listens on a channel of its own, has a second connection
notify it, and waits up to :data:`PROBE_SECONDS`. If nothing arrives, it
logs a warning once and ends: the loops find work by polling, within their
``--max-interval``, as they always do when a notification is lost. Only a
probe channel, notified once, can be left behind on a pooled connection.

``KUMIFLOW_LISTEN_DATABASE`` names another ``DATABASES`` alias for this one
connection (one that reaches PostgreSQL directly, or through session
pooling): the loops' connections then go through the pooler, and
notifications still arrive.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

from django.db import connections

from kumiflow_django.conf import settings
from kumiflow_django.store import db, wakeups
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.workers.loop import Outage

logger = get_logger("kumiflow_django.listener")

#: How long the probe waits for its own notification. On a direct connection
#: it arrives within milliseconds.
PROBE_SECONDS = 5.0


def listen_params(alias: str | None = None) -> dict[str, Any]:
    """psycopg connection parameters of the listener's database alias."""
    alias = alias or settings.LISTEN_DATABASE or db.alias()
    params = connections[alias].get_connection_params()
    return {k: v for k, v in params.items() if k not in ("cursor_factory",)}


def notifications_arrive(conn: Any, params: dict[str, Any], timeout: float = PROBE_SECONDS) -> bool:
    """Whether a notification sent by another connection reaches ``conn``
    (an autocommit psycopg connection): False behind transaction pooling."""
    import psycopg

    channel = f"kumiflow_probe_{secrets.token_hex(8)}"
    conn.execute(f"LISTEN {channel}")
    try:
        with psycopg.connect(**params, autocommit=True) as sender:
            sender.execute("SELECT pg_notify(%s, '')", [channel])
        return any(note.channel == channel for note in conn.notifies(timeout=timeout, stop_after=1))
    finally:
        conn.execute(f"UNLISTEN {channel}")


class PgListener(threading.Thread):
    """Relays PostgreSQL notifications on ``wakeups.CHANNEL`` to this process's loops."""

    def __init__(self, alias: str | None = None) -> None:
        super().__init__(name="kumiflow-listen", daemon=True)
        self._stopping = threading.Event()
        self.params = listen_params(alias)
        #: Set once notifications are known to arrive, and the listener listens.
        self.listening = threading.Event()
        #: Set when the probe found that notifications do not arrive.
        self.gave_up = threading.Event()
        self.outage = Outage("LISTEN connection")

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:  # pragma: no cover - exercised by the worker tests on PostgreSQL
        import psycopg

        while not self._stopping.is_set():
            try:
                with psycopg.connect(**self.params, autocommit=True) as conn:
                    if not notifications_arrive(conn, self.params):
                        self._give_up()
                        return
                    conn.execute(f"LISTEN {wakeups.CHANNEL}")
                    self.listening.set()
                    self.outage.succeeded()
                    logger.info("listening for notifications on %s", wakeups.CHANNEL)
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=1.0):
                            logger.debug("notified: %s", note.payload)
                            wakeups.announce_local(*wakeups.parse(note.payload))
            except Exception as exc:
                self.listening.clear()
                away = isinstance(exc, psycopg.OperationalError)  # the connection's errors
                self._stopping.wait(self.outage.failed(exc, away=away))

    def _give_up(self) -> None:
        self.gave_up.set()
        logger.warning(
            "notifications do not reach this worker's LISTEN connection (a PgBouncer in "
            "transaction pooling mode?); the loops find new work by polling, within "
            "--max-interval. Set KUMIFLOW_LISTEN_DATABASE to an alias that reaches "
            "PostgreSQL directly to keep notifications."
        )
