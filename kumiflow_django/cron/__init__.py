"""Cron schedules that fire each occurrence exactly once.

- :mod:`.occurrences`: a cron expression's instants in a time zone (DST rules);
- :mod:`.schedules`: syncing schedules with the registry, firing due ones,
  enabling, disabling, firing now.

The ``CronSchedule`` rows and their fold live in
:mod:`kumiflow_django.projections.schedules`. Imports the layers below,
up to the engine (firing starts runs).
"""

from __future__ import annotations

from kumiflow_django.store.deprecation import moved_names

# Names this package had as a module before 0.2, for code that imported them.
_MOVED = dict.fromkeys(
    ("fire_now", "set_enabled", "sync_schedules", "fire_schedule"), "kumiflow_django.cron.schedules"
) | dict.fromkeys(("occurrences", "next_occurrence"), "kumiflow_django.cron.occurrences")


__getattr__ = moved_names(__name__, _MOVED)
