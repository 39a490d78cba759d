"""The one way the engine writes its streams: append, fold, write, announce.

Runs, dispatches and cron schedules are each a stream of events and a row
that folds them. Every change of one of them is a :class:`Change`: events
at the stream's next versions, folded into the row in memory as they are
added. :func:`write` then writes a set of changes together:

1. every new event, of every stream, in one ``INSERT`` (the log's unique
   ``(tenant_id, stream_id, version)`` is the guard: a concurrent writer
   makes it fail with a version clash);
2. every new row, one ``INSERT`` per model;
3. every changed row with one ``UPDATE`` of the columns that changed,
   conditional on the version it was read at (:class:`StaleRow` when
   another writer moved it on first);
4. ``event_appended`` for every event, in order, so projections, triggers
   and awaited-event wake-ups act in the same transaction.

On PostgreSQL 1-3 are one statement (data-modifying ``WITH``,
``sql.write_together``): one round trip for a segment's events and its
run's row, with the same rows written and the same errors raised.

Call it inside a transaction: the caller decides its bounds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import models

from kumiflow_django.store import db, sql
from kumiflow_django.store.log import insert, notify
from kumiflow_django.store.models import Event
from kumiflow_django.store.payloads import Payload


class StaleRow(Exception):  # noqa: N818 - the condition, as the engine names it
    """The row moved on since it was read: another writer got there first."""


@dataclass(frozen=True)
class Stream[M: models.Model]:
    """One kind of engine stream: its stream type, the model of its rows (with a
    ``version`` field: the stream version the row has folded), and its fold."""

    stream_type: str
    model: type[M]
    fold: Callable[[M | None, Event], M]
    #: Rows derived from the stream's rows (a run's search attribute index),
    #: written after them in the same transaction: called with the changes.
    after_write: Callable[[list[Change[M]]], None] | None = None


class Change[M: models.Model]:
    """New events of one stream, and the row they fold into (None: a new stream)."""

    def __init__(
        self,
        stream: Stream[M],
        stream_id: str,
        tenant: str,
        row: M | None,
        *,
        now: datetime,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.stream = stream
        self.stream_id = stream_id
        self.tenant = tenant
        self.row = row
        self.now = now
        self.metadata = metadata or {}
        self.new = row is None
        self.base_version = 0 if row is None else int(row.version)  # type: ignore[attr-defined]
        self.before = None if row is None else sql.snapshot(row)
        self.events: list[Event] = []

    @property
    def version(self) -> int:
        return self.base_version + len(self.events)

    def add(self, type_: str, payload: Payload, *, created_by: str = "") -> Event:
        """Append an event at the stream's next version and fold it into the row.

        ``created_by`` names the operator of an operator action (checked by
        :func:`kumiflow_django.store.audit.check_operator`)."""
        event = Event(
            tenant_id=self.tenant,
            stream_type=self.stream.stream_type,
            stream_id=self.stream_id,
            version=self.version + 1,
            type=type_,
            payload=payload,
            metadata=dict(self.metadata),
            created_at=self.now,
            created_by=created_by,
        )
        # The folds reassign fields: the snapshot taken at the start stays intact.
        self.row = self.stream.fold(self.row, event)
        self.events.append(event)
        return event

    @property
    def saved(self) -> M:
        """The row as the change leaves it (after at least one event)."""
        assert self.row is not None, "a change without events has no row"
        return self.row


def write(changes: Iterable[Change[Any]]) -> None:
    """Write the changes in one go (see the module docstring)."""
    pending = [c for c in changes if c.events]
    using = db.alias()
    events = [event for change in pending for event in change.events]
    new_rows: dict[type[models.Model], list[models.Model]] = {}
    for change in pending:
        if change.new:
            new_rows.setdefault(change.stream.model, []).append(change.saved)
    updates = [_update(change) for change in pending if not change.new]
    inserts: list[tuple[type[models.Model], Sequence[models.Model], bool]] = [(Event, events, True)]
    inserts += [(model, rows, False) for model, rows in new_rows.items()]
    if db.writes_in_one_statement(using) and sql.fits_one_statement(inserts, updates):
        counts = sql.write_together(inserts, updates, using=using)
    else:
        insert(events, using=using)
        for model, rows in new_rows.items():
            sql.insert(model, rows, using=using, return_pk=False)
        counts = [sql.update_changed(u.obj, u.before, where=u.where, using=using) for u in updates]
    for update, count in zip(updates, counts, strict=True):
        if not count:
            row = update.obj
            raise StaleRow(
                f"{row._meta.model_name} {row.pk} is no longer at version {update.where['version']}"
            )
    derived: dict[Callable[[list[Change[Any]]], None], list[Change[Any]]] = {}
    for change in pending:
        if change.stream.after_write is not None:
            derived.setdefault(change.stream.after_write, []).append(change)
    for after_write, group in derived.items():
        after_write(group)
    notify(events)


def _update(change: Change[Any]) -> sql.Update:
    """The UPDATE of a changed row, conditional on the version it was read at."""
    row = change.saved
    assert change.before is not None
    key = row._meta.pk.attname
    return sql.Update(row, change.before, {key: getattr(row, key), "version": change.base_version})


def write_one[M: models.Model](change: Change[M]) -> M:
    """Write one change; return its row."""
    write([change])
    return change.saved
