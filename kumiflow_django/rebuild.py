"""Rebuilding every projection from the log (``manage.py kumiflow_rebuild``).

The run table and the outbox are replayed stream by stream through the same
reducers the engine uses live; user projections are reset and replayed in
log order. All in one transaction: readers see the old tables or the new.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from django.db import models, transaction

from kumiflow_django import cron, outbox, projections, runs
from kumiflow_django import run_events as ev
from kumiflow_django.models.cron import CronSchedule
from kumiflow_django.models.dispatch import Dispatch
from kumiflow_django.models.event import Event
from kumiflow_django.models.run import WorkflowRun

logger = logging.getLogger("kumiflow_django.rebuild")

BATCH = 1000


def _replay[M: models.Model](
    types: Iterable[str],
    reducer: Callable[[M | None, Event], M],
    model: type[M],
) -> int:
    count = 0
    batch: list[M] = []
    current: M | None = None
    stream: str | None = None
    events = Event.objects.filter(type__in=list(types)).order_by("stream_id", "version")
    for event in events.iterator(chunk_size=2000):
        if event.stream_id != stream:
            if current is not None:
                batch.append(current)
            current, stream = None, event.stream_id
            if len(batch) >= BATCH:
                model._default_manager.bulk_create(batch)
                count += len(batch)
                batch = []
        current = reducer(current, event)
    if current is not None:
        batch.append(current)
    model._default_manager.bulk_create(batch)
    return count + len(batch)


def rebuild_all() -> dict[str, int]:
    """Rebuild runs, the outbox and every user projection; return counts."""
    counts: dict[str, Any] = {}
    with transaction.atomic():
        WorkflowRun.objects.all().delete()
        counts["runs"] = _replay(ev.RUN_EVENTS, runs.apply, WorkflowRun)
        Dispatch.objects.all().delete()
        counts["dispatches"] = _replay(ev.DISPATCH_EVENTS, outbox.apply, Dispatch)
        CronSchedule.objects.all().delete()
        counts["schedules"] = _replay(ev.CRON_EVENTS, cron.apply, CronSchedule)
        for projection in projections.projections():
            if not projection.rebuildable:
                continue
            if projection.reset is not None:
                projection.reset()
            qs = Event.objects.order_by("position")
            if "*" not in projection.types:
                qs = qs.filter(type__in=list(projection.types))
            n = 0
            for event in qs.iterator(chunk_size=2000):
                projection.handle(event)
                n += 1
            counts[f"projection:{projection.name}"] = n
    logger.info("rebuilt projections: %s", counts)
    return counts
