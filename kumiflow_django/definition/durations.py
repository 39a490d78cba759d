"""ISO 8601 durations and instants: what ``wait`` and timeouts accept.

A duration is ``P[nY][nM][nW][nD][T[nH][nM][n[.f]S]]`` (a year counts 365
days and a month 30 days, as in the reference), a ``timedelta``, an aware
``datetime`` or an ISO instant string.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

_DURATION = re.compile(
    r"^P(?!$)(?:(?P<Y>\d+)Y)?(?:(?P<Mo>\d+)M)?(?:(?P<W>\d+)W)?(?:(?P<D>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<H>\d+)H)?(?:(?P<Mi>\d+)M)?(?:(?P<S>\d+(?:\.\d+)?)S)?)?$"
)


def parse_duration(text: str) -> timedelta:
    """An ISO 8601 duration; raises ValueError naming the text."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"invalid ISO 8601 duration: {text!r} (expected e.g. 'P1D', 'PT1H30M')")
    g = {k: v for k, v in match.groupdict().items() if v is not None}
    days = int(g.get("Y", 0)) * 365 + int(g.get("Mo", 0)) * 30 + int(g.get("W", 0)) * 7
    try:
        return timedelta(
            days=days + int(g.get("D", 0)),
            hours=int(g.get("H", 0)),
            minutes=int(g.get("Mi", 0)),
            seconds=float(g.get("S", 0)),
        )
    except OverflowError:
        raise ValueError(f"duration {text!r} is too long") from None


def parse_instant(text: str) -> datetime:
    """An aware ISO 8601 instant; a naive one is refused, not guessed."""
    try:
        value = datetime.fromisoformat(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid ISO 8601 instant: {text!r}") from exc
    if value.tzinfo is None:
        raise ValueError(f"instant {text!r} has no time zone (add 'Z' or an offset)")
    return value.astimezone(UTC)


def check_when(value: Any) -> None:
    """Raise ValueError unless ``value`` is a valid static duration or instant."""
    if callable(value):
        return
    to_deadline(value, datetime(2000, 1, 1, tzinfo=UTC))


def to_deadline(value: Any, now: datetime) -> datetime:
    """The instant a duration (from ``now``) or an absolute time stands for."""
    try:
        return _deadline(value, now)
    except OverflowError:
        raise ValueError(f"{value!r} lies beyond the year 9999") from None


def _deadline(value: Any, now: datetime) -> datetime:
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise ValueError(f"a duration must not be negative: {value}")
        return now + value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"datetime {value} has no time zone")
        return value.astimezone(UTC)
    if isinstance(value, str):
        if value.startswith("P"):
            return now + parse_duration(value)
        return parse_instant(value)
    raise ValueError(
        f"expected an ISO 8601 duration, a timedelta, an aware datetime or an ISO instant, "
        f"not {type(value).__name__}: {value!r}"
    )


def isoformat(value: datetime) -> str:
    """An instant as ISO 8601 in UTC with a ``Z``."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
