"""Flow control as declared: concurrency limits, rates, priorities.

Plain data, validated when built: ``Limit`` and ``Rate`` are given to
``define_workflow`` (limits on runs) and to ``steps.task`` (limits on task
attempts). The engine enforces them in ``kumiflow_django.flow``. They are
not part of a definition's fingerprint: raising a limit changes when work
runs, not what runs, and must not strand the runs already under way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kumiflow_django.definition.durations import parse_duration
from kumiflow_django.definition.step import check_resolver
from kumiflow_django.store import limits

#: Priorities run from -100 to 100 (Django's Tasks use the same range); higher first.
MIN_PRIORITY = limits.MIN_PRIORITY
MAX_PRIORITY = limits.MAX_PRIORITY
#: Longest key a limit, a rate, a debounce or a throttle groups by.
MAX_KEY_LENGTH = limits.FLOW_KEY
#: Longest scope name (a workflow's name by default).
MAX_SCOPE_LENGTH = limits.FLOW_SCOPE

KeyResolver = str | Callable[[Any], Any]


def check_priority(value: Any, what: str = "priority") -> int:
    """An integer from MIN_PRIORITY to MAX_PRIORITY; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, not {type(value).__name__}")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"{what} must be from {MIN_PRIORITY} to {MAX_PRIORITY}, not {value}")
    return value


def check_key(value: Any, what: str) -> str:
    """A resolved key: a non-empty string of at most MAX_KEY_LENGTH characters."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, not {type(value).__name__}")
    if not value or len(value) > MAX_KEY_LENGTH:
        raise ValueError(f"{what} must have 1 to {MAX_KEY_LENGTH} characters ({len(value)})")
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL characters")
    return value


def _check_key_resolver(key: Any, what: str) -> None:
    if callable(key) and not isinstance(key, type):
        check_resolver(key, what)
    else:
        check_key(key, what)


def _check_scope(scope: Any) -> None:
    if scope is None:
        return
    if not isinstance(scope, str) or not scope or len(scope) > MAX_SCOPE_LENGTH:
        raise ValueError(f"a scope must be a string of 1 to {MAX_SCOPE_LENGTH} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in scope):
        raise ValueError("a scope must not contain control characters")


def resolve_key(key: KeyResolver, value: Any, what: str) -> str:
    """Resolve ``key`` against ``value`` (the trigger event, or a step's context)."""
    resolved = key(value) if callable(key) and not isinstance(key, type) else key
    return check_key(resolved, what)


@dataclass(frozen=True)
class Limit:
    """At most ``max`` active at once per key (``key`` is a string, or a function
    of the trigger event for runs, of the context for task steps).

    ``scope`` names the group the key counts in: by default the workflow's
    name (or, for a task step, the workflow and step); steps of several
    workflows that share a scope share its slots ("the carrier's API").
    """

    key: KeyResolver
    max: int
    scope: str | None = None

    def validate(self, what: str = "concurrency") -> None:
        if isinstance(self.max, bool) or not isinstance(self.max, int):
            raise ValueError(f"{what}: max must be an integer, not {type(self.max).__name__}")
        if self.max < 1:
            raise ValueError(f"{what}: max must be 1 or more, not {self.max}")
        _check_key_resolver(self.key, f"{what}'s key")
        _check_scope(self.scope)


@dataclass(frozen=True)
class Rate:
    """At most ``limit`` admissions per key in each window of ``per`` (an ISO
    8601 duration). Windows are aligned to the epoch; beyond the rate, work
    waits for the next window: nothing is dropped."""

    key: KeyResolver
    limit: int
    per: str
    scope: str | None = None

    def validate(self, what: str = "rate") -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            raise ValueError(f"{what}: limit must be an integer, not {type(self.limit).__name__}")
        if self.limit < 1:
            raise ValueError(f"{what}: limit must be 1 or more, not {self.limit}")
        if not isinstance(self.per, str):
            raise ValueError(f"{what}: per must be an ISO 8601 duration such as 'PT1M'")
        if self.period <= timedelta(0):
            raise ValueError(f"{what}: per must be a positive duration, not {self.per!r}")
        _check_key_resolver(self.key, f"{what}'s key")
        _check_scope(self.scope)

    @property
    def period(self) -> timedelta:
        return parse_duration(self.per)
