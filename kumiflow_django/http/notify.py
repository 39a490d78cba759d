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
from django.urls import NoReverseMatch, reverse

from kumiflow_django.conf import settings
from kumiflow_django.store import wakeups
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.http")

#: The channel the live run streams LISTEN on; the payload is the run id.
CHANNEL = "kumiflow_runs"
#: The stream type of runs' streams (the engine's ``workflow-run``).
RUN_STREAM_TYPE = "workflow-run"


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
    if listening():  # else nobody listens: streams poll
        wakeups.notify(CHANNEL, run_id, using)


def on_event_appended(sender: Any, event: Any, **kwargs: Any) -> None:
    """``event_appended`` receiver: a run's event announces the run."""
    if event.stream_type == RUN_STREAM_TYPE:
        notify_run_changed(event.stream_id)
