"""Archives of the log: events written out verbatim as gzip JSON Lines, and put back.

An archive file is a sequence of gzip members (``gzip`` and ``zcat`` read
them as one stream). The first line is a header; every other line is one
*record*: a JSON object whose ``events`` are the log's events with every
column as stored, the position included. Each call of
:meth:`ArchiveWriter.write` adds one member and forces it to disk before it
returns, so the caller can delete what it archived in the transaction it
commits next; :meth:`ArchiveWriter.undo` takes the member back if that
transaction fails.

Putting events back (:func:`put_back`) keeps their positions: positions are
the log's global order, and payloads refer to them (a run's trigger, the
event it matched). A position freed by a deletion is never handed out again
by the database (PostgreSQL's identity sequence, MariaDB's auto-increment
counter, SQLite's ``AUTOINCREMENT``), so in the database the events came
from it is free for them; an event already in the log (same event id) is
skipped, so putting an archive back twice changes nothing.
"""

from __future__ import annotations

import gzip
import json
import os
import uuid
import zlib
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from kumiflow_django.store import db
from kumiflow_django.store.models import Event, allow_writes
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.store.archive")

#: The header's ``format``; readers refuse another.
FORMAT = "kumiflow-archive"
#: The version of the record layout; readers refuse a newer one.
VERSION = 1

_FIELDS = (
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


class ArchiveError(Exception):
    """The file is not a kumiflow archive this version can read."""


def event_to_dict(event: Event) -> dict[str, Any]:
    """Every column of ``event``, as JSON values."""
    data = {name: getattr(event, name) for name in _FIELDS}
    data["event_id"] = str(event.event_id)
    data["created_at"] = event.created_at.isoformat()
    return data


def event_from_dict(data: dict[str, Any]) -> Event:
    """The :class:`Event` an archived line stands for (not saved)."""
    values = {name: data[name] for name in _FIELDS}
    values["event_id"] = uuid.UUID(values["event_id"])
    values["created_at"] = datetime.fromisoformat(values["created_at"])
    return Event(**values)


def _line(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


class ArchiveWriter:
    """Appends records to a new archive file, one durable gzip member per batch."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] = path.open("xb")  # never overwrite an archive
        self._undo_to: int | None = None
        self._last = 0
        self.records = 0
        self._member([{"format": FORMAT, "version": VERSION, **header}])
        self._undo_to = None

    def write(self, records: Sequence[dict[str, Any]]) -> None:
        """Add the records as one member and force it to disk."""
        start = self._file.tell()
        try:
            self._member(records)
        except BaseException:
            self._truncate(start)
            raise
        self._undo_to = start
        self.records += len(records)
        self._last = len(records)

    def undo(self) -> None:
        """Take back the last :meth:`write` (its deletion did not commit)."""
        if self._undo_to is not None:
            self._truncate(self._undo_to)
            self.records -= self._last
            self._undo_to = None

    def close(self) -> None:
        self._file.close()

    def _member(self, lines: Sequence[dict[str, Any]]) -> None:
        with gzip.GzipFile(fileobj=self._file, mode="wb", mtime=0) as member:
            for line in lines:
                member.write(_line(line))
        self._file.flush()
        os.fsync(self._file.fileno())

    def _truncate(self, size: int) -> None:
        self._file.seek(size)
        self._file.truncate()
        self._file.flush()
        os.fsync(self._file.fileno())


def read_archive(path: Path) -> Iterator[dict[str, Any]]:
    """The records of an archive file, after checking its header.

    A file that ends inside a member (its writer stopped while writing it,
    so the records in it were not deleted) ends the records with a warning.
    """
    with gzip.open(path, "rb") as stream:
        try:
            header = json.loads(stream.readline() or b"null")
        except (OSError, ValueError) as exc:
            raise ArchiveError(f"{path}: not a kumiflow archive ({exc})") from exc
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ArchiveError(f"{path}: not a kumiflow archive")
        if not isinstance(header.get("version"), int) or header["version"] > VERSION:
            raise ArchiveError(
                f"{path}: archive version {header.get('version')!r}; this version reads "
                f"up to {VERSION}"
            )
        while True:
            try:
                raw = stream.readline()
            except (EOFError, zlib.error) as exc:
                logger.warning("%s ends inside a batch (%s): its runs were not deleted", path, exc)
                return
            if not raw:
                return
            if not raw.endswith(b"\n"):
                logger.warning("%s ends inside a record: its runs were not deleted", path)
                return
            yield json.loads(raw)


def put_back(events: Sequence[Event]) -> list[Event]:
    """Insert the events that are not in the log (by event id), at their own
    positions, in the caller's transaction; return those inserted.

    A position or a stream version another event holds makes the insert
    fail with ``IntegrityError``: the log moved on in a way the archive
    cannot join, and the caller decides what to report.
    """
    if not events:
        return []
    present = set(
        Event.objects.filter(event_id__in=[e.event_id for e in events]).values_list(
            "event_id", flat=True
        )
    )
    missing = [e for e in events if e.event_id not in present]
    if missing:
        with allow_writes():
            Event.objects.bulk_create(missing, batch_size=500)
        _advance_sequence(max(e.position for e in missing))
    return missing


def _advance_sequence(position: int) -> None:
    """Keep new appends from taking an inserted position (PostgreSQL only:
    MariaDB's and SQLite's counters move past an inserted value by themselves).

    Only needed when the archive comes from another database, whose
    positions are ahead of this one's sequence.
    """
    connection = db.connection()
    if not db.explicit_ids_leave_sequence_behind():
        return
    table = Event._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence(%s, %s)", [table, "position"])
        (sequence,) = cursor.fetchone()
        # The sequence's name comes from the catalog, quoted by PostgreSQL.
        cursor.execute(f"SELECT last_value FROM {sequence}")  # noqa: S608
        (last,) = cursor.fetchone()
        if last < position:
            cursor.execute("SELECT setval(%s, %s)", [sequence, position])
            logger.warning(
                "the log's position sequence was behind the archive: moved to %d", position
            )
