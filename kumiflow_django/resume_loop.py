"""The resume loop: finds due runs through the ``wake_at`` index and resumes them.

Each run is resumed in its own transaction, claimed with ``SELECT … FOR
UPDATE SKIP LOCKED`` where the database has it and guarded everywhere by the
run stream's version: any number of loops may run against one database.

Before the segment, the loop also writes a lease on the row (worker id and
an expiry) in a short transaction of its own; the segment clears it when it
commits. A lease left behind means the worker died in the middle of the
segment (its transaction was rolled back): once the lease has expired,
another worker resumes the run and records the recovery in the run's
stream, where the admin shows it.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import uuid
from datetime import datetime, timedelta

from kumiflow_django import clock
from kumiflow_django.conf import settings
from kumiflow_django.durations import isoformat
from kumiflow_django.loop import Loop
from kumiflow_django.models.run import WorkflowRun
from kumiflow_django.resuming import resume_run

logger = logging.getLogger("kumiflow_django.resume")


Due = tuple[uuid.UUID, int, str, datetime | None]


def due_runs(now: datetime, limit: int) -> list[Due]:
    """(id, version, lease owner, lease expiry) of due runs, earliest first:
    one indexed range read."""
    return list(
        WorkflowRun.objects.due(now)
        .order_by("wake_at")
        .values_list("id", "version", "lease_owner", "lease_until")[:limit]
    )


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"


class ResumeLoop(Loop):
    name = "resume"
    kinds = ("resume",)

    def __init__(
        self, *, worker_id: str | None = None, batch_size: int = 100, max_interval: float = 5.0
    ) -> None:
        super().__init__(batch_size=batch_size, max_interval=max_interval)
        self.worker_id = worker_id or default_worker_id()

    def _claim(self, run_id: uuid.UUID, version: int, seen_owner: str, now: datetime) -> bool:
        lease_until = now + timedelta(seconds=settings.LEASE_SECONDS)
        return bool(
            WorkflowRun.objects.filter(pk=run_id, version=version, lease_owner=seen_owner).update(
                lease_owner=self.worker_id, lease_until=lease_until
            )
        )

    def _release(self, run_id: uuid.UUID) -> None:
        WorkflowRun.objects.filter(pk=run_id, lease_owner=self.worker_id).update(
            lease_owner="", lease_until=None
        )

    def run_once(self) -> int:
        resumed = 0
        now = clock.now()
        for run_id, version, owner, until in due_runs(now, self.batch_size):
            if self.stopping:
                break
            recovered = None
            if owner and owner != self.worker_id:
                if until is not None and until > now:
                    continue  # another worker is on it
                recovered = {"from": owner, "lease_until": isoformat(until) if until else None}
            if not self._claim(run_id, version, owner, now):
                continue
            if recovered:
                logger.warning(
                    "run %s: taking over from %s, whose lease expired", run_id, recovered["from"]
                )
            try:
                run = resume_run(
                    run_id, skip_locked=True, expected_version=version, recovered=recovered
                )
            except Exception:
                # A database error (not a step error: those fail the run). The
                # transaction was rolled back; the run stays due and is retried.
                logger.exception("run %s: resume failed; it stays due", run_id)
                run = None
            if run is None:
                self._release(run_id)
            else:
                resumed += 1
        return resumed

    def next_due(self) -> datetime | None:
        return (
            WorkflowRun.objects.filter(wake_at__isnull=False)
            .order_by("wake_at")
            .values_list("wake_at", flat=True)
            .first()
        )
