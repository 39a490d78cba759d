"""The resume loop: finds due runs through the ``wake_at`` index and resumes them.

Each run is resumed in its own transaction, claimed with ``SELECT … FOR
UPDATE SKIP LOCKED`` where the database has it and guarded everywhere by the
run stream's version: any number of loops may run against one database.

Before the segment, the loop also writes a lease on the row (worker id and
an expiry) in a short transaction of its own; the segment clears it when it
commits. A lease left behind means the worker died in the middle of the
segment (its transaction was rolled back): once the lease has expired,
another worker resumes the run and records the recovery in the run's
stream, where the admin shows it.

Every :data:`STRANDED_SWEEP_SECONDS` a pass also looks for parked runs whose
key has a free slot (a lost wake: :class:`~kumiflow_django.flow.admission.StrandedSweep`).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db.models import F, Q, QuerySet, Window
from django.db.models.functions import RowNumber

from kumiflow_django.conf import settings
from kumiflow_django.definition import serving
from kumiflow_django.definition.durations import isoformat
from kumiflow_django.engine import unserved
from kumiflow_django.engine.resuming import resume_run
from kumiflow_django.flow.admission import StrandedSweep
from kumiflow_django.projections.claims import claim, unclaimed
from kumiflow_django.projections.lock_order import Placed
from kumiflow_django.projections.runs import WorkflowRun, WorkflowRunQuerySet
from kumiflow_django.store import clock, db, leases, sql
from kumiflow_django.store.db import is_transient
from kumiflow_django.store.payloads import Recovered
from kumiflow_django.store.telemetry import get_logger, log_fields
from kumiflow_django.store.wakeups import WorkKind
from kumiflow_django.workers.loop import Loop

logger = get_logger("kumiflow_django.resume")


class Due(NamedTuple):
    """A due run as the due query reads it (one indexed range read)."""

    id: uuid.UUID
    version: int
    lease_owner: str
    lease_until: datetime | None


class Claimed(NamedTuple):
    """A run leased to this worker: the version it was due at, the expired
    lease of another worker it takes over, if any (a recovery), and where it
    is in the lock order (read by the lease: its resume does not read it again)."""

    id: uuid.UUID
    version: int
    recovered: Recovered | None
    placed: Placed


class _Leased(NamedTuple):
    """A row as the lease reads it under its lock."""

    id: uuid.UUID
    version: int
    lease_owner: str
    lease_until: datetime | None
    depth: int
    parent_id: uuid.UUID | None
    parent_waits: bool


#: Seconds between two looks for parked runs nobody would wake (the first pass looks).
STRANDED_SWEEP_SECONDS = 30.0

#: Runs leased per statement: few enough that a lease does not run out while
#: its run waits for the ones before it.
CLAIM_CHUNK = 10
_COLUMNS = (
    "id",
    "version",
    "lease_owner",
    "lease_until",
    "priority",
    "tenant_id",
    "wake_at",
    "started_at",
    "since_position",
)


def due_runs(now: datetime, limit: int, *, free: bool = False, only: Q | None = None) -> list[Due]:
    """Up to ``limit`` due runs in the order they are claimed: higher priority
    first; within a priority, tenants take turns (weighted by
    ``KUMIFLOW_TENANT_WEIGHTS``); then earlier wake time first.

    One indexed range read (``wake_at``) of at most ``limit + 1`` rows when
    everything due fits in the batch. Only a backlog larger than the batch
    ranks the whole due set in the database (a window function over the
    ``wake_at`` range): then a tenant's 10 runs behind another's 10,000 are in
    the next batch, not 1,000 batches later. ``free``: only runs no worker
    holds a lease on. ``only``: the runs this process may claim
    (:func:`~kumiflow_django.engine.unserved.claim_filter`).
    """
    # In the index's order only (no sort of the due range); ties are broken below.
    probe = sql.values(
        ("due runs", free, only, limit),
        lambda: _due(sql.NOW, free, only).order_by("wake_at").values_list(*_COLUMNS)[: limit + 1],
        using=sql.routed(WorkflowRun),
        now=now,
    )
    if len(probe) <= limit:
        return _fair(probe)[:limit]
    due = _due(now, free, only)
    weights = settings.TENANT_WEIGHTS
    heaviest = max([1, *weights.values()])
    ranked = due.annotate(
        turn=Window(
            RowNumber(),
            partition_by=[F("priority"), F("tenant_id")],
            order_by=[F("wake_at").asc(), F("started_at").asc(), F("since_position").asc()],
        )
    ).order_by("-priority", "turn", "wake_at", "started_at", "since_position")
    return _fair(list(ranked.values_list(*_COLUMNS)[: limit * heaviest]))[:limit]


def _due(now: datetime | sql.Slot, free: bool, only: Q | None) -> WorkflowRunQuerySet:
    due = WorkflowRun.objects.due(now)
    if free:
        due = due.filter(leases.free_q(now))
    if only is not None:
        due = due.filter(only)
    return due


def _leasing(count: int, only: Q) -> QuerySet[WorkflowRun, Any]:
    """The lease's locking read of ``count`` due runs (slots ``id0``…), if
    still due and free: not "or leased by this worker", since the threads of
    one worker share its id, and one would take the runs another has just leased."""
    pk = WorkflowRun._meta.pk
    assert pk is not None
    ids: Any = [sql.Slot(f"id{i}", pk) for i in range(count)]
    rows = _due(sql.NOW, True, only).filter(pk__in=ids)
    return unclaimed(rows).values_list(*_Leased._fields)


def _fair(rows: list[tuple[Any, ...]]) -> list[Due]:
    """``rows`` (id, version, lease, lease until, priority, tenant, wake at,
    start) in claim order: priority, then the tenant's weighted turn, then
    wake time (then start: runs woken together go in the order they came)."""
    weights = settings.TENANT_WEIGHTS
    turns: dict[tuple[int, str], int] = {}
    keyed = []
    for row in sorted(rows, key=lambda r: (-r[4], r[6], r[7], r[8])):
        group = (row[4], row[5])
        turns[group] = turns.get(group, 0) + 1
        keyed.append(((-row[4], turns[group] / weights.get(row[5], 1), *row[6:9]), row))
    keyed.sort(key=lambda item: item[0])
    return [Due(*row[:4]) for _, row in keyed]


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"


class ResumeLoop(Loop):
    name = "resume"
    kinds = (WorkKind.RESUME,)

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        batch_size: int = 100,
        max_interval: float = 5.0,
        threads: int | None = None,
        settle_takeovers: bool = False,
    ) -> None:
        super().__init__(batch_size=batch_size, max_interval=max_interval)
        self.worker_id = worker_id or default_worker_id()
        #: Take runs over from definitions no live worker serves only once up
        #: for a heartbeat's staleness (a worker process: see :meth:`_settled`).
        self.settle_takeovers = settle_takeovers
        self.threads = threads or settings.RESUME_THREADS
        self._pool: ThreadPoolExecutor | None = None
        self._stranded = StrandedSweep()
        self._next_sweep = float("-inf")
        self._next_unserved = float("-inf")
        self._born = time.monotonic()

    def sweep_stranded(self) -> int:
        """Wake parked runs whose key has a free slot, at most every
        :data:`STRANDED_SWEEP_SECONDS`. A database that is away fails the pass,
        as the due query would; anything else is logged and the resumes go on."""
        if time.monotonic() < self._next_sweep:
            return 0
        self._next_sweep = time.monotonic() + STRANDED_SWEEP_SECONDS
        try:
            return self._stranded()
        except Exception as exc:
            if is_transient(exc):
                raise
            logger.exception("resume: looking for stranded parked runs failed; tried again later")
            return 0

    def sweep_unserved(self) -> int:
        """Fail the runs that waited longer than ``KUMIFLOW_UNKNOWN_DEFINITION_GRACE``
        for a worker with their definition, at most every
        :data:`STRANDED_SWEEP_SECONDS`; only once this process has been up for
        a heartbeat's staleness (every live worker has announced itself by then:
        a fleet starting after an outage fails nothing it would have served)."""
        now = time.monotonic()
        if now < self._next_unserved or not self._settled():
            return 0
        self._next_unserved = now + STRANDED_SWEEP_SECONDS
        try:
            return unserved.fail_overdue()
        except Exception as exc:
            if is_transient(exc):
                raise
            logger.exception("resume: failing runs no worker serves failed; tried again later")
            return 0

    def _settled(self) -> bool:
        """Up for a heartbeat's staleness: every live worker has announced
        itself by then (after an outage, an old worker not yet announced
        would otherwise look gone, and its runs be taken over, and failed
        if the change is incompatible for them, by a new one)."""
        return time.monotonic() - self._born >= serving.stale_after()

    def _parallel(self) -> bool:
        # SQLite lets one writer in at a time: threads would only queue for it.
        # Inside a transaction (a test), other connections would not see its data.
        connection = db.connection()
        return self.threads > 1 and not db.one_writer_at_a_time() and not connection.in_atomic_block

    def _release(self, run_id: uuid.UUID) -> None:
        WorkflowRun.objects.filter(pk=run_id, lease_owner=self.worker_id).update(
            lease_owner="", lease_until=None
        )

    def _lease(self, chunk: list[Due], now: datetime, only: Q | None = None) -> list[Claimed]:
        """Lease the runs of ``chunk`` that are still due and free, in one short
        transaction (on PostgreSQL one statement, a transaction of its own).
        Rows another worker is leasing at this moment are skipped (``SKIP
        LOCKED`` where the database has it): workers take disjoint runs
        instead of contending for the same ones."""
        only = only if only is not None else unserved.claim_filter()
        lease_until = now + timedelta(seconds=settings.LEASE_SECONDS)
        order = {due.id: i for i, due in enumerate(chunk)}

        key = ("lease", len(chunk), only)
        ids = {f"id{i}": due.id for i, due in enumerate(chunk)}
        # The claim's own database: its transaction, or its statement's session.
        using = db.alias()
        one_statement = db.claims_in_one_statement(using)

        def lease() -> list[_Leased]:
            if one_statement:
                # Locked, checked and leased at once; the rows as they were.
                rows = sql.update_selected(
                    key,
                    lambda: _leasing(len(chunk), only),
                    using=using,
                    sets={"lease_owner": self.worker_id, "lease_until": lease_until},
                    now=now,
                    **ids,
                )
                return [_Leased(*row) for row in rows]
            rows = sql.values(
                key,
                lambda: _leasing(len(chunk), only),
                using=sql.routed(WorkflowRun, lock=True),
                now=now,
                **ids,
            )
            found = [_Leased(*row) for row in rows]
            if found:
                WorkflowRun.objects.filter(pk__in=[row.id for row in found]).update(
                    lease_owner=self.worker_id, lease_until=lease_until
                )
            return found

        found: list[_Leased] = claim(lease, lost=[], one_statement=one_statement)
        claimed = []
        for row in sorted(found, key=lambda r: order[r.id]):
            recovered: Recovered | None = None
            if row.lease_owner and row.lease_owner != self.worker_id:
                until = row.lease_until
                recovered = {
                    "from": row.lease_owner,
                    "lease_until": isoformat(until) if until else None,
                }
            placed = Placed(row.depth, row.parent_id, row.parent_waits)
            claimed.append(Claimed(row.id, row.version, recovered, placed))
        return claimed

    def run_once(self) -> int:
        """Claim and resume one batch of due runs, in claim order (see :func:`due_runs`).

        The first chunk is leased and resumed here: only when there are more
        does the pool start (a poll that finds little to do opens no
        connections); its threads then take the next chunks in order."""
        self.sweep_stranded()  # what it wakes is due in this pass
        self.sweep_unserved()
        now = clock.now()
        # Only runs on a definition this process has: a run another process
        # must resume is not claimed here at all (no attempt, no lease).
        only = unserved.claim_filter(takeover=not self.settle_takeovers or self._settled())
        due = due_runs(now, self.batch_size, free=True, only=only)
        chunks = [due[i : i + CLAIM_CHUNK] for i in range(0, len(due), CLAIM_CHUNK)]
        if not chunks:
            return 0
        done = self._work(chunks[0], now, only)
        rest = chunks[1:]
        if not rest or self.stopping:
            return done
        if not self._parallel():
            return done + sum(self._work(chunk, now, only) for chunk in rest if not self.stopping)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="kumiflow-resume")
        queue = list(reversed(rest))
        lock = threading.Lock()

        def take() -> list[Due] | None:
            with lock:
                return queue.pop() if queue else None

        def drain() -> int:
            self._fresh_connection()
            resumed = 0
            while not self.stopping:
                chunk = take()
                if chunk is None:
                    break
                resumed += self._work(chunk, now, only)
            return resumed

        drains = [self._pool.submit(drain) for _ in range(min(self.threads, len(rest)))]
        return done + sum(f.result() for f in drains)

    def _fresh_connection(self) -> None:
        """Each pool thread keeps its own connection; drop it if it broke."""
        connection = db.connection()
        broken = connection.connection is not None and connection.errors_occurred
        if broken and not connection.is_usable():
            connection.close()

    def _work(self, chunk: list[Due], now: datetime, only: Q) -> int:
        """Lease a chunk of due runs and resume them one after the other."""
        return self._resume_claimed(self._lease(chunk, now, only))

    def _resume_claimed(self, claimed: list[Claimed]) -> int:
        resumed = 0
        for run_id, version, recovered, placed in claimed:
            if self.stopping:
                self._release(run_id)
                continue
            if recovered:
                logger.warning(
                    "run %s: taking over from %s, whose lease expired",
                    run_id,
                    recovered["from"],
                    extra=log_fields(run_id=run_id),
                )
            try:
                run = resume_run(
                    run_id,
                    skip_locked=True,
                    expected_version=version,
                    recovered=recovered,
                    placed=placed,
                )
            except Exception as exc:
                # Not a step error (those fail the run), not a refusal (recorded
                # with a backoff): the database is away, or something nobody
                # expected broke. The transaction was rolled back.
                if is_transient(exc):
                    logger.warning(
                        "run %s: resume failed (%s); it stays due",
                        run_id,
                        exc,
                        extra=log_fields(run_id=run_id),
                    )
                    self._release(run_id)
                else:
                    # Keep the lease: the run is tried again when it runs out,
                    # not at once on every poll.
                    logger.exception(
                        "run %s: resume failed; tried again in %ss",
                        run_id,
                        settings.LEASE_SECONDS,
                        extra=log_fields(run_id=run_id),
                    )
                continue
            if run is None:
                self._release(run_id)
            else:
                resumed += 1
        return resumed

    def close(self) -> None:
        """Stop the pool threads and close the connection of each of them.

        One task per thread, each waiting at a barrier until all of them run:
        so every thread runs exactly one and closes its own connection (a
        connection can only be closed by its thread)."""
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        barrier = threading.Barrier(self.threads)
        closed = [pool.submit(_close_connection, barrier) for _ in range(self.threads)]
        for future in closed:
            future.result()
        pool.shutdown(wait=True)

    def next_due(self) -> datetime | None:
        # Claimable runs only: a paused run that is due would make every poll immediate.
        rows = sql.values(
            "next due run",
            lambda: (
                WorkflowRun.objects.claimable()
                .filter(wake_at__isnull=False)
                .order_by("wake_at")
                .values_list("wake_at")[:1]
            ),
            using=sql.routed(WorkflowRun),
        )
        return rows[0][0] if rows else None


def _close_connection(barrier: threading.Barrier) -> None:
    try:
        barrier.wait(timeout=30)
    except threading.BrokenBarrierError:  # a thread is stuck: close ours all the same
        logger.warning("resume pool: not every thread reached close()")
    finally:
        db.connection().close()
