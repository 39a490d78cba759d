"""Appending to and reading from the event log.

This module is the only write path of the log. Appends are checked before
anything is written (type, payload, expected version, tenant), run in one
transaction (a savepoint inside the caller's), and send ``event_appended``
for every event once it is inserted, so receivers act in the same
transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction

from kumiflow_django import clock, rowsql
from kumiflow_django.conf import settings
from kumiflow_django.exceptions import InvalidEvent, TenantMismatch, VersionConflict
from kumiflow_django.jsonvalues import to_json
from kumiflow_django.models.event import Event, EventQuerySet, _allow_writes
from kumiflow_django.signals import event_appended

logger = logging.getLogger("kumiflow_django.eventstore")

#: Event types under this prefix are written by the engine only.
RESERVED_PREFIX = "kumiflow."


@dataclass(frozen=True)
class NewEvent:
    """An event to append: its type, payload and metadata."""

    type: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = 1


def resolve_tenant(tenant: str | None) -> str:
    value = settings.DEFAULT_TENANT if tenant is None else tenant
    if not isinstance(value, str) or not value or len(value) > 64:
        raise InvalidEvent(f"tenant must be a non-empty string of at most 64 characters: {value!r}")
    return value


def _check_stream_id(stream_id: object) -> str:
    if isinstance(stream_id, int | str) or hasattr(stream_id, "hex"):
        value = str(stream_id)
        if value and len(value) <= 100:
            return value
    raise InvalidEvent(f"stream_id must be a non-empty id of at most 100 characters: {stream_id!r}")


def _check_event(new: NewEvent, *, internal: bool) -> NewEvent:
    if not isinstance(new.type, str) or not new.type.strip():
        raise InvalidEvent(f"event type must be a non-empty string: {new.type!r}")
    if len(new.type) > 200:
        raise InvalidEvent(f"event type is longer than 200 characters: {new.type[:40]!r}…")
    if not internal and new.type.startswith(RESERVED_PREFIX):
        raise InvalidEvent(
            f"event type {new.type!r} uses the reserved prefix {RESERVED_PREFIX!r}, "
            "which only the workflow engine writes"
        )
    if not isinstance(new.payload, Mapping):
        raise InvalidEvent(f"payload of {new.type!r} must be a mapping, not {type(new.payload)}")
    if not isinstance(new.metadata, Mapping):
        raise InvalidEvent(f"metadata of {new.type!r} must be a mapping")
    if not isinstance(new.schema_version, int) or new.schema_version < 1:
        raise InvalidEvent(f"schema_version must be a positive integer: {new.schema_version!r}")
    return NewEvent(
        type=new.type,
        payload=to_json(dict(new.payload), f"payload of {new.type!r}"),
        metadata=to_json(dict(new.metadata), f"metadata of {new.type!r}"),
        schema_version=new.schema_version,
    )


def append_event(
    stream_id: str,
    type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    stream_type: str = "",
    tenant: str | None = None,
    expected_version: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    schema_version: int = 1,
    created_by: str = "",
) -> Event:
    """Append one event to a stream and return it, saved.

    ``expected_version`` is the version the stream must be at (0: it must
    not exist yet); a stale one raises :class:`VersionConflict`.
    """
    new = NewEvent(type, payload or {}, metadata or {}, schema_version)
    return append_events(
        stream_id,
        [new],
        stream_type=stream_type,
        tenant=tenant,
        expected_version=expected_version,
        created_by=created_by,
    )[0]


def append_events(
    stream_id: str,
    events: Iterable[NewEvent],
    *,
    stream_type: str = "",
    tenant: str | None = None,
    expected_version: int | None = None,
    created_by: str = "",
) -> list[Event]:
    """Append several events to one stream, all or none."""
    sid = _check_stream_id(stream_id)
    tenant_id = resolve_tenant(tenant)
    if expected_version is not None and (
        not isinstance(expected_version, int) or isinstance(expected_version, bool)
    ):
        raise InvalidEvent(f"expected_version must be an integer: {expected_version!r}")
    if expected_version is not None and expected_version < 0:
        raise InvalidEvent(f"expected_version must not be negative: {expected_version}")
    checked = [_check_event(e, internal=False) for e in events]
    if not checked:
        raise InvalidEvent("append_events() needs at least one event")
    if len(stream_type) > 100 or len(created_by) > 150:
        raise InvalidEvent("stream_type (100) or created_by (150) is too long")

    with transaction.atomic():
        head = (
            Event.objects.filter(stream_id=sid)
            .order_by("-version")
            .values_list("tenant_id", "version")
            .first()
        )
        if head is not None and head[0] != tenant_id:
            raise TenantMismatch(sid, tenant_id)
        current = head[1] if head is not None else 0
        if expected_version is not None and expected_version != current:
            raise VersionConflict(sid, expected_version, current)
        now = clock.now()
        rows = [
            Event(
                tenant_id=tenant_id,
                stream_type=stream_type,
                stream_id=sid,
                version=current + i,
                type=e.type,
                schema_version=e.schema_version,
                payload=e.payload,
                metadata=e.metadata,
                created_at=now,
                created_by=created_by,
            )
            for i, e in enumerate(checked, start=1)
        ]
        try:
            insert(rows)
        except IntegrityError as exc:
            # A concurrent writer took the version between our read and insert.
            raise VersionConflict(
                sid, current if expected_version is None else expected_version, None
            ) from exc
        notify(rows)
    return rows


def insert(rows: Sequence[Event], using: str = DEFAULT_DB_ALIAS) -> None:
    """Insert prepared events (positions are filled in). The store's only INSERT."""
    if connections[using].features.can_return_rows_from_bulk_insert:
        rowsql.insert(Event, rows, using=using, return_pk=True)
    else:  # pragma: no cover - MySQL without RETURNING
        with _allow_writes():
            for row in rows:
                row.save(force_insert=True, using=using)


