"""PostgreSQL notifications of changed runs, for the live run streams.

Every event of a run's stream calls :func:`notify_run_changed`. On
PostgreSQL it sends ``pg_notify('kumiflow_runs', <run id>)`` after the
transaction commits, once per run and transaction, however many events the
transaction appended to it: a segment writes several events in one
transaction, and a stream needs one wake-up to read them all. Elsewhere it
does nothing (streams poll there), and so it does with
``KUMIFLOW_SSE_LISTEN = False``: no stream listens then.

The notification is sent after the commit, not inside the transaction:
PostgreSQL serialises the commits of all transactions that notified, so a
NOTIFY inside a segment would make every segment wait for the others.
"""

from __future__ import annotations

import functools
from typing import Any

from django.conf import settings as django_settings
from django.db import connections, transaction
from django.urls import NoReverseMatch, reverse

from kumiflow_django.conf import settings
from kumiflow_django.store import db
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.http")

#: The channel the live run streams LISTEN on; the payload is the run id.
CHANNEL = "kumiflow_runs"
#: The stream type of runs' streams (the engine's ``workflow-run``).
RUN_STREAM_TYPE = "workflow-run"


class _Pending:
    """The run ids one transaction will announce, sent by one on-commit callback.

    It belongs to the connection's current list of on-commit callbacks:
    Django replaces that list when the transaction commits or rolls back and
    when a savepoint rolls back (dropping that savepoint's callbacks), so a
    new list means the ids gathered so far may not be sent, and a fresh
    ``_Pending`` with a fresh callback starts.
    """

    def __init__(self, hooks: list[Any], using: str) -> None:
        self.hooks = hooks
        self.using = using
        self.run_ids: dict[str, None] = {}  # a set that keeps the order

    def send(self) -> None:
        with connections[self.using].cursor() as cursor:
            cursor.execute(
                "SELECT pg_notify(%s, run_id) FROM unnest(%s::text[]) AS run_id",
                [CHANNEL, list(self.run_ids)],
            )


def listening() -> bool:
    """Whether live streams LISTEN (and changed runs are announced): the setting,
    or, when it is None, whether the API's live streams are mounted at all."""
    configured = settings.SSE_LISTEN
    if configured is not None:
        return bool(configured)
    return _streams_mounted(str(django_settings.ROOT_URLCONF))


@functools.cache
def _streams_mounted(urlconf: str) -> bool:
    try:
        reverse("kumiflow_api:run-events", args=["00000000-0000-0000-0000-000000000000"])
    except NoReverseMatch:
        return False
    except Exception:  # a URLconf that cannot be loaded here must not break appends
        logger.warning("cannot tell whether the live streams are mounted", exc_info=True)
        return False
    return True


def notify_run_changed(run_id: str, using: str | None = None) -> None:
    """Tell the live streams of ``run_id`` that it changed, once the transaction commits."""
    using = using or db.alias()
    connection = connections[using]
    if not db.supports_listen(using) or not listening():
        return  # nobody listens: streams poll
    if not connection.in_atomic_block:
        pending = _Pending([], using)
        pending.run_ids[run_id] = None
        transaction.on_commit(pending.send, using=using, robust=True)  # autocommit: now
        return
    current: _Pending | None = getattr(connection, "_kumiflow_notify", None)
    if current is None or current.hooks is not connection.run_on_commit:
        current = _Pending(connection.run_on_commit, using)
        connection._kumiflow_notify = current  # type: ignore[attr-defined]
        transaction.on_commit(current.send, using=using, robust=True)
    current.run_ids[run_id] = None


def on_event_appended(sender: Any, event: Any, **kwargs: Any) -> None:
    """``event_appended`` receiver: a run's event announces the run."""
    if event.stream_type == RUN_STREAM_TYPE:
        notify_run_changed(event.stream_id)
