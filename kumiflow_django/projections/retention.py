"""Retention: deleting finished runs with everything they own, and putting them back.

``manage.py kumiflow_retention`` and ``kumiflow_restore`` are thin shells
around :class:`Retention` and :class:`Restore`.

**What goes.** A run that finished (completed, failed or cancelled) before
the cut-off goes with its stream and every stream it owns
(:data:`owned_streams`: the outbox rows it requested, and whatever the
engine adds later), events and rows together, unless one of them still has
work to do (a delivery not yet made): such a run stays until a later pass.
Events of other streams stay, also the trigger event that started the run:
it belongs to your domain. User projections are not told: a projection of
the engine's events keeps what it has until ``kumiflow_rebuild``, which then
gives every table as it was, minus the runs deleted.

**How.** In batches of ``batch_size`` runs, each one short transaction: the
runs are picked by the ``(status, started_at)`` index in key order (a run
finishes after it starts, so ``started_at`` bounds the scan), locked with
``SKIP LOCKED`` (a run someone is working on is passed over, never waited
for), checked again, optionally written to the archive (forced to disk
before the deletion commits, taken back if it does not), then deleted with
the log's erasure permit. One retention process at a time: a lock row
(:mod:`kumiflow_django.store.locks`) renewed by every batch's transaction.

**Putting back.** :class:`Restore` reads archive files and puts every event
that is not in the log back at its own position (see
:mod:`kumiflow_django.store.archive`), then folds the rows of the streams it
touched, as a rebuild would. Restoring a file twice changes nothing. A run
the log cannot take back (a position or a stream version taken meanwhile,
an idempotency key a newer run of the workflow holds) is reported, and the
rest of the file is restored.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import IntegrityError
from django.db.models import BooleanField, Expression, ExpressionWrapper, Q, QuerySet, Value

from kumiflow_django.conf import settings
from kumiflow_django.projections import attributes as attribute_index
from kumiflow_django.projections.dispatches import DELIVERABLE, DISPATCHES
from kumiflow_django.projections.runs import FINISHED, RUNS, WorkflowRun
from kumiflow_django.projections.stream import Stream
from kumiflow_django.projections.tasks import OPEN as OPEN_TASKS
from kumiflow_django.projections.tasks import TASKS
from kumiflow_django.projections.waits import RunWait
from kumiflow_django.store import archive, clock, db, locks
from kumiflow_django.store.db import for_update
from kumiflow_django.store.immutability import erasure_permit
from kumiflow_django.store.models import Event
from kumiflow_django.store.registry import Registry
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.retention")

#: The lock row that lets one retention process in at a time.
LOCK_NAME = "kumiflow.retention"
#: The lock's lease: a retention process that died frees it after this long.
LOCK_SECONDS = 300.0
#: Largest ``IN (…)`` list of one statement.
_CHUNK = 500


# -- what a run owns ----------------------------------------------------------


@dataclass(frozen=True)
class OwnedStream:
    """A kind of stream that runs own: its rows name their run in ``run_field``,
    and go (and come back) with it. Rows matching ``keeps_run`` still have
    work to do: their run stays until they are done. ``keeps_run`` is a
    condition on the row's own columns (no relation): retention reads it in
    the statement that locks the rows."""

    name: str
    stream: Stream[Any]
    run_field: str = "run_id"
    keeps_run: Q | None = None


class OwnedStreams(Registry[OwnedStream]):
    what = "stream kind owned by runs"


#: Things a run owns besides its own stream. A new kind of per-run stream
#: (task rows, child links) registers itself here, and retention, the archive
#: and restore handle it with the run.
owned_streams = OwnedStreams()
owned_streams.add(
    "dispatches", OwnedStream("dispatches", DISPATCHES, keeps_run=Q(status__in=DELIVERABLE))
)
# A task still pending or running keeps its run (a finished run has none: its
# end cancels them; the guard is for a run finished by hand in the database).
owned_streams.add("tasks", OwnedStream("tasks", TASKS, keeps_run=Q(status__in=OPEN_TASKS)))


def _stream_kinds() -> dict[str, Stream[Any]]:
    kinds: dict[str, Stream[Any]] = {RUNS.stream_type: RUNS}
    for owned in owned_streams.values():
        kinds[owned.stream.stream_type] = owned.stream
    return kinds


def _chunks[T](items: Sequence[T], size: int = _CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def default_owner() -> str:
    """How a retention process names itself in the lock row and the logs."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"


