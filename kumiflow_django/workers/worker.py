"""The worker: the resume, dispatch, cron, task and bulk loops in one process.

Each loop runs in its own thread with its own database connection; one
``stop()`` (SIGINT/SIGTERM in ``kumiflow_worker``) lets each finish the item
at hand, and the worker returns when all have. Start as many workers as you
like, on as many machines, against one PostgreSQL or MariaDB: they share
the work through skip-locked claims, stream versions and leases.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from kumiflow_django.definition import serving
from kumiflow_django.store import clock, db
from kumiflow_django.store.errors import OperationConflict
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.workers.bulk import BulkLoop
from kumiflow_django.workers.cron import CronLoop
from kumiflow_django.workers.dispatch import DispatchLoop
from kumiflow_django.workers.loop import Loop, Outage
from kumiflow_django.workers.resume import ResumeLoop, default_worker_id
from kumiflow_django.workers.tasks import TaskLoop

logger = get_logger("kumiflow_django.workers.worker")


class Service(Protocol):
    """Something that runs beside the loops and stops with them (the metrics
    endpoint of ``--metrics-port``)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Heartbeat:
    """This process's row in the worker table (:mod:`kumiflow_django.definition.serving`):
    written before the loops start, refreshed every heartbeat interval by a
    thread of its own, deleted when the worker stops. One row per process,
    whatever loops it runs.

    A database that is away, at the start or later, is an :class:`Outage`
    of the heartbeat, as of a loop: one line when it starts, the outage's
    backoff between tries, one line when a beat succeeds again. At the
    start the loops wait for the first beat (:meth:`cancel` ends the wait);
    a worker is not brought down by a database that is slow or restarting
    when it starts."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._stop = threading.Event()
        #: Set by :meth:`cancel`: a first beat that waits for the database gives up.
        self._cancelled = threading.Event()
        self._thread: threading.Thread | None = None
        self.outage = Outage("heartbeat")

    def start(self) -> None:
        """Write the row (and the definitions' snapshots), then start the thread.
        A transient error (:func:`~kumiflow_django.store.db.is_transient`, or
        lock conflicts lost every time) is tried again with backoff until the
        beat succeeds or :meth:`cancel` is called; any other error is raised."""
        while True:
            try:
                serving.beat(self.worker_id, started_at=clock.now())
                break
            except Exception as exc:
                if not (db.is_transient(exc) or isinstance(exc, OperationConflict)):
                    raise
                pause = self.outage.failed(exc, away=True)
                db.connection().close()
                if self._wait(self._cancelled, pause):
                    return  # stopped before the database came back: nothing to beat for
        self.outage.succeeded()
        db.connection().close()  # the main thread only waits from now on
        self._thread = threading.Thread(target=self._run, name="kumiflow-heartbeat", daemon=True)
        self._thread.start()

    def _wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait up to ``seconds`` for ``event``; whether it is set (tests replace it)."""
        return event.wait(seconds)

    def _run(self) -> None:
        interval = serving.heartbeat_interval()
        pause = interval
        try:
            while not self._wait(self._stop, pause):
                try:
                    serving.beat(self.worker_id)
                except Exception as exc:  # the database is away: the next beat tries again
                    pause = min(self.outage.failed(exc), interval)
                    db.connection().close()
                else:
                    self.outage.succeeded()
                    pause = interval
        finally:
            db.connection().close()

    def cancel(self) -> None:
        """Give up a start that waits for the database (the worker is stopping)."""
        self._cancelled.set()

    def stop(self) -> None:
        self._cancelled.set()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            serving.leave(self.worker_id)
        except Exception:  # it goes stale instead
            logger.warning("worker %s: its row was not deleted", self.worker_id, exc_info=True)
        finally:
            db.connection().close()


class Worker:
    def __init__(
        self,
        *,
        resume: bool = True,
        dispatch: bool = True,
        cron: bool = True,
        tasks: bool = True,
        task_threads: int | None = None,
        batch_size: int = 100,
        max_interval: float = 5.0,
        worker_id: str | None = None,
        services: Sequence[Service] = (),
    ) -> None:
        self.worker_id = worker_id or default_worker_id()
        self.heartbeat = Heartbeat(self.worker_id)
        self.services: list[Service] = [self.heartbeat, *services]
        self.loops: list[Loop] = []
        if resume:
            self.loops.append(
                ResumeLoop(
                    worker_id=self.worker_id,
                    batch_size=batch_size,
                    max_interval=max_interval,
                    settle_takeovers=True,
                )
            )
            # Bulk operations of runs go with resuming them (one poll per interval).
            self.loops.append(BulkLoop(batch_size=batch_size, max_interval=max_interval))
        if dispatch:
            self.loops.append(DispatchLoop(batch_size=batch_size, max_interval=max_interval))
        if cron:
            self.loops.append(CronLoop(batch_size=batch_size, max_interval=max_interval))
        if tasks:
            self.loops.append(
                TaskLoop(
                    threads=task_threads,
                    worker_id=self.worker_id,
                    batch_size=batch_size,
                    max_interval=max_interval,
                )
            )
        if not self.loops:
            raise ValueError("a worker needs at least one loop")
        #: Set when a loop died of something other than a database error.
        self.crashed = False

    def run_once(self) -> dict[str, int]:
        """One batch of each loop; the task attempts it started have ended, and the
        loops' threads (with their connections) are gone, when it returns."""
        handled = {}
        for loop in self.loops:
            try:
                handled[loop.name] = loop.run_once()
                loop.drain()
            finally:
                loop.close()
        return handled

    def stop(self) -> None:
        for loop in self.loops:
            loop.stop()
        self.heartbeat.cancel()  # a start still waiting for the database gives up

    def run(self) -> None:
        threads = [
            threading.Thread(target=self._run_loop, args=(loop,), name=f"kumiflow-{loop.name}")
            for loop in self.loops
        ]
        logger.info(
            "worker %s: running %s", self.worker_id, ", ".join(loop.name for loop in self.loops)
        )
        started: list[Service] = []
        try:
            for service in self.services:
                service.start()
                started.append(service)
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.5)  # keeps the main thread free for signals
        finally:
            for service in reversed(started):
                service.stop()
        logger.info("worker %s stopped", self.worker_id)

    def _run_loop(self, loop: Loop) -> None:
        try:
            loop.run_forever()
        except BaseException:  # a SystemExit ends a thread silently: not this one
            logger.exception("the %s loop crashed; stopping the worker", loop.name)
            self.crashed = True
            self.stop()
        else:
            if not loop.stopping:
                logger.error("the %s loop ended unasked; stopping the worker", loop.name)
                self.crashed = True
                self.stop()
        finally:
            db.connection().close()
