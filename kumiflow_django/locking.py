"""The one seam where backends differ in locking rows.

``SELECT … FOR UPDATE`` where the database has it, ``SKIP LOCKED`` where it
has that too; SQLite has neither and needs neither (its ``IMMEDIATE``
transactions let one writer in at a time). Everywhere, the stream versions
are the guard that holds: these locks only save work.
"""

from __future__ import annotations

from django.db import connection
from django.db.models import Model, QuerySet


def for_update[M: Model](qs: QuerySet[M, M], *, skip_locked: bool = False) -> QuerySet[M, M]:
    features = connection.features
    if not features.has_select_for_update:
        return qs
    return qs.select_for_update(
        skip_locked=skip_locked and features.has_select_for_update_skip_locked
    )
