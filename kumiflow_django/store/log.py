"""Appending to and reading from the event log.

This module is the only write path of the log for applications. Appends are
checked before anything is written (type, payload, stream, expected
version, tenant), run in one transaction (a savepoint inside the caller's),
and send ``event_appended`` for every event once it is inserted, so
receivers act in the same transaction.

A stream is a tenant's: ``(tenant, stream id)`` names it, and the same id
in two tenants is two streams with their own versions. Every read and write
of a stream here names its tenant.

Streams of runs, dispatches and cron schedules belong to the engine, which
writes them through :func:`insert`; applications cannot append to them. An
engine stream of another tenant is not there for an application: an append
to its id goes to the appender's own stream of that id, as for any id.
"""

from __future__ import annotations

import random
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, connections

from kumiflow_django.conf import settings
from kumiflow_django.signals import event_appended
from kumiflow_django.store import clock, db, limits, telemetry
from kumiflow_django.store import names as ev
from kumiflow_django.store import sql as rowsql
from kumiflow_django.store.db import is_version_clash
from kumiflow_django.store.errors import InvalidEvent, VersionConflict
from kumiflow_django.store.immutability import erasure_permit
from kumiflow_django.store.models import Event, EventQuerySet, allow_writes
from kumiflow_django.store.values import to_json

logger = telemetry.get_logger("kumiflow_django.store.log")

#: Event types under this prefix are written by the engine only.
RESERVED_PREFIX = "kumiflow."
#: Stream types of the engine's own streams (runs, dispatches, schedules).
ENGINE_STREAM_TYPES = frozenset({ev.RUN_STREAM, ev.DISPATCH_STREAM, ev.CRON_STREAM, ev.TASK_STREAM})
_ENGINE_TYPES = tuple(sorted(ENGINE_STREAM_TYPES))
#: At most this many events are appended with the head read inside their
#: INSERT (one ``SELECT`` per event in a ``UNION ALL``): SQLite refuses a
#: compound SELECT of more than 500 terms, and one statement text is cached
#: per count. A larger append reads the head first (one statement more).
FUSED_APPEND_MAX = 64
#: Stream ids the engine derives from names (``cron:<workflow>``): reserved.
RESERVED_STREAM_PREFIXES = (ev.CRON_STREAM_PREFIX,)
#: An append without ``expected_version`` that meets a concurrent writer
#: re-reads the stream's head and tries again, this many times at most.
MAX_APPEND_ATTEMPTS = 50

# Any C0/C1 control character, and lone surrogates: no column stores them
# everywhere, and the admin could not show them.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


@dataclass(frozen=True)
class NewEvent:
    """An event to append: its type, payload and metadata."""

    type: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = 1


class HandledTypes:
    """The event types the project reacts to: workflow triggers, awaited events,
    projection handlers. A stream id that is one of them is a sign of swapped
    arguments (``append_event("user.signed-up", "u1")``), and is refused."""

    def __init__(self) -> None:
        self._sources: list[Callable[[str], bool]] = []

    def add_source(self, source: Callable[[str], bool]) -> None:
        if source not in self._sources:
            self._sources.append(source)

    def __contains__(self, event_type: object) -> bool:
        return isinstance(event_type, str) and any(source(event_type) for source in self._sources)


handled_types = HandledTypes()


def check_text(value: object, what: str, max_length: int, *, empty: bool = False) -> str:
    """A string for a column of ``max_length`` characters, without control characters."""
    if not isinstance(value, str):
        raise InvalidEvent(f"{what} must be a string, not {type(value).__name__}: {value!r:.60}")
    if not value and not empty:
        raise InvalidEvent(f"{what} must be a non-empty string")
    if len(value) > max_length:
        raise InvalidEvent(f"{what} is longer than {max_length} characters: {value[:40]!r}…")
    if _CONTROL.search(value):
        raise InvalidEvent(
            f"{what} contains a control character or a lone surrogate: {value!r:.60}"
        )
    return value


def resolve_tenant(tenant: str | None) -> str:
    value = settings.DEFAULT_TENANT if tenant is None else tenant
    return check_text(value, "tenant", limits.TENANT)


def check_stream_id(stream_id: object) -> str:
    """A stream id is a string, an integer or a UUID; stored as text of at most 100 characters."""
    if isinstance(stream_id, uuid.UUID):
        return str(stream_id)
    if isinstance(stream_id, int) and not isinstance(stream_id, bool):
        return str(stream_id)
    if isinstance(stream_id, str):
        return check_text(stream_id, "stream_id", limits.STREAM_ID)
    raise InvalidEvent(
        f"stream_id must be a string, an integer or a UUID, not {type(stream_id).__name__}: "
        f"{stream_id!r:.60}"
    )


def check_event_type(event_type: object, *, internal: bool = False) -> str:
    value = check_text(event_type, "event type", limits.EVENT_TYPE)
    if not value.strip():
        raise InvalidEvent(f"event type must not be blank: {value!r}")
    if not internal and value.startswith(RESERVED_PREFIX):
        raise InvalidEvent(
            f"event type {value!r} uses the reserved prefix {RESERVED_PREFIX!r}, "
            "which only the workflow engine writes"
        )
    return value


