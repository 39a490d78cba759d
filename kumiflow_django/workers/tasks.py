"""The task loop: kumiflow's own pool of task threads, and the tasks' timekeeper.

Every pass of the loop

1. gives up running attempts whose lease ran out (their worker died, they
   outlived their timeout or stopped heartbeating): the retry policy tries
   them again (:func:`kumiflow_django.tasks.attempts.expire`);
2. hands due attempts of Django Tasks backends that no job took to their
   backend again (:func:`kumiflow_django.tasks.backends.sweep`);
3. claims due attempts of kumiflow's own pool (tasks whose function is a
   plain function), as many as it has free threads, and runs each on a
   thread of its pool, which records the outcome.

A thread cannot be killed: an attempt that outlives its timeout is given up
by the database (step 1, here or in any other worker), its thread is
*abandoned* (no longer counted: a new thread takes its place) and its late
result is recorded as ignored. A pool with more abandoned threads than it
has threads stops claiming and says so: something the functions call hangs.

``stop()`` ends the claiming; the attempts at hand run to their end (each
is bounded by its timeout), then the loop returns. A second signal exits at
once: the attempts' leases run out and other workers try them again.
"""

from __future__ import annotations

import contextlib
import queue
import random
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Min, QuerySet

from kumiflow_django.conf import settings
from kumiflow_django.projections.tasks import StepTask, TaskStatus
from kumiflow_django.store import clock, db, sql
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.wakeups import WorkKind
from kumiflow_django.tasks import attempts, backends, runner_task
from kumiflow_django.workers.loop import Loop, refresh_connection
from kumiflow_django.workers.resume import default_worker_id

#: Tries to record an attempt's outcome when the database breaks a deadlock
#: or drops the connection (each in a transaction of its own).
RECORD_TRIES = 5

logger = get_logger("kumiflow_django.tasks")

#: Seconds an attempt may outlive its timeout before its thread is abandoned
#: (the database gives it up at its timeout; this is for clocks that disagree).
ABANDON_GRACE = 5.0
#: When due work could not be claimed (locked by another worker, a database
#: error), the shortest pause before trying again: one item never spins a loop.
RETRY_PAUSE = 0.5
#: Seconds between two looks for leases that ran out while draining.
DRAIN_POLL = 0.1
#: Outcomes a pool records at once. Its threads share one interpreter lock:
#: attempts that end together, each recording in a transaction of its own
#: (which resumes the waiting run in it), hold each transaction open for
#: about the CPU time of all of them (W7, 32 threads on a loaded machine:
#: 220 ms of wall time at the median for 18 ms of CPU). Past this many, a
#: thread waits before its transaction begins, holding nothing (and no later
#: than its timeout's end: :meth:`TaskLoop._slot`); a few at once still overlap
#: one's round trips with another's Python.
RECORDS_AT_ONCE = 4


@dataclass
class _InFlight:
    attempt: attempts.Attempt
    deadline: float  # time.monotonic()
    abandoned: bool = False


@dataclass
class _Pool:
    """The pool's threads and the attempts they run (guarded by ``lock``)."""

    size: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    running: dict[tuple[uuid.UUID, int], _InFlight] = field(default_factory=dict)
    threads: int = 0

    def busy(self) -> int:
        return sum(1 for f in self.running.values() if not f.abandoned)

    def abandoned(self) -> int:
        return sum(1 for f in self.running.values() if f.abandoned)


