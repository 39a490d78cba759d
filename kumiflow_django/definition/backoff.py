"""Backoff policies shared by the ``retry`` step and outbox deliveries."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

BACKOFFS = ("exponential", "linear", "fixed")


@dataclass(frozen=True)
class BackoffPolicy:
    """``attempts`` counts every attempt, the first included."""

    attempts: int = 3
    backoff: str = "exponential"
    base: float = 10.0
    max_delay: float = 3600.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool):
            raise TypeError(f"attempts must be an integer: {self.attempts!r}")
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1: {self.attempts}")
        if self.backoff not in BACKOFFS:
            raise ValueError(f"backoff must be one of {', '.join(BACKOFFS)}: {self.backoff!r}")
        for name in ("base", "max_delay", "jitter"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative number: {value!r}")
        if self.jitter > 1:
            raise ValueError(f"jitter is a fraction of the delay, at most 1: {self.jitter}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> BackoffPolicy:
        unknown = set(values) - {"attempts", "backoff", "base", "max_delay", "jitter"}
        if unknown:
            raise ValueError(f"unknown retry policy keys: {', '.join(sorted(unknown))}")
        data = dict(values)
        for key in ("base", "max_delay"):
            if isinstance(data.get(key), timedelta):
                data[key] = data[key].total_seconds()
        return cls(**data)

    def delay(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        """The wait after failed attempt number ``attempt`` (1-based)."""
        if self.backoff == "exponential":
            seconds = self.base * (2 ** (attempt - 1))
        elif self.backoff == "linear":
            seconds = self.base * attempt
        else:
            seconds = self.base
        seconds = min(seconds, self.max_delay)
        if self.jitter:
            spread = seconds * self.jitter
            seconds += (rng or random).uniform(-spread, spread)
        return timedelta(seconds=max(0.0, seconds))

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "backoff": self.backoff,
            "base": self.base,
            "max_delay": self.max_delay,
            "jitter": self.jitter,
        }
