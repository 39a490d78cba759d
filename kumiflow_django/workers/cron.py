"""The cron loop: syncs the schedules with the registry, then fires due ones."""

from __future__ import annotations

from datetime import datetime

from kumiflow_django.cron.schedules import fire_schedule, sync_schedules
from kumiflow_django.projections.schedules import CronSchedule
from kumiflow_django.store import clock, db, sql
from kumiflow_django.store.telemetry import get_logger
from kumiflow_django.store.wakeups import WorkKind
from kumiflow_django.workers.loop import Loop

logger = get_logger("kumiflow_django.cron.schedules")


class CronLoop(Loop):
    name = "cron"
    kinds = (WorkKind.CRON,)

    def __init__(self, *, batch_size: int = 100, max_interval: float = 5.0) -> None:
        super().__init__(batch_size=batch_size, max_interval=max_interval)
        self._synced = False

    def run_once(self) -> int:
        if not self._synced:
            # A schedule that fails to sync is disabled inside; what still raises
            # here is the database itself. The due schedules fire all the same.
            try:
                sync_schedules()
            except Exception as exc:
                if db.is_transient(exc):
                    raise  # the database is away: the loop's outage says so, once
                logger.exception("cron: syncing the schedules failed; trying again next poll")
            else:
                self._synced = True
        fired = 0
        due = sql.values(
            ("due cron", self.batch_size),
            lambda: (
                CronSchedule.objects.due(sql.NOW)
                .order_by("next_fire_at")
                .values_list("workflow", "version")[: self.batch_size]
            ),
            using=sql.routed(CronSchedule),
            now=clock.now(),
        )
        for workflow, version in due:
            if self.stopping:
                break
            try:
                fired += fire_schedule(workflow, version)  # disables a schedule that raises
            except Exception as exc:
                if db.is_transient(exc):
                    raise  # the database is away: the loop's outage says so, once
                logger.exception("cron %s: firing failed; it stays due", workflow)
        return fired

    def next_due(self) -> datetime | None:
        rows = sql.values(
            "next cron",
            lambda: (
                CronSchedule.objects.filter(enabled=True, next_fire_at__isnull=False)
                .order_by("next_fire_at")
                .values_list("next_fire_at")[:1]
            ),
            using=sql.routed(CronSchedule),
        )
        return rows[0][0] if rows else None