# -- deleting -----------------------------------------------------------------


class LockLost(Exception):
    """Another process took the retention lock over (this one's lease ran out)."""


@dataclass
class RetentionReport:
    runs: int = 0
    events: int = 0
    #: Rows of owned streams deleted, by kind.
    owned: dict[str, int] = field(default_factory=dict)
    #: Runs that finished before the cut-off but still own unfinished work.
    kept: int = 0
    batches: int = 0
    seconds: float = 0.0
    archive: Path | None = None

    @property
    def rows(self) -> int:
        """Every row deleted: events, runs and owned rows."""
        return self.events + self.runs + sum(self.owned.values())


@dataclass(frozen=True)
class _Run:
    id: uuid.UUID
    tenant_id: str
    workflow: str
    status: str
    started_at: datetime
    finished_at: datetime


class Retention:
    """Deletes the runs that finished before ``finished_before`` (see the module)."""

    def __init__(
        self,
        finished_before: datetime,
        *,
        batch_size: int | None = None,
        archive_dir: Path | None = None,
        pause: float | None = None,
        owner: str | None = None,
    ) -> None:
        """``batch_size`` and ``pause``: ``KUMIFLOW_RETENTION_BATCH_SIZE`` and
        ``KUMIFLOW_RETENTION_PAUSE`` unless given."""
        batch_size = settings.RETENTION_BATCH_SIZE if batch_size is None else batch_size
        pause = settings.RETENTION_PAUSE if pause is None else pause
        if pause < 0:
            raise ValueError(f"pause must not be negative: {pause}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1: {batch_size}")
        self.cutoff = finished_before
        self.batch_size = batch_size
        self.archive_dir = archive_dir
        self.pause = pause
        self.owner = owner or default_owner()
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Finish the batch at hand, then return (a signal handler's call)."""
        self._stopping.set()

    def _finished(self, status: str) -> QuerySet[WorkflowRun, WorkflowRun]:
        return WorkflowRun.objects.filter(
            status=status, started_at__lt=self.cutoff, finished_at__lt=self.cutoff
        )

    def count(self) -> int:
        """How many runs a pass would delete now (``--dry-run``)."""
        total = 0
        for status in FINISHED:
            qs = self._finished(status)
            for owned in owned_streams.values():
                if owned.keeps_run is not None:
                    busy = owned.stream.model._default_manager.filter(owned.keeps_run).exclude(
                        **{owned.run_field: None}  # NOT IN with a NULL would exclude every run
                    )
                    qs = qs.exclude(id__in=busy.values(owned.run_field))
            total += qs.count()
        return total

    def run(self) -> RetentionReport:
        """One pass over every finished run older than the cut-off."""
        report = RetentionReport(owned=dict.fromkeys(owned_streams, 0))
        began = time.monotonic()
        locks.acquire(LOCK_NAME, self.owner, LOCK_SECONDS)
        writer = None
        try:
            writer = self._writer()
            report.archive = writer.path if writer else None
            for status in FINISHED:
                after: tuple[datetime, uuid.UUID] | None = None
                while not self._stopping.is_set():
                    after = self._batch(status, after, writer, report)
                    if after is None:
                        break
                    if self.pause:
                        self._stopping.wait(self.pause)
        finally:
            locks.release(LOCK_NAME, self.owner)
            if writer is not None:
                writer.close()
                if not writer.records:
                    writer.path.unlink()
                    report.archive = None
        report.seconds = time.monotonic() - began
        logger.info(
            "retention: %d runs (%d events) finished before %s deleted in %.1f s; %d kept",
            report.runs,
            report.events,
            self.cutoff.isoformat(),
            report.seconds,
            report.kept,
        )
        return report

    def _writer(self) -> archive.ArchiveWriter | None:
        if self.archive_dir is None:
            return None
        stamp = clock.now().strftime("%Y%m%dT%H%M%SZ")
        path = self.archive_dir / f"kumiflow-runs-{stamp}-{self.owner.replace(':', '-')}.jsonl.gz"
        header = {
            "created_at": clock.now().isoformat(),
            "finished_before": self.cutoff.isoformat(),
            "database": db.connection().vendor,
            "owned": sorted(owned_streams),
        }
        return archive.ArchiveWriter(path, header)

    def _batch(
        self,
        status: str,
        after: tuple[datetime, uuid.UUID] | None,
        writer: archive.ArchiveWriter | None,
        report: RetentionReport,
    ) -> tuple[datetime, uuid.UUID] | None:
        """Delete one batch of runs of ``status`` after the key ``after``; return
        the key to go on from, None when there are no more."""
        wrote = False
        try:
            with db.atomic():
                if not locks.renew(LOCK_NAME, self.owner, LOCK_SECONDS):
                    raise LockLost(f"another process took the lock {LOCK_NAME!r} over")
                runs = self._pick(status, after)
                if not runs:
                    return None
                ids = [run.id for run in runs]
                owned, kept = self._owned(ids)
                going = [run for run in runs if run.id not in kept]
                # A stream is (tenant, id); the streams a run owns are in its tenant.
                tenant = {run.id: run.tenant_id for run in runs}
                streams = [(run.tenant_id, str(run.id)) for run in going]
                for rows in owned.values():
                    streams += [
                        (tenant[run_id], str(pk)) for pk, run_id in rows if run_id not in kept
                    ]
                if writer is not None and going:
                    writer.write(self._records(going, owned, streams))
                    wrote = True
                events = self._delete(going, owned, kept, streams, report)
        except BaseException:
            if wrote and writer is not None:
                writer.undo()
            raise
        report.batches += 1
        report.runs += len(going)
        report.events += events
        report.kept += len(kept)
        logger.info(
            "retention: batch %d: %d %s runs deleted (%d events), %d kept",
            report.batches,
            len(going),
            status,
            events,
            len(kept),
        )
        last = runs[-1]
        return (last.started_at, last.id)

    def _pick(self, status: str, after: tuple[datetime, uuid.UUID] | None) -> list[_Run]:
        qs = self._finished(status)
        if after is not None:
            started, run_id = after
            qs = qs.filter(started_at__gte=started).filter(
                Q(started_at__gt=started) | Q(id__gt=run_id)
            )
        qs = for_update(qs.order_by("started_at", "id"), skip_locked=True)
        columns = ("id", "tenant_id", "workflow", "status", "started_at", "finished_at")
        return [_Run(*row) for row in qs.values_list(*columns)[: self.batch_size]]

    def _owned(
        self, ids: Sequence[uuid.UUID]
    ) -> tuple[dict[str, list[tuple[Any, uuid.UUID]]], set[uuid.UUID]]:
        """The owned rows of these runs (locked), by kind; and the runs they keep.

        One statement per kind and chunk: whether a row keeps its run is read
        with the row, under its lock (a second read of the same rows would
        cost a round trip with the same ``IN`` list)."""
        owned: dict[str, list[tuple[Any, uuid.UUID]]] = {}
        kept: set[uuid.UUID] = set()
        for name, kind in owned_streams.items():
            manager = kind.stream.model._default_manager
            busy: Expression = (
                Value(False)
                if kind.keeps_run is None
                else ExpressionWrapper(kind.keeps_run, output_field=BooleanField())
            )
            rows: list[tuple[Any, uuid.UUID]] = []
            for chunk in _chunks(ids):
                qs = manager.filter(**{f"{kind.run_field}__in": chunk}).order_by("pk")
                locked = for_update(qs.annotate(kumiflow_keeps_run=busy))
                columns = ("pk", kind.run_field, "kumiflow_keeps_run")
                for pk, run_id, keeps in locked.values_list(*columns):
                    rows.append((pk, run_id))
                    if keeps:
                        kept.add(run_id)
            owned[name] = rows
        return owned, kept

    def _records(
        self,
        going: Sequence[_Run],
        owned: dict[str, list[tuple[Any, uuid.UUID]]],
        streams: Sequence[tuple[str, str]],
    ) -> list[dict[str, Any]]:
        """One archive record per run: the run, and every event of its streams."""
        run_of = {str(run.id): str(run.id) for run in going}
        for rows in owned.values():
            run_of.update({str(pk): str(run_id) for pk, run_id in rows})
        events: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for chunk in _chunks(streams):
            for event in Event.objects.of_streams(chunk).order_by("position"):
                events[run_of[event.stream_id]].append(archive.event_to_dict(event))
        return [
            {
                "run": str(run.id),
                "tenant": run.tenant_id,
                "workflow": run.workflow,
                "status": run.status,
                "finished_at": run.finished_at.isoformat(),
                "events": sorted(events[str(run.id)], key=lambda e: e["position"]),
            }
            for run in going
        ]

    def _delete(
        self,
        going: Sequence[_Run],
        owned: dict[str, list[tuple[Any, uuid.UUID]]],
        kept: set[uuid.UUID],
        streams: Sequence[tuple[str, str]],
        report: RetentionReport,
    ) -> int:
        events = 0
        with erasure_permit():
            for chunk in _chunks(streams):
                events += Event.objects.of_streams(chunk).delete()[0]
        for name, rows in owned.items():
            pks = [pk for pk, run_id in rows if run_id not in kept]
            manager = owned_streams.get(name).stream.model._default_manager
            for part in _chunks(pks):
                report.owned[name] += manager.filter(pk__in=part).delete()[0]
        for ids in _chunks([run.id for run in going]):
            attribute_index.forget(ids)
            # A finished run has no wait; a row an older release left (a child
            # cancelled without its waits) must not outlive its run.
            RunWait.objects.filter(run_id__in=ids).delete()
            WorkflowRun.objects.filter(pk__in=ids).delete()
        return events


# -- putting back -------------------------------------------------------------


@dataclass
class RestoreReport:
    runs: int = 0
    events: int = 0
    #: Runs whose every event was in the log already.
    present: int = 0
    #: Runs the log could not take back, with the reason.
    conflicts: list[str] = field(default_factory=list)


class Restore:
    """Puts archived runs back (see the module); ``batch_size`` runs per transaction."""

    def __init__(self, *, batch_size: int = 200) -> None:
        self.batch_size = batch_size
        self.report = RestoreReport()

    def restore(self, paths: Iterable[Path]) -> RestoreReport:
        for path in paths:
            batch: list[dict[str, Any]] = []
            for record in archive.read_archive(path):
                batch.append(record)
                if len(batch) >= self.batch_size:
                    self._batch(batch)
                    batch = []
            if batch:
                self._batch(batch)
            logger.info("restore: %s read", path)
        return self.report

    def _batch(self, records: Sequence[dict[str, Any]]) -> None:
        counts: list[int | None]
        try:
            with db.atomic():
                counts = [self._put_back(record) for record in records]
        except (IntegrityError, archive.ArchiveError):
            counts = [self._alone(record) for record in records]  # which one?
        for inserted in counts:
            if inserted is None:
                continue
            if inserted:
                self.report.runs += 1
                self.report.events += inserted
            else:
                self.report.present += 1

    def _alone(self, record: dict[str, Any]) -> int | None:
        try:
            with db.atomic():
                return self._put_back(record)
        except (IntegrityError, archive.ArchiveError) as exc:
            self.report.conflicts.append(f"run {record.get('run')}: {exc}")
            logger.warning("restore: run %s not restored: %s", record.get("run"), exc)
            return None

    def _put_back(self, record: dict[str, Any]) -> int:
        """Put one run back; return how many of its events were missing."""
        kinds = _stream_kinds()
        events = [archive.event_from_dict(data) for data in record["events"]]
        unknown = {e.stream_type for e in events} - set(kinds)
        if unknown:
            raise archive.ArchiveError(f"no stream kind {sorted(unknown)} is registered here")
        inserted = archive.put_back(events)
        if inserted:
            refold({(e.tenant_id, e.stream_id) for e in inserted}, kinds)
        return len(inserted)


def refold(streams: Iterable[tuple[str, str]], kinds: dict[str, Stream[Any]] | None = None) -> None:
    """Replace the rows of these streams, each ``(tenant, stream id)``, by the fold
    of their events in the log."""
    kinds = kinds or _stream_kinds()
    keys = sorted(streams)
    rows: dict[Stream[Any], list[Any]] = defaultdict(list)
    for chunk in _chunks(keys):
        current: Any = None
        current_key: tuple[str, str] | None = None
        kind: Stream[Any] | None = None
        events = Event.objects.of_streams(chunk).order_by("tenant_id", "stream_id", "version")
        for event in events:
            if (event.tenant_id, event.stream_id) != current_key:
                if kind is not None:
                    rows[kind].append(current)
                current_key = (event.tenant_id, event.stream_id)
                current, kind = None, kinds[event.stream_type]
            assert kind is not None
            current = kind.fold(current, event)
        if kind is not None:
            rows[kind].append(current)
    for kind, folded in rows.items():
        manager = kind.model._default_manager
        manager.filter(pk__in=[row.pk for row in folded]).delete()
        manager.bulk_create(folded)
        if kind is RUNS:
            attribute_index.reindex(folded)
