"""A cron expression's occurrences, in a time zone.

Occurrences are computed in the schedule's IANA zone. A local time that does
not exist (spring forward) fires at the first instant after the gap; a local
time that happens twice (fall back) fires once, at its first occurrence.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

from kumiflow_django.definition.durations import isoformat
from kumiflow_django.definition.triggers import CronTrigger


def occurrences(expression: str, timezone: str, after: datetime) -> Iterator[datetime]:
    """Occurrences strictly after ``after``, as aware UTC datetimes. The sequence
    ends where croniter finds none within ``CronTrigger.SEARCH_YEARS`` years (a
    year field that has run out)."""
    tz = ZoneInfo(timezone)
    local_after = after.astimezone(tz)
    it = croniter(expression, local_after, max_years_between_matches=CronTrigger.SEARCH_YEARS)
    last_wall = local_after.replace(tzinfo=None)
    while True:
        try:
            local = it.get_next(datetime)
        except CroniterBadDateError:
            return
        wall = local.replace(tzinfo=None)
        if wall <= last_wall:
            continue  # the repeated hour of a fall-back change: fired already
        last_wall = wall
        yield local.astimezone(UTC)


def next_occurrence(expression: str, timezone: str, after: datetime) -> datetime:
    for occurrence in occurrences(expression, timezone, after):
        return occurrence
    raise ValueError(
        f"{expression!r} has no occurrence in {timezone} after {isoformat(after)} "
        f"(croniter looks {CronTrigger.SEARCH_YEARS} years ahead)"
    )