def notify(rows: Sequence[Event]) -> None:
    """Send ``event_appended`` for each inserted event, in order."""
    for row in rows:
        event_appended.send(sender=Event, event=row)


def load_stream(
    stream_id: str, *, tenant: str | None = None, after_version: int = 0
) -> list[Event]:
    """A stream's events of one tenant, in version order."""
    qs = Event.objects.for_stream(_check_stream_id(stream_id), resolve_tenant(tenant))
    if after_version:
        qs = qs.filter(version__gt=after_version)
    return list(qs)


def stream_version(stream_id: str, *, tenant: str | None = None) -> int:
    """The version of a stream's last event (0 for a stream that does not exist)."""
    last = (
        Event.objects.filter(
            stream_id=_check_stream_id(stream_id), tenant_id=resolve_tenant(tenant)
        )
        .order_by("-version")
        .values_list("version", flat=True)
        .first()
    )
    return last or 0


def read_log(
    *,
    after: int = 0,
    tenant: str | None = None,
    all_tenants: bool = False,
    types: Iterable[str] | None = None,
    limit: int | None = None,
) -> EventQuerySet:
    """Events after ``after`` (a position), in log order: the feed of projections.

    Scoped to one tenant unless ``all_tenants=True``.
    """
    qs = Event.objects.filter(position__gt=after).order_by("position")
    if not all_tenants:
        qs = qs.filter(tenant_id=resolve_tenant(tenant))
    if types is not None:
        qs = qs.filter(type__in=list(types))
    if limit is not None:
        qs = qs[:limit]
    return qs


def erase_stream(stream_id: str, *, tenant: str | None = None) -> int:
    """Delete every event of one stream: the one exception to append-only.

    Meant for erasure of personal data. Runs whose trigger event is erased
    fail with reason ``trigger_event_unavailable`` when they next resume.
    Returns the number of events deleted.
    """
    sid, tenant_id = _check_stream_id(stream_id), resolve_tenant(tenant)
    with _allow_writes(), transaction.atomic():
        deleted, _ = Event.objects.filter(stream_id=sid, tenant_id=tenant_id).delete()
    logger.warning("erased stream %s of tenant %s (%d events)", sid, tenant_id, deleted)
    return deleted
