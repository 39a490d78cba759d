"""Helpers for testing workflows: a virtual clock and ``run_until_idle()``.

::

    with virtual_clock() as clock:
        append_event("user-1", "user.signed-up", {...})
        clock.advance(days=1)
        run_until_idle()

A seven-day workflow is tested in milliseconds: the whole engine (wake
times, timeouts, backoffs, event timestamps) reads this clock.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from kumiflow_django.store import clock as engine_clock


class VirtualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("the virtual clock needs an aware datetime")
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, when: datetime) -> datetime:
        with self._lock:
            self._now = when
            return when

    def advance(self, delta: timedelta | None = None, **kwargs: float) -> datetime:
        """Move forward by ``delta`` or by ``timedelta(**kwargs)``."""
        step = delta if delta is not None else timedelta(**kwargs)
        with self._lock:
            self._now += step
            return self._now


@contextlib.contextmanager
def virtual_clock(start: datetime | None = None) -> Iterator[VirtualClock]:
    """Install a :class:`VirtualClock` for the engine for the duration."""
    clock = VirtualClock(start)
    previous = engine_clock.set_clock(clock)
    try:
        yield clock
    finally:
        engine_clock.set_clock(previous)


@dataclass
class IdleReport:
    resumed: int = 0
    dispatched: int = 0
    fired: int = 0
    tasks: int = 0
    rounds: int = 0


def run_until_idle(
    *, dispatch: bool = True, cron: bool = True, tasks: bool = True, max_rounds: int = 1000
) -> IdleReport:
    """Run the loops until nothing is due at the clock's current time.

    Task steps' functions run too, on this process whatever their Django
    Tasks backend (each round waits for the attempts it started). Leases
    keep time by the engine's clock, as in a worker: an attempt that
    outlives its timeout or heartbeat timeout on the virtual clock is given
    up while it is waited for, and its result, if it comes, is ignored.
    """
    # Imported here: the loops import the models, and this module is imported
    # by test modules and conftests before Django's app registry is ready.
    from kumiflow_django.workers.cron import CronLoop
    from kumiflow_django.workers.dispatch import DispatchLoop
    from kumiflow_django.workers.loop import Loop
    from kumiflow_django.workers.resume import ResumeLoop
    from kumiflow_django.workers.tasks import TaskLoop

    loops: list[tuple[str, Loop]] = [("resumed", ResumeLoop(batch_size=500, threads=1))]
    if dispatch:
        loops.append(("dispatched", DispatchLoop(batch_size=500)))
    if cron:
        loops.append(("fired", CronLoop(batch_size=500)))
    if tasks:
        # Every task step's function runs here, whatever its backend: a test
        # transaction never commits, so a backend would never be handed the task.
        loops.append(("tasks", TaskLoop(batch_size=500, every_backend=True)))
    report = IdleReport()
    try:
        for _ in range(max_rounds):
            report.rounds += 1
            handled = 0
            for field, loop in loops:
                n = loop.run_once()
                loop.drain()
                setattr(report, field, getattr(report, field) + n)
                handled += n
            if not handled:
                return report
    finally:
        for _, loop in loops:
            loop.close()
    raise RuntimeError(f"still busy after {max_rounds} rounds: a workflow loops without waiting?")