class TaskLoop(Loop):
    name = "tasks"
    kinds = (WorkKind.TASK,)

    def __init__(
        self,
        *,
        threads: int | None = None,
        queues: Sequence[str] | None = None,
        worker_id: str | None = None,
        batch_size: int = 100,
        max_interval: float = 5.0,
        every_backend: bool = False,
    ) -> None:
        super().__init__(batch_size=batch_size, max_interval=max_interval)
        #: Run the attempts of Django Tasks backends here too, instead of handing
        #: them to their backends (``run_until_idle``: a test runs every task itself).
        self.every_backend = every_backend
        self.worker_id = worker_id or default_worker_id()
        size = settings.TASK_THREADS if threads is None else threads
        if size < 0:
            raise ValueError("a task pool needs zero or more threads")
        #: The queues whose attempts this pool runs (None: every queue).
        self.queues = tuple(queues) if queues else None
        self._pool = _Pool(size)
        self._work: queue.SimpleQueue[_InFlight | None] = queue.SimpleQueue()
        self._stalled = False
        self._sweep_stalled = False
        self._warned_at = float("-inf")
        self._threads: list[threading.Thread] = []
        self._recording = threading.BoundedSemaphore(RECORDS_AT_ONCE)

    @property
    def threads(self) -> int:
        return self._pool.size

    # -- one pass ------------------------------------------------------------
    def run_once(self) -> int:
        now = clock.now()
        self._stalled = self._sweep_stalled = False
        handled = self.expire(now)
        handled += self.sweep(now)
        handled += self.claim(now)
        return handled

    def expire(self, now: datetime) -> int:
        """Give up the attempts whose lease ran out (any worker's, any backend's)."""
        given_up = 0
        expired = [
            row[0]
            for row in sql.values(
                ("expired tasks", self.batch_size),
                lambda: StepTask.objects.expired(sql.NOW).values_list("id")[: self.batch_size],
                using=sql.routed(StepTask),
                now=now,
            )
        ]
        for task_id in expired:
            try:
                task = attempts.expire(task_id, now)
            except Exception as exc:
                if db.is_transient(exc):
                    raise  # the database is away: the loop's outage says so, once
                logger.exception(
                    "task %s: giving up its attempt failed; tried again later", task_id
                )
                continue
            if task is not None:
                given_up += 1
                self._abandon(task.id, task.attempt)
        self._stalled |= bool(expired) and not given_up
        self._abandon_overdue()
        return given_up

    def sweep(self, now: datetime) -> int:
        """Hand due attempts of Django Tasks backends that no job took to them again."""
        runner = runner_task()
        if runner is None or self.every_backend:
            return 0
        swept = backends.sweep(runner, now, self.batch_size)
        # A hand-off that fails (a backend that is down) is tried again later, not at once.
        self._sweep_stalled = swept.found > 0 and not swept.sent
        return swept.sent

    def claim(self, now: datetime) -> int:
        """Claim as many due attempts as there are free threads (in one
        transaction), and start them."""
        free = min(self._free(), self.batch_size)
        if free <= 0 or self.stopping:
            return 0
        try:
            claimed = attempts.claim_due(
                now,
                worker=self.worker_id,
                limit=free,
                queues=self.queues,
                every_backend=self.every_backend,
            )
        except Exception as exc:
            # A deadlock the database broke, a dropped connection: a warning.
            log = logger.warning if db.is_transient(exc) else logger.exception
            log("tasks: claiming due attempts failed (%s); tried again later", exc)
            self._stalled = True
            return 0
        for attempt in claimed:
            self._start(attempt)
        if not claimed and self._due_exists(now):
            self._stalled = True  # due work none of which could be claimed: pause first
        return len(claimed)

    def _pending(self) -> QuerySet[StepTask, StepTask]:
        pending = StepTask.objects.filter(status=TaskStatus.PENDING)
        if not self.every_backend:
            pending = pending.filter(backend="")
        if self.queues is not None:
            pending = pending.filter(queue__in=self.queues)
        return pending

    def _due_exists(self, now: datetime) -> bool:
        return self._pending().filter(next_attempt_at__lte=now).exists()

    def _free(self) -> int:
        with self._pool.lock:
            if self._pool.size == 0:
                return 0
            abandoned = self._pool.abandoned()
            if abandoned > self._pool.size:
                if time.monotonic() >= self._warned_at + 60:
                    self._warned_at = time.monotonic()
                    logger.error(
                        "the task pool has %d abandoned threads (attempts that outlived their "
                        "timeout and still run): it claims no more until they end; restart "
                        "the worker if they never do",
                        abandoned,
                    )
                return 0
            return self._pool.size - self._pool.busy()

    # -- the pool ------------------------------------------------------------
    def _inline(self) -> bool:
        # Inside a transaction (a test), other connections would not see its data.
        return db.connection().in_atomic_block

    def _start(self, attempt: attempts.Attempt) -> None:
        inflight = _InFlight(attempt, time.monotonic() + attempt.context.timeout + ABANDON_GRACE)
        with self._pool.lock:
            self._pool.running[attempt.task_id, attempt.number] = inflight
        if self._inline():
            self._execute(inflight)
            return
        with self._pool.lock:
            spawn = self._pool.threads < self._pool.busy() + self._pool.abandoned()
            if spawn:
                self._pool.threads += 1
        if spawn:
            thread = threading.Thread(target=self._serve, name="kumiflow-task", daemon=True)
            self._threads.append(thread)
            thread.start()
        self._work.put(inflight)

    def _serve(self) -> None:
        """A pool thread: run attempts until told to stop. (A thread whose attempt was
        abandoned serves on once it ends: the pool holds about twice its size
        at most, as it stops claiming when more than its size are abandoned.)"""
        try:
            while True:
                inflight = self._work.get()
                if inflight is None:
                    return
                refresh_connection()
                self._execute(inflight)
        finally:
            with self._pool.lock:
                self._pool.threads -= 1
            db.connection().close()

    def _execute(self, inflight: _InFlight) -> None:
        attempt = inflight.attempt
        try:
            outcome = attempts.run(attempt)
            self._record(attempt, outcome)
        except Exception as exc:
            # The outcome is lost: the lease runs out and the attempt is tried again.
            if db.is_transient(exc):  # the database is away: one line for the loop and its pool
                self.outage.failed(exc)
                return
            logger.exception(
                "task %s: recording attempt %d failed; it is tried again after its lease",
                attempt.task_id,
                attempt.number,
            )
        finally:
            with self._pool.lock:
                self._pool.running.pop((attempt.task_id, attempt.number), None)
            self.wake()  # a thread is free

    def _record(self, attempt: attempts.Attempt, outcome: attempts.Outcome) -> None:
        """Record the outcome (at most :data:`RECORDS_AT_ONCE` threads of the pool
        at once, each try on its own); a deadlock or a lost connection is tried
        again after a short jitter (the outcome is in hand), a few times,
        before the lease decides."""
        for tries in range(RECORD_TRIES):
            try:
                with self._slot(attempt):
                    attempts.record(attempt, outcome)
                return
            except Exception as exc:
                if not db.is_transient(exc) or tries == RECORD_TRIES - 1:
                    raise
                time.sleep(random.uniform(0.01, 0.05) * (tries + 1))  # noqa: S311 - jitter
                logger.warning(
                    "task %s: recording attempt %d failed (%s); trying again",
                    attempt.task_id,
                    attempt.number,
                    exc,
                )
                refresh_connection()

    @contextlib.contextmanager
    def _slot(self, attempt: attempts.Attempt) -> Iterator[None]:
        """One of the :data:`RECORDS_AT_ONCE` slots, waited for no later than the
        end of the attempt's timeout: when every slot stays taken (recordings
        that wait for a lock), the outcome is recorded without one rather than
        made late by the wait (the engine refuses a result after the lease)."""
        context = attempt.context
        lease = context.started_at + timedelta(seconds=context.timeout)
        wait = max(0.0, (lease - clock.now()).total_seconds())
        slot = self._recording.acquire(timeout=wait)
        try:
            yield
        finally:
            if slot:
                self._recording.release()

    def _abandon(self, task_id: uuid.UUID, number: int) -> None:
        """The database gave up an attempt: if this pool runs it, stop counting it."""
        with self._pool.lock:
            inflight = self._pool.running.get((task_id, number))
            if inflight is not None and not inflight.abandoned:
                inflight.abandoned = True
                logger.warning(
                    "task %s: attempt %d was given up; its thread is abandoned", task_id, number
                )

    def _abandon_overdue(self) -> None:
        """Stop counting attempts that outlived their timeout (their threads cannot
        be stopped; their late results are ignored)."""
        now = time.monotonic()
        with self._pool.lock:
            for inflight in self._pool.running.values():
                if not inflight.abandoned and inflight.deadline < now:
                    inflight.abandoned = True
                    logger.warning(
                        "task %s: attempt %d outlived its timeout; its thread is abandoned",
                        inflight.attempt.task_id,
                        inflight.attempt.number,
                    )

    # -- sleeping ------------------------------------------------------------
    def next_due(self) -> datetime | None:
        """The next lease to expire, and (with a free thread) the next attempt due."""
        sweep = backends.next_sweep()
        if sweep is not None and self._sweep_stalled:
            sweep = max(sweep, clock.now() + timedelta(seconds=self.max_interval))
        moments: list[datetime | None] = [
            sweep,
            StepTask.objects.aggregate(at=Min("lease_until"))["at"],
        ]
        if self._free() > 0:
            moments.append(self._pending().aggregate(at=Min("next_attempt_at"))["at"])
        with self._pool.lock:
            deadlines = [f.deadline for f in self._pool.running.values() if not f.abandoned]
        if deadlines:
            moments.append(
                clock.now() + timedelta(seconds=max(0.0, min(deadlines) - time.monotonic()))
            )
        known = [m for m in moments if m is not None]
        earliest = min(known) if known else None
        if self._stalled:
            floor = clock.now() + timedelta(seconds=RETRY_PAUSE)
            earliest = floor if earliest is None else max(earliest, floor)
        return earliest

    # -- stopping ------------------------------------------------------------
    def running(self) -> int:
        """Attempts running now on this pool (abandoned ones not counted)."""
        with self._pool.lock:
            return self._pool.busy()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no attempt (but abandoned ones) runs; False on timeout."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.running():
            if end is not None and time.monotonic() >= end:
                return False
            self._abandon_overdue()
            time.sleep(0.05)
        return True

    def drain(self) -> None:
        """Wait for the attempts at hand to end; one whose lease runs out meanwhile
        (at the engine's clock: a test's virtual clock too) is given up, as the
        next pass would, and no longer waited for (``run_until_idle``)."""
        while not self.wait(timeout=DRAIN_POLL):
            try:
                self.expire(clock.now())
            except Exception as exc:
                if not db.is_transient(exc):
                    raise
                # The database is away: wait for the attempts, as the pass would.
                logger.debug("tasks: looking for leases that ran out failed (%s)", exc)

    def close(self) -> None:
        """Let the attempts at hand finish (each is bounded by its timeout), then
        end the pool's threads."""
        if self.running():
            logger.info("tasks: waiting for %d running attempt(s) to finish", self.running())
        self.wait()
        with self._pool.lock:
            threads = self._pool.threads
        for _ in range(threads):
            self._work.put(None)
        # The idle threads end now and close their connections; an abandoned
        # one (still in its function) is left to end when it does.
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = [t for t in self._threads if t.is_alive()]
