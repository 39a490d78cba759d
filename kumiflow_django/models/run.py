"""The run projection: one row per run, kept in step with the run's stream."""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _


class RunStatus(models.TextChoices):
    PENDING = "pending", _("pending")
    RUNNING = "running", _("running")
    WAITING = "waiting", _("waiting")
    WAITING_EVENT = "waiting_event", _("waiting for event")
    RETRY_SCHEDULED = "retry_scheduled", _("retry scheduled")
    COMPLETED = "completed", _("completed")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")


#: A run in one of these states continues when its ``wake_at`` has come.
SUSPENDED = (
    RunStatus.PENDING,
    RunStatus.WAITING,
    RunStatus.WAITING_EVENT,
    RunStatus.RETRY_SCHEDULED,
)
FINISHED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class WorkflowRunQuerySet(models.QuerySet["WorkflowRun", "WorkflowRun"]):
    def due(self, now: object) -> WorkflowRunQuerySet:
        """Runs whose wake time has come, read from the ``wake_at`` index alone.

        Only suspended runs have a wake time (the projection clears it on every
        other state), so no status filter is needed, and none is added: it
        would tempt the planner into the status index. The number of finished
        runs therefore does not matter. Callers re-check the status under lock.
        """
        return self.filter(wake_at__lte=now)

    def awaiting(self, tenant: str, event_type: str, keys: list[str]) -> WorkflowRunQuerySet:
        return self.filter(
            tenant_id=tenant,
            awaited_event_type=event_type,
            correlation_key__in=keys,
            status=RunStatus.WAITING_EVENT,
        )

    def finished(self) -> WorkflowRunQuerySet:
        return self.filter(status__in=FINISHED)


class WorkflowRun(models.Model):
    id = models.UUIDField(_("run id"), primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(_("tenant"), max_length=64)
    workflow = models.CharField(_("workflow"), max_length=200)
    workflow_version = models.CharField(_("workflow version"), max_length=50, blank=True)
    fingerprint = models.CharField(_("definition fingerprint"), max_length=64)
    status = models.CharField(_("status"), max_length=20, choices=RunStatus.choices)
    start_mode = models.CharField(_("start mode"), max_length=10, default="inline")
    cursor = models.JSONField(_("cursor"), null=True, blank=True)
    state = models.JSONField(_("state"), default=dict)
    trail = models.JSONField(_("steps run"), default=list)
    wake_at = models.DateTimeField(_("wake at"), null=True, blank=True)
    awaited_event_type = models.CharField(_("awaited event"), max_length=200, blank=True)
    correlation_key = models.CharField(_("correlation key"), max_length=64, blank=True)
    awaited_match = models.JSONField(_("awaited match"), null=True, blank=True)
    since_position = models.BigIntegerField(_("started at position"), default=0)
    # Positions at or below ``since_position`` that were not visible when the
    # run started (transactions still open then): their events, once
    # committed, count as "after the start" too. See matching.gaps_below().
    since_gaps = models.JSONField(_("positions in flight at the start"), null=True, blank=True)
    awaited_after = models.BigIntegerField(_("awaits events after"), null=True, blank=True)
    matched_position = models.BigIntegerField(_("matched event"), null=True, blank=True)
    attempt = models.PositiveIntegerField(_("attempt"), default=1)
    last_error = models.TextField(_("last error"), blank=True)
    reason = models.CharField(_("reason"), max_length=64, blank=True)
    result = models.JSONField(_("result"), null=True, blank=True)
    input = models.JSONField(_("input"), null=True, blank=True)
    trigger_type = models.CharField(_("trigger type"), max_length=200, blank=True)
    trigger_position = models.BigIntegerField(_("trigger event"), null=True, blank=True)
    # NULL, not "": unique per (tenant, workflow) among keyed runs only.
    idempotency_key = models.CharField(  # noqa: DJ001
        _("idempotency key"), max_length=200, null=True, blank=True
    )
    version = models.PositiveIntegerField(_("stream version"))
    recoveries = models.PositiveIntegerField(_("stalled recoveries"), default=0)
    # Operational, not projected from the log: which worker is running the
    # run's next segment, until when. Cleared when the segment commits.
    lease_owner = models.CharField(_("leased by"), max_length=100, blank=True)
    lease_until = models.DateTimeField(_("lease until"), null=True, blank=True)
    started_at = models.DateTimeField(_("started at"))
    updated_at = models.DateTimeField(_("updated at"))
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    objects: ClassVar[WorkflowRunQuerySet] = WorkflowRunQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("workflow run")
        verbose_name_plural = _("workflow runs")
        permissions = [
            ("cancel_workflowrun", "Can cancel workflow runs"),
            ("retry_workflowrun", "Can retry failed workflow runs"),
            ("wake_workflowrun", "Can wake waiting workflow runs"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "workflow", "idempotency_key"],
                name="kumiflow_run_idempotency_uq",
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=[c.value for c in RunStatus]),
                name="kumiflow_run_status_valid",
            ),
        ]
        indexes = [
            # "Due now": finished runs have no wake time, so they are not in
            # the index range the resume loop reads.
            models.Index(fields=["wake_at"], name="kumiflow_run_due_idx"),
            # Runs waiting for an event like this one (and the admin's search
            # by correlation value, hence the key first).
            models.Index(
                fields=["correlation_key", "awaited_event_type", "tenant_id"],
                name="kumiflow_run_awaiting_idx",
            ),
            models.Index(fields=["-started_at"], name="kumiflow_run_started_idx"),
            models.Index(fields=["workflow", "status"], name="kumiflow_run_workflow_idx"),
            models.Index(fields=["status", "-started_at"], name="kumiflow_run_status_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow} {self.id} ({self.status})"

    @property
    def cursor_text(self) -> str:
        return ".".join(str(p) for p in self.cursor) if self.cursor else ""
