"""The engine's clock: one place every timestamp of the engine comes from.

Tests replace it with :class:`kumiflow_django.testing.VirtualClock`, so a
seven-day workflow is tested without sleeping.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from django.utils import timezone


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return timezone.now()


_clock: Clock = SystemClock()


def now() -> datetime:
    """The current aware UTC time according to the engine's clock."""
    return _clock.now()


def get_clock() -> Clock:
    return _clock


def set_clock(clock: Clock) -> Clock:
    """Install ``clock`` and return the previous one."""
    global _clock
    previous, _clock = _clock, clock
    return previous
