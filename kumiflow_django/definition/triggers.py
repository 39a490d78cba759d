"""Triggers: what starts a workflow's runs.

``on_event(type, filter=…)`` starts a run in the transaction that appends a
matching event; ``on_cron(expression, timezone, …)`` at each occurrence of a
schedule; ``manual()`` (the default) only by ``start_workflow()``. Each is
validated when the workflow is defined, and has a canonical form for the
fingerprint.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Protocol

from croniter import croniter

from kumiflow_django.definition.durations import parse_duration
from kumiflow_django.definition.fingerprint import callable_digest
from kumiflow_django.definition.flow import check_key
from kumiflow_django.definition.step import check_resolver
from kumiflow_django.store import clock, limits
from kumiflow_django.store.names import CRON_STREAM_PREFIX

MISFIRE_POLICIES = ("latest", "all", "skip")
OVERLAP_POLICIES = ("allow", "skip")


class Trigger(Protocol):
    """What every trigger does: check itself, and say what it is as data."""

    def validate(self) -> None:
        """Raise ValueError when the trigger cannot work (at definition time)."""

    def canonical(self) -> dict[str, Any]:
        """The trigger as data for the fingerprint."""


@dataclass(frozen=True)
class EventTrigger:
    """Start a run when an event of ``event_type`` is appended (and ``filter(event)``).

    ``debounce`` starts one run with the last event of a burst of a ``key``
    once the key has been quiet that long (``max_wait`` bounds a burst that
    never ends); ``throttle`` starts at most one run per key per period and
    records the events it skipped. Neither is part of the fingerprint: they
    change when runs start, not what runs.
    """

    event_type: str
    filter: Callable[[Any], bool] | None = None
    key: str | Callable[[Any], Any] | None = None
    debounce: str | None = None
    max_wait: str | None = None
    throttle: str | None = None

    def validate(self) -> None:
        if not isinstance(self.event_type, str) or not self.event_type.strip():
            raise ValueError(f"on_event needs an event type, not {self.event_type!r}")
        if len(self.event_type) > limits.EVENT_TYPE:
            raise ValueError(f"on_event's event type is longer than {limits.EVENT_TYPE} characters")
        if self.filter is not None:
            if not callable(self.filter):
                raise ValueError("on_event filter must be a function of the event")
            check_resolver(self.filter, "on_event filter")
        if self.debounce is not None and self.throttle is not None:
            raise ValueError("on_event takes debounce= or throttle=, not both")
        if self.max_wait is not None and self.debounce is None:
            raise ValueError("on_event's max_wait= bounds a debounce: give debounce= too")
        for what in ("debounce", "max_wait", "throttle"):
            value = getattr(self, what)
            if value is not None and _positive(value, what) is None:
                raise ValueError(f"on_event's {what} must be a positive ISO 8601 duration")
        if self.max_wait is not None and self.debounce is not None:
            longest, shortest = _positive(self.max_wait, "max_wait"), _positive(self.debounce, "d")
            if longest is not None and shortest is not None and longest < shortest:
                raise ValueError("on_event's max_wait must not be shorter than its debounce")
        if self.key is not None:
            if self.debounce is None and self.throttle is None:
                raise ValueError(
                    "on_event's key= groups a debounce or a throttle: give one of them"
                )
            if callable(self.key) and not isinstance(self.key, type):
                check_resolver(self.key, "on_event key")
            else:
                check_key(self.key, "on_event key")

    @property
    def grouped(self) -> bool:
        return self.debounce is not None or self.throttle is not None

    def canonical(self) -> dict[str, Any]:
        filter_ = callable_digest(self.filter) if self.filter else None
        return {"kind": "event", "event_type": self.event_type, "filter": filter_}


def _positive(value: Any, what: str) -> timedelta | None:
    if not isinstance(value, str):
        raise ValueError(f"on_event's {what} must be an ISO 8601 duration such as 'PT5M'")
    try:
        period = parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"on_event's {what}: {exc}") from None
    return period if period > timedelta(0) else None


@dataclass(frozen=True)
class CronTrigger:
    """Start a run at each occurrence of a cron expression in a time zone."""

    expression: str
    timezone: str = "UTC"
    misfire: str = "latest"
    max_catch_up: int = 10
    overlap: str = "allow"

    #: croniter gives up looking for the next occurrence this many years ahead:
    #: what bounds, in time, the check below and every computation of a schedule.
    SEARCH_YEARS: ClassVar[int] = 50
    #: The largest value every database's ``PositiveIntegerField`` holds.
    MAX_CATCH_UP: ClassVar[int] = 2**31 - 1

    def validate(self) -> None:
        """Refuse what the cron loop could not store or would never fire: an
        expression or zone too long for its column, and an expression with no
        occurrence after now (30 February, a year in the past)."""
        widths = {"expression": limits.CRON_EXPRESSION, "timezone": limits.TIME_ZONE}
        if not isinstance(self.expression, str) or not self.expression.strip():
            raise ValueError(f"on_cron needs a cron expression, not {self.expression!r}")
        if len(self.expression) > widths["expression"]:
            raise ValueError(
                f"the cron expression is longer than {widths['expression']} characters: "
                f"{self.expression[:40]!r}…"
            )
        if not croniter.is_valid(self.expression, second_at_beginning=False):
            raise ValueError(f"invalid cron expression {self.expression!r}")
        if isinstance(self.timezone, str) and len(self.timezone) > widths["timezone"]:
            raise ValueError(
                f"the time zone is longer than {widths['timezone']} characters: "
                f"{self.timezone[:40]!r}…"
            )
        try:
            zone = zoneinfo.ZoneInfo(self.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError) as exc:
            raise ValueError(f"unknown time zone {self.timezone!r}") from exc
        if self.misfire not in MISFIRE_POLICIES:
            raise ValueError(f"misfire must be one of {MISFIRE_POLICIES}, not {self.misfire!r}")
        if self.overlap not in OVERLAP_POLICIES:
            raise ValueError(f"overlap must be one of {OVERLAP_POLICIES}, not {self.overlap!r}")
        if (
            not isinstance(self.max_catch_up, int)
            or isinstance(self.max_catch_up, bool)
            or not 1 <= self.max_catch_up <= self.MAX_CATCH_UP
        ):
            raise ValueError(
                f"max_catch_up must be an integer from 1 to {self.MAX_CATCH_UP}, "
                f"not {self.max_catch_up!r}"
            )
        start = clock.now().astimezone(zone)
        try:
            it = croniter(self.expression, start, max_years_between_matches=self.SEARCH_YEARS)
            it.get_next(datetime)
        except (ValueError, OverflowError) as exc:  # croniter's errors are ValueErrors
            raise ValueError(
                f"cron expression {self.expression!r} has no occurrence in {self.timezone} "
                f"in the {self.SEARCH_YEARS} years after {start:%Y-%m-%d %H:%M}"
            ) from exc

    def validate_name(self, name: str) -> None:
        """The schedule's stream id (``cron:<name>``) must fit the event log's column."""
        width = limits.STREAM_ID - len(CRON_STREAM_PREFIX)
        if len(name) > width:
            raise ValueError(f"the name of a cron workflow has at most {width} characters")

    def canonical(self) -> dict[str, Any]:
        return {"kind": "cron", "expression": self.expression, "timezone": self.timezone}


@dataclass(frozen=True)
class ManualTrigger:
    """Started only by ``start_workflow()``."""

    def validate(self) -> None:
        pass

    def canonical(self) -> dict[str, Any]:
        return {"kind": "manual"}


#: The triggers a workflow can have.
TRIGGERS = (EventTrigger, CronTrigger, ManualTrigger)


def on_event(
    event_type: str,
    filter: Callable[[Any], bool] | None = None,  # noqa: A002
    *,
    key: str | Callable[[Any], Any] | None = None,
    debounce: str | None = None,
    max_wait: str | None = None,
    throttle: str | None = None,
) -> EventTrigger:
    """Start a run for each appended event of ``event_type`` (that ``filter``
    accepts); with ``debounce=`` or ``throttle=``, one per ``key`` (a string,
    or a function of the event) and period. See docs/flow-control.md."""
    return EventTrigger(event_type, filter, key, debounce, max_wait, throttle)


def on_cron(
    expression: str,
    timezone: str = "UTC",
    *,
    misfire: str = "latest",
    max_catch_up: int = 10,
    overlap: str = "allow",
) -> CronTrigger:
    """A cron trigger: croniter syntax (five fields, an optional sixth for
    seconds, ``@daily`` aliases) evaluated in an IANA time zone."""
    return CronTrigger(expression, timezone, misfire, max_catch_up, overlap)


def manual() -> ManualTrigger:
    return ManualTrigger()
