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
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db.models import Q

from kumiflow_django.conf import settings
from kumiflow_django.definition.durations import isoformat
from kumiflow_django.engine.resuming import resume_run
from kumiflow_django.projections.runs import WorkflowRun
from kumiflow_django.store import clock, db
from kumiflow_django.store.db import for_update, is_transient
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
    """A run leased to this worker: the version it was due at, and the expired
    lease of another worker it takes over, if any (a recovery)."""

    id: uuid.UUID
    version: int
    recovered: dict[str, Any] | None


#: Runs leased per statement: few enough that a lease does not run out while
#: its run waits for the ones before it.
CLAIM_CHUNK = 10


def due_runs(now: datetime, limit: int) -> list[Due]:
    """(id, version, lease owner, lease expiry) of due runs, earliest first:
    one indexed range read."""
    rows = (
        WorkflowRun.objects.due(now)
        .order_by("wake_at")
        .values_list("id", "version", "lease_owner", "lease_until")[:limit]
    )
    return [Due(*row) for row in rows]


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
    ) -> None:
        super().__init__(batch_size=batch_size, max_interval=max_interval)
        self.worker_id = worker_id or default_worker_id()
        self.threads = threads or settings.RESUME_THREADS
        self._pool: ThreadPoolExecutor | None = None

    def _parallel(self) -> bool:
        # SQLite lets one writer in at a time: threads would only queue for it.
        # Inside a transaction (a test), other connections would not see its data.
        connection = db.connection()
        return self.threads > 1 and connection.vendor != "sqlite" and not connection.in_atomic_block

    def _claim(self, chunk: list[Due], now: datetime) -> list[Claimed]:
        """Lease a few due runs in one statement; return those now leased to us."""
        candidates: dict[uuid.UUID, Claimed] = {}
        for due in chunk:
            owner, until = due.lease_owner, due.lease_until
            if owner and until is not None and until > now:
                continue  # a worker is on it (or parked it after an unexpected error)
            recovered = None
            if owner and owner != self.worker_id:
                recovered = {"from": owner, "lease_until": isoformat(until) if until else None}
            candidates[due.id] = Claimed(due.id, due.version, recovered)
        if not candidates:
            return []
        free = Q(lease_owner="") | Q(lease_until__lt=now) | Q(lease_owner=self.worker_id)
        lease_until = now + timedelta(seconds=settings.LEASE_SECONDS)
        rows = WorkflowRun.objects.filter(pk__in=list(candidates))
        rows.filter(free).update(lease_owner=self.worker_id, lease_until=lease_until)
        mine = set(rows.filter(lease_owner=self.worker_id).values_list("id", flat=True))
        return [claimed for run_id, claimed in candidates.items() if run_id in mine]

    def _release(self, run_id: uuid.UUID) -> None:
        WorkflowRun.objects.filter(pk=run_id, lease_owner=self.worker_id).update(
            lease_owner="", lease_until=None
        )

    def _claim_next(self, now: datetime, limit: int) -> list[Claimed]:
        """Lease up to ``limit`` due runs that no worker holds, in one short
        transaction. Rows another worker is leasing at this moment are skipped
        (``SKIP LOCKED``): workers take disjoint runs instead of all reading the
        same earliest ones and contending for them."""
        # Not "or leased by this worker": the threads of one worker share its
        # id, and one would take the runs another has just leased.
        free = Q(lease_owner="") | Q(lease_until__lt=now)
        lease_until = now + timedelta(seconds=settings.LEASE_SECONDS)
        with db.atomic():
            due = WorkflowRun.objects.due(now).filter(free).order_by("wake_at")
            rows = [
                Due(*row)
                for row in for_update(due, skip_locked=True).values_list(
                    "id", "version", "lease_owner", "lease_until"
                )[:limit]
            ]
            if not rows:
                return []
            WorkflowRun.objects.filter(pk__in=[row.id for row in rows]).update(
                lease_owner=self.worker_id, lease_until=lease_until
            )
        claimed = []
        for row in rows:
            recovered = None
            if row.lease_owner and row.lease_owner != self.worker_id:
                until = row.lease_until
                recovered = {
                    "from": row.lease_owner,
                    "lease_until": isoformat(until) if until else None,
                }
            claimed.append(Claimed(row.id, row.version, recovered))
        return claimed

    def run_once(self) -> int:
        now = clock.now()
        # Threads lease disjoint runs (skip-locked) where the database can.
        if self._parallel() and db.connection().features.has_select_for_update_skip_locked:
            return self._run_parallel(now)
        due = due_runs(now, self.batch_size)
        chunks = [due[i : i + CLAIM_CHUNK] for i in range(0, len(due), CLAIM_CHUNK)]
        if not self._parallel() or len(chunks) < 2:
            return sum(self._work(chunk, now) for chunk in chunks)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="kumiflow-resume")
        return sum(self._pool.map(self._work_in_thread, chunks, [now] * len(chunks)))

    def _work_in_thread(self, chunk: list[Due], now: datetime) -> int:
        self._fresh_connection()
        return self._work(chunk, now)

    def _run_parallel(self, now: datetime) -> int:
        """Each thread leases a few due runs at a time (skip-locked) and resumes
        them, until the batch is used up or nothing is due: the last of 500 due
        runs waits for a tenth of them per thread, not for the whole batch.

        The first few are leased here: only when there are more than that does
        the pool start (a poll that finds little to do opens no connections)."""
        first = self._claim_next(now, min(CLAIM_CHUNK, self.batch_size))
        done = self._resume_claimed(first)
        if len(first) < CLAIM_CHUNK or self.stopping:
            return done
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="kumiflow-resume")
        budget = [self.batch_size - len(first)]
        lock = threading.Lock()

        def take() -> int:
            with lock:
                n = min(CLAIM_CHUNK, budget[0])
                budget[0] -= n
                return n

        def drain() -> int:
            self._fresh_connection()
            done = 0
            while not self.stopping:
                n = take()
                if n <= 0:
                    break
                claimed = self._claim_next(now, n)
                if not claimed:
                    break
                done += self._resume_claimed(claimed)
            return done

        drains = [self._pool.submit(drain) for _ in range(self.threads)]
        return done + sum(f.result() for f in drains)

    def _fresh_connection(self) -> None:
        """Each pool thread keeps its own connection; drop it if it broke."""
        connection = db.connection()
        broken = connection.connection is not None and connection.errors_occurred
        if broken and not connection.is_usable():
            connection.close()

    def _work(self, chunk: list[Due], now: datetime) -> int:
        """Lease a chunk of due runs and resume them one after the other."""
        return self._resume_claimed(self._claim(chunk, now))

    def _resume_claimed(self, claimed: list[Claimed]) -> int:
        resumed = 0
        for run_id, version, recovered in claimed:
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
                    run_id, skip_locked=True, expected_version=version, recovered=recovered
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
        return (
            WorkflowRun.objects.filter(wake_at__isnull=False)
            .order_by("wake_at")
            .values_list("wake_at", flat=True)
            .first()
        )


def _close_connection(barrier: threading.Barrier) -> None:
    try:
        barrier.wait(timeout=30)
    except threading.BrokenBarrierError:  # a thread is stuck: close ours all the same
        logger.warning("resume pool: not every thread reached close()")
    finally:
        db.connection().close()
