"""Rebuilding every projection from the log (``manage.py kumiflow_rebuild``).

The run table and the outbox are replayed stream by stream through the same
reducers the engine uses live; user projections are reset and replayed in
log order. All in one transaction: readers see the old tables or the new.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import models

from kumiflow_django.projections import (
    attributes,
    dispatches,
    pauses,
    runs,
    schedules,
    tasks,
    waits,
)
from kumiflow_django.projections.stream import Stream
from kumiflow_django.projections.user import projections
from kumiflow_django.store import clock, db
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import Event
from kumiflow_django.store.telemetry import get_logger

logger = get_logger("kumiflow_django.projections.rebuild")

BATCH = 1000


def _replay[M: models.Model](kind: Stream[M], types: Iterable[str]) -> int:
    """Fold every stream of one kind from the log into fresh rows."""
    model = kind.model
    count = 0
    batch: list[M] = []
    current: M | None = None
    stream: tuple[str, str] | None = None
    # A stream is (tenant, stream id): the order of the log's unique index.
    events = Event.objects.filter(type__in=list(types)).order_by(
        "tenant_id", "stream_id", "version"
    )
    for event in events.iterator(chunk_size=2000):
        if (event.tenant_id, event.stream_id) != stream:
            if current is not None:
                batch.append(current)
            current, stream = None, (event.tenant_id, event.stream_id)
            if len(batch) >= BATCH:
                model._default_manager.bulk_create(batch)
                count += len(batch)
                batch = []
        current = kind.fold(current, event)
    if current is not None:
        batch.append(current)
    model._default_manager.bulk_create(batch)
    return count + len(batch)


def _rebuild_waits() -> int:
    """The events waiting runs await (their own wait or their branches'), from
    each run's last suspension for events (or the retry that restored one)."""
    waits.RunWait.objects.all().delete()
    count = 0
    waiting = runs.WorkflowRun.objects.filter(
        models.Q(status=runs.RunStatus.WAITING_EVENT) | models.Q(branch_waits__gt=0)
    )
    for run_id, tenant, version in waiting.values_list("id", "tenant_id", "version"):
        last = (
            Event.objects.filter(
                tenant_id=tenant,
                stream_id=str(run_id),
                type__in=[ev.STEP_WAITING_FOR_EVENT, ev.STEP_WAITING_BRANCHES, ev.RUN_RETRIED],
                version__lte=version,
            )
            .order_by("-version")
            .first()
        )
        found = waits.waits_of(last) if last is not None else []
        waits.sync(run_id, tenant, found, had=False)
        count += len(found)
    return count


def _rebuild_attributes() -> int:
    """The search attribute index, from the rebuilt run rows' attributes."""
    attributes.RunAttribute.objects.all().delete()
    count = 0
    batch: list[runs.WorkflowRun] = []
    # Every row is read (a JSON "is empty" filter differs per vendor): only
    # the columns the index needs.
    rows = runs.WorkflowRun.objects.only(
        "id", "tenant_id", "workflow", "attributes", "started_at", "parent_id"
    )
    for run in rows.iterator(chunk_size=2000):
        if not run.attributes:
            continue
        batch.append(run)
        if len(batch) >= BATCH:
            count += attributes.reindex(batch, fresh=True)
            batch = []
    return count + attributes.reindex(batch, fresh=True)


def _recheck_queued() -> int:
    """Runs parked behind a full key have no wake time, and the keys' counts of
    parked runs are not in the log: a rebuilt table makes every parked run due,
    so the worker admits it or parks it again (counted)."""
    return runs.WorkflowRun.objects.filter(
        status=runs.RunStatus.QUEUED, wake_at__isnull=True
    ).update(wake_at=clock.now())


def rebuild_all() -> dict[str, int]:
    """Rebuild runs, the outbox, the schedules and every user projection; return counts."""
    counts: dict[str, Any] = {}
    with db.atomic():
        streams: list[tuple[str, Stream[Any], frozenset[str]]] = [
            ("runs", runs.RUNS, ev.RUN_EVENTS),
            ("dispatches", dispatches.DISPATCHES, ev.DISPATCH_EVENTS),
            ("schedules", schedules.SCHEDULES, ev.CRON_EVENTS),
            ("tasks", tasks.TASKS, ev.TASK_EVENTS),
            ("paused scopes", pauses.PAUSES, ev.PAUSE_EVENTS),
        ]
        for name, stream, types in streams:
            stream.model._default_manager.all().delete()
            counts[name] = _replay(stream, types)
        counts["waits"] = _rebuild_waits()
        counts["search attributes"] = _rebuild_attributes()
        counts["queued runs checked again"] = _recheck_queued()
        for projection in projections.values():
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
