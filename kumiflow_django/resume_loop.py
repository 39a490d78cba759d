"""The resume loop: finds due runs through the ``wake_at`` index and resumes them.

Each run is resumed in its own transaction, claimed with ``SELECT … FOR
UPDATE SKIP LOCKED`` where the database has it and guarded everywhere by the
run stream's version: any number of loops may run against one database.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from kumiflow_django import clock
from kumiflow_django.loop import Loop
from kumiflow_django.models.run import WorkflowRun
from kumiflow_django.resuming import resume_run

logger = logging.getLogger("kumiflow_django.resume")


def due_runs(now: datetime, limit: int) -> list[tuple[uuid.UUID, int]]:
    """(id, version) of due runs, earliest first: one indexed range read."""
    return list(
        WorkflowRun.objects.due(now).order_by("wake_at").values_list("id", "version")[:limit]
    )


class ResumeLoop(Loop):
    name = "resume"
    kinds = ("resume",)

    def run_once(self) -> int:
        resumed = 0
        for run_id, version in due_runs(clock.now(), self.batch_size):
            if self.stopping:
                break
            try:
                run = resume_run(run_id, skip_locked=True, expected_version=version)
            except Exception:
                # A database error (not a step error: those fail the run). The
                # transaction was rolled back; the run stays due and is retried.
                logger.exception("run %s: resume failed; it stays due", run_id)
                continue
            if run is not None:
                resumed += 1
        return resumed

    def next_due(self) -> datetime | None:
        return (
            WorkflowRun.objects.filter(wake_at__isnull=False)
            .order_by("wake_at")
            .values_list("wake_at", flat=True)
            .first()
        )
