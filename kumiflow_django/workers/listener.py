"""Relaying PostgreSQL notifications to this process's loops.

Work committed in another process (a web request, another worker) sends a
``NOTIFY`` on :data:`~kumiflow_django.store.wakeups.CHANNEL`; one listener
thread per worker process ``LISTEN``s on its own connection and wakes the
loops here. Behind a transaction-pooling PgBouncer ``LISTEN`` does not work:
the loops then find work by polling, within their ``--max-interval``.
"""

from __future__ import annotations

import threading
from typing import Any

from kumiflow_django.store import db, wakeups
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.listener")


class PgListener(threading.Thread):
    """Relays PostgreSQL notifications on ``wakeups.CHANNEL`` to this process's loops."""

    def __init__(self) -> None:
        super().__init__(name="kumiflow-listen", daemon=True)
        self._stopping = threading.Event()
        self.params: dict[str, Any] = db.connection().get_connection_params()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:  # pragma: no cover - exercised by the worker tests on PostgreSQL
        import psycopg

        while not self._stopping.is_set():
            try:
                params = {k: v for k, v in self.params.items() if k not in ("cursor_factory",)}
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {wakeups.CHANNEL}")
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=1.0):
                            wakeups.announce_local(note.payload)
            except Exception:
                logger.warning("LISTEN connection lost; retrying", exc_info=True)
                self._stopping.wait(2.0)