def _check_mapping(value: object, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidEvent(f"{what} must be a mapping (a dict), not {type(value).__name__}")
    return value


def _check_event(new: NewEvent) -> NewEvent:
    event_type = check_event_type(new.type)
    payload = _check_mapping(new.payload, f"payload of {event_type!r}")
    metadata = _check_mapping(new.metadata, f"metadata of {event_type!r}")
    version = new.schema_version
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= 32767:
        raise InvalidEvent(f"schema_version must be an integer from 1 to 32767: {version!r}")
    return NewEvent(
        type=event_type,
        payload=to_json(dict(payload), f"payload of {event_type!r}"),
        # The trace context of the appending code, when a trace is active
        # (telemetry): a run this event starts or wakes continues it.
        metadata=telemetry.stamp(to_json(dict(metadata), f"metadata of {event_type!r}")),
        schema_version=version,
    )


#: What a stream id may be given as; it is stored as text.
StreamId = str | int | uuid.UUID


#: The metadata key of an event's ``priority=`` override.
PRIORITY_METADATA = "kumiflow_priority"


def check_priority(value: object) -> int:
    """A priority: an integer from -100 to 100 (higher first)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidEvent(f"priority must be an integer, not {type(value).__name__}")
    if not limits.MIN_PRIORITY <= value <= limits.MAX_PRIORITY:
        raise InvalidEvent(
            f"priority must be from {limits.MIN_PRIORITY} to {limits.MAX_PRIORITY}, not {value}"
        )
    return value


def append_event(
    stream_id: StreamId,
    type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    stream_type: str = "",
    tenant: str | None = None,
    expected_version: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    schema_version: int = 1,
    created_by: str = "",
    priority: int | None = None,
) -> Event:
    """Append one event to a stream and return it, saved.

    ``expected_version`` is the version the stream must be at (0: it must
    not exist yet); a stale one raises :class:`VersionConflict`. Without it,
    the event goes after whatever is there, also when other writers append
    to the stream at the same moment. ``priority`` (-100 to 100) overrides
    the priority of the runs the event starts; it is kept in the event's
    metadata (``kumiflow_priority``).
    """
    if priority is not None:
        metadata = {**(metadata or {}), PRIORITY_METADATA: check_priority(priority)}
    new = NewEvent(type, payload, metadata, schema_version)  # type: ignore[arg-type]
    return append_events(
        stream_id,
        [new],
        stream_type=stream_type,
        tenant=tenant,
        expected_version=expected_version,
        created_by=created_by,
    )[0]


def append_events(
    stream_id: StreamId,
    events: Iterable[NewEvent],
    *,
    stream_type: str = "",
    tenant: str | None = None,
    expected_version: int | None = None,
    created_by: str = "",
) -> list[Event]:
    """Append several events to one stream, all or none."""
    sid = check_stream_id(stream_id)
    tenant_id = resolve_tenant(tenant)
    if expected_version is not None and (
        not isinstance(expected_version, int) or isinstance(expected_version, bool)
    ):
        raise InvalidEvent(f"expected_version must be an integer: {expected_version!r}")
    if expected_version is not None and expected_version < 0:
        raise InvalidEvent(f"expected_version must not be negative: {expected_version}")
    if isinstance(events, NewEvent | str | Mapping):
        raise InvalidEvent("append_events() takes a list of NewEvent")
    checked = [_check_event(e) for e in events]
    if not checked:
        raise InvalidEvent("append_events() needs at least one event")
    check_text(stream_type, "stream_type", limits.STREAM_TYPE, empty=True)
    check_text(created_by, "created_by", limits.CREATED_BY, empty=True)
    if stream_type in ENGINE_STREAM_TYPES or sid.startswith(RESERVED_STREAM_PREFIXES):
        raise InvalidEvent(
            f"stream {sid!r} (stream type {stream_type!r}) is reserved for the workflow engine"
        )
    if sid in handled_types and checked[0].type not in handled_types:
        raise InvalidEvent(
            f"stream id {sid!r} is an event type this project handles, and the event type "
            f"{checked[0].type!r} is not: are the arguments swapped? "
            "The call is append_event(stream_id, type, payload)."
        )
    # Not ``store/db.retrying``, on purpose (docs/architecture.md, "One
    # mechanism each"): a version clash is a unique violation inside the
    # append's own savepoint, which rolls back cleanly, so the append runs
    # again also inside the caller's transaction (where ``retrying`` must give
    # up: a lost lock conflict aborts the whole transaction); and with an
    # ``expected_version`` it is the caller's VersionConflict, never retried.
    for attempt in range(1, MAX_APPEND_ATTEMPTS + 1):
        try:
            return _append_once(
                sid, tenant_id, checked, stream_type, created_by, expected_version, attempt > 1
            )
        except _Clash:
            if expected_version is not None:
                raise VersionConflict(sid, expected_version, _head(sid, tenant_id)[0]) from None
            logger.debug("stream %s: a concurrent append won (attempt %d); again", sid, attempt)
            # Back off a little, at random, so that many writers of one hot
            # stream stop meeting each other (bounded: 50 ms at most).
            time.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempt)))
    raise VersionConflict(sid, _head(sid, tenant_id)[0], None)


class _Clash(Exception):
    """Another writer inserted the version this append was about to take."""


def _head(sid: str, tenant_id: str, *, lock: bool = False) -> tuple[int, str]:
    """(version, stream type) of the tenant's stream's last event; (0, "") if it has none."""
    # A locking read sees the latest committed row also under REPEATABLE READ.
    row = rowsql.last_row(
        Event,
        ("version", "stream_type"),
        {"tenant_id": tenant_id, "stream_id": sid},
        using=db.alias(),
        lock=lock,
    )
    return (int(row[0]), str(row[1])) if row is not None else (0, "")


def _append_once(
    sid: str,
    tenant_id: str,
    checked: list[NewEvent],
    stream_type: str,
    created_by: str,
    expected_version: int | None,
    retrying: bool,
) -> list[Event]:
    """One attempt. The first reads the stream's head inside its INSERT where
    the database can (``db.reads_head_in_insert``: one statement); a retry, and
    MariaDB, read it first, a retry with a lock (the winner's row, also under
    REPEATABLE READ). The runs its receivers start or wake leave their
    savepoints' RELEASE to the append's (``db.atomic``)."""
    with db.atomic(takes_nested=True):
        fused = not retrying and len(checked) <= FUSED_APPEND_MAX and db.reads_head_in_insert()
        current = 0
        if not fused:
            current, head_type = _head(sid, tenant_id, lock=retrying)
            _check_head(sid, head_type, expected_version, current)
        now = clock.now()
        rows = [
            Event(
                tenant_id=tenant_id,
                stream_type=stream_type,
                stream_id=sid,
                version=current + i,  # fused: the INSERT numbers them after the head
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
            if fused:
                if not _insert_at_head(rows, sid, tenant_id, expected_version):
                    # The head refused it: say why, read as a retry reads it.
                    current, head_type = _head(sid, tenant_id)
                    _check_head(sid, head_type, expected_version, current)
                    raise _Clash  # the head moved between the two: another writer won
            else:
                insert(rows)
        except IntegrityError as exc:
            if is_version_clash(exc):
                raise _Clash from exc
            raise
        notify(rows)
    return rows


def _check_head(sid: str, head_type: str, expected_version: int | None, current: int) -> None:
    """Refuse an append to an engine stream, or at a stale ``expected_version``."""
    if head_type in ENGINE_STREAM_TYPES:
        raise InvalidEvent(
            f"stream {sid!r} is the engine's own ({head_type}); applications cannot append to it"
        )
    if expected_version is not None and expected_version != current:
        raise VersionConflict(sid, expected_version, current)


def _insert_at_head(
    rows: list[Event], sid: str, tenant_id: str, expected_version: int | None
) -> bool:
    """Insert ``rows`` after the stream's head, read by the INSERT itself;
    False when the head is an engine stream's or not at ``expected_version``."""
    return rowsql.insert_after_head(
        Event,
        rows,
        using=db.alias(),
        counter="version",
        group={"tenant_id": tenant_id, "stream_id": sid},
        refused=("stream_type", _ENGINE_TYPES),
        expected=expected_version,
    )


def insert(rows: Sequence[Event], using: str | None = None) -> None:
    """Insert prepared events (positions are filled in). The store's only INSERT."""
    using = using or db.alias()
    if connections[using].features.can_return_rows_from_bulk_insert:
        rowsql.insert(Event, rows, using=using, return_pk=True)
    else:  # pragma: no cover - MySQL without RETURNING
        with allow_writes():
            for row in rows:
                row.save(force_insert=True, using=using)


def notify(rows: Sequence[Event]) -> None:
    """Send ``event_appended`` for each inserted event, in order."""
    for row in rows:
        event_appended.send(sender=Event, event=row)


def load_stream(
    stream_id: StreamId, *, tenant: str | None = None, after_version: int = 0
) -> list[Event]:
    """A stream's events of one tenant, in version order."""
    qs = Event.objects.for_stream(check_stream_id(stream_id), resolve_tenant(tenant))
    if after_version:
        qs = qs.filter(version__gt=after_version)
    return list(qs)


def stream_version(stream_id: StreamId, *, tenant: str | None = None) -> int:
    """The version of a stream's last event (0 for a stream that does not exist)."""
    last = (
        Event.objects.filter(stream_id=check_stream_id(stream_id), tenant_id=resolve_tenant(tenant))
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


def erase_stream(stream_id: StreamId, *, tenant: str | None = None) -> int:
    """Delete every event of one stream: the one exception to append-only.

    Meant for erasure of personal data. Runs whose trigger event is erased
    fail with reason ``trigger_event_unavailable`` when they next resume.
    Returns the number of events deleted.
    """
    sid, tenant_id = check_stream_id(stream_id), resolve_tenant(tenant)
    with erasure_permit():
        deleted, _ = Event.objects.filter(stream_id=sid, tenant_id=tenant_id).delete()
    logger.warning("erased stream %s of tenant %s (%d events)", sid, tenant_id, deleted)
    return deleted
