"""The outbox: one row per requested side effect (mail, webhook, a custom kind)."""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _


class DispatchStatus(models.TextChoices):
    PENDING = "pending", _("pending")
    FAILED = "failed", _("failed, will retry")
    DELIVERED = "delivered", _("delivered")
    DEAD = "dead", _("dead")
    CANCELLED = "cancelled", _("cancelled")


#: Rows in these states are delivered when ``next_attempt_at`` has come.
DELIVERABLE = (DispatchStatus.PENDING, DispatchStatus.FAILED)


class DispatchQuerySet(models.QuerySet["Dispatch", "Dispatch"]):
    def due(self, now: object) -> DispatchQuerySet:
        """Rows to deliver now, from the ``next_attempt_at`` index alone: only
        deliverable rows have a next attempt. Callers re-check under lock."""
        return self.filter(next_attempt_at__lte=now)


class Dispatch(models.Model):
    id = models.UUIDField(_("dispatch id"), primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(_("tenant"), max_length=64)
    run_id = models.UUIDField(_("run"), null=True, blank=True)
    step_path = models.CharField(_("step"), max_length=200, blank=True)
    kind = models.CharField(_("kind"), max_length=50)
    status = models.CharField(_("status"), max_length=20, choices=DispatchStatus.choices)
    request = models.JSONField(_("request"), default=dict)
    retry = models.JSONField(_("retry policy"), default=dict)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    next_attempt_at = models.DateTimeField(_("next attempt at"), null=True, blank=True)
    last_error = models.TextField(_("last error"), blank=True)
    last_status_code = models.PositiveIntegerField(_("last status code"), null=True, blank=True)
    version = models.PositiveIntegerField(_("stream version"))
    created_at = models.DateTimeField(_("created at"))
    updated_at = models.DateTimeField(_("updated at"))
    delivered_at = models.DateTimeField(_("delivered at"), null=True, blank=True)

    objects: ClassVar[DispatchQuerySet] = DispatchQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("dispatch")
        verbose_name_plural = _("outbox")
        permissions = [
            ("redeliver_dispatch", "Can redeliver dead dispatches"),
            ("cancel_dispatch", "Can cancel pending dispatches"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=[c.value for c in DispatchStatus]),
                name="kumiflow_dispatch_status_valid",
            ),
        ]
        indexes = [
            models.Index(fields=["next_attempt_at"], name="kumiflow_dispatch_due_idx"),
            models.Index(fields=["run_id"], name="kumiflow_dispatch_run_idx"),
            models.Index(fields=["status", "-created_at"], name="kumiflow_dispatch_status_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"

    @property
    def idempotency_key(self) -> str:
        """Sent with every delivery attempt, so receivers can drop duplicates."""
        return str(self.id)
