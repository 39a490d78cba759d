"""Runs and events as the API's JSON, and the opaque cursor of the run list.

The shapes are those of :mod:`kumiflow_django.http.schema`; a test checks
every answer against the OpenAPI document built from it.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from django.conf import settings as django_settings
from django.db import connections
from django.utils.dateparse import parse_datetime

from kumiflow_django.http.errors import bad_request
from kumiflow_django.models import WorkflowRun
from kumiflow_django.projections.waiting_for import waiting_for
from kumiflow_django.projections.waits import RunWait, own_wait

#: The run list reads only these columns, in this order (the state and the trail
#: can be large; :func:`summaries` unpacks a row in this order).
SUMMARY_FIELDS = (
    "id",
    "tenant_id",
    "workflow",
    "workflow_version",
    "status",
    "cursor",
    "idempotency_key",
    "version",
    "started_at",
    "updated_at",
    "finished_at",
    "attributes",
)

#: The columns of an event in the API, in this order (also read raw by the live streams).
EVENT_FIELDS = (
    "position",
    "event_id",
    "tenant_id",
    "stream_type",
    "stream_id",
    "version",
    "type",
    "schema_version",
    "payload",
    "metadata",
    "created_at",
    "created_by",
)


def timestamp(value: datetime | None) -> str | None:
    """ISO 8601 in UTC, whatever time zone the database connection used."""
    return None if value is None else value.astimezone(UTC).isoformat()


def position(cursor: Any) -> str | None:
    return ".".join(str(p) for p in cursor) if cursor else None


def run_summary(run: WorkflowRun) -> dict[str, Any]:
    """A run's summary from its model (the run list builds the same from its
    rows: :func:`summaries`)."""
    return {
        "id": str(run.id),
        "tenant": run.tenant_id,
        "workflow": run.workflow,
        "workflow_version": run.workflow_version or None,
        "status": run.status,
        "position": position(run.cursor),
        "idempotency_key": run.idempotency_key,
        "stream_version": run.version,
        "started_at": timestamp(run.started_at),
        "updated_at": timestamp(run.updated_at),
        "finished_at": timestamp(run.finished_at),
        "attributes": dict(run.attributes or {}),
    }


def summaries(rows: Iterable[Sequence[Any]], using: str) -> list[dict[str, Any]]:
    """The summaries of rows of :data:`SUMMARY_FIELDS`' columns as the driver
    gives them (the run list's page).

    Each column goes from the driver's value to its JSON once: through
    ``values()`` a row cost about a hundred Python calls, most of them the
    ORM's converters building values that were then turned into text. What
    comes out is what :func:`run_summary` gives of the run's model, to the
    byte (``tests/http/test_list_rows.py`` compares them).
    """
    connection = connections[using]
    # The naive datetimes of SQLite and MariaDB are in the connection's zone
    # (the backends' own convert_datetimefield_value); PostgreSQL's are aware.
    zone = connection.timezone if django_settings.USE_TZ else None
    meta = WorkflowRun._meta
    # JSONField.from_db_value: what the ORM does with these columns, decoder included
    cursor_json: Callable[..., Any] = meta.get_field("cursor").from_db_value
    attributes_json: Callable[..., Any] = meta.get_field("attributes").from_db_value

    def instant(raw: Any) -> str | None:
        if raw is None:
            return None
        when = raw if isinstance(raw, datetime) else parse_datetime(raw)
        assert when is not None, raw
        if zone is not None and when.tzinfo is None:
            when = when.replace(tzinfo=zone)
        return when.astimezone(UTC).isoformat()

    return [
        {
            "id": str(row_id if isinstance(row_id, uuid.UUID) else uuid.UUID(row_id)),
            "tenant": tenant,
            "workflow": workflow,
            "workflow_version": workflow_version or None,
            "status": status,
            "position": position(cursor_json(cursor, None, connection)),
            "idempotency_key": idempotency_key,
            "stream_version": version,
            "started_at": instant(started_at),
            "updated_at": instant(updated_at),
            "finished_at": instant(finished_at),
            "attributes": dict(attributes_json(attributes, None, connection) or {}),
        }
        for (
            row_id,
            tenant,
            workflow,
            workflow_version,
            status,
            cursor,
            idempotency_key,
            version,
            started_at,
            updated_at,
            finished_at,
            attributes,
        ) in rows
    ]


def run_detail(run: WorkflowRun) -> dict[str, Any]:
    state = run.state if isinstance(run.state, dict) else {}
    error = None
    wait = own_wait(run)
    if run.reason or run.last_error:
        error = {"reason": run.reason or None, "message": run.last_error}
    return {
        **run_summary(run),
        "cursor": run.cursor,
        "attempt": run.attempt,
        "wake_at": timestamp(run.wake_at),
        "awaiting": {"event_type": wait.event_type} if wait is not None else None,
        "waiting_for": _waiting_for(run, wait),
        "input": run.input,
        "result": run.result,
        "steps": {"results": state.get("steps") or {}, "trail": list(run.trail or [])},
        "error": error,
    }


def _waiting_for(run: WorkflowRun, wait: RunWait | None) -> dict[str, Any] | None:
    """The console's "waiting for task charge", as data (docs/concepts.md)."""
    awaited = waiting_for(run, wait)
    return None if awaited is None else dict(awaited)


def event_json(row: tuple[Any, ...]) -> dict[str, Any]:
    """An event from its :data:`EVENT_FIELDS` columns, read by the ORM or raw from
    PostgreSQL (where JSON arrives as text and ids as UUIDs)."""
    values = dict(zip(EVENT_FIELDS, row, strict=True))
    for name in ("payload", "metadata"):
        if isinstance(values[name], str | bytes):
            values[name] = json.loads(values[name])
    values["event_id"] = str(values["event_id"])
    values["created_at"] = timestamp(values["created_at"])
    return {("tenant" if name == "tenant_id" else name): v for name, v in values.items()}


def encode_cursor(started_at: datetime, run_id: uuid.UUID) -> str:
    """An opaque mark after the run of this key in (started_at, id) order: new
    runs never move it."""
    raw = json.dumps([started_at.astimezone(UTC).isoformat(), str(run_id)])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The mark a cursor holds; anything else (however crafted) is a 400 on ``cursor``."""
    try:
        if len(cursor) > 200:  # a cursor this API gives out is about 100 characters
            raise ValueError("too long")
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        found = json.loads(raw)
        if not (isinstance(found, list) and len(found) == 2):
            raise ValueError("not a pair")
        started, run_id = found
        if not (isinstance(started, str) and isinstance(run_id, str)):
            raise ValueError("not text")
        when = datetime.fromisoformat(started)
        if when.tzinfo is None:
            raise ValueError("naive")
        # in UTC here: a date at the calendar's edge overflows now, not in the query
        return when.astimezone(UTC), uuid.UUID(run_id)
    except (binascii.Error, ValueError, TypeError, OverflowError, RecursionError):
        raise bad_request("cursor", "is not a cursor this API gave out") from None


def bulk_operation(operation: Any) -> dict[str, Any]:
    """A bulk operation as the API answers it (``BulkOperation``)."""
    return {
        "id": str(operation.id),
        "action": operation.action,
        "status": operation.status,
        "filters": operation.filters,
        "matching": operation.total,
        "from_step": operation.from_step,
        "done": operation.done,
        "skipped": operation.skipped,
        "errors": operation.errors,
        "skipped_reasons": operation.skipped_reasons,
        "by": operation.by,
        "reason": operation.reason,
        "created_at": timestamp(operation.created_at),
        "finished_at": timestamp(operation.finished_at),
    }
