"""Cron schedules: one row per cron-triggered workflow, a projection of its stream."""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _


class CronScheduleQuerySet(models.QuerySet["CronSchedule", "CronSchedule"]):
    def due(self, now: object) -> CronScheduleQuerySet:
        return self.filter(enabled=True, next_fire_at__lte=now)


class CronSchedule(models.Model):
    workflow = models.CharField(_("workflow"), max_length=200, primary_key=True)
    tenant_id = models.CharField(_("tenant"), max_length=64)
    expression = models.CharField(_("cron expression"), max_length=200)
    timezone = models.CharField(_("time zone"), max_length=64, default="UTC")
    misfire = models.CharField(_("misfire policy"), max_length=10, default="latest")
    max_catch_up = models.PositiveIntegerField(_("most missed occurrences fired"), default=10)
    overlap = models.CharField(_("overlap policy"), max_length=10, default="allow")
    enabled = models.BooleanField(_("enabled"), default=True)
    registered = models.BooleanField(_("workflow registered"), default=True)
    disabled_reason = models.CharField(_("why disabled"), max_length=200, blank=True)
    next_fire_at = models.DateTimeField(_("next fire at"), null=True, blank=True)
    last_fired_at = models.DateTimeField(_("last fired at"), null=True, blank=True)
    last_scheduled_for = models.DateTimeField(_("last occurrence"), null=True, blank=True)
    last_run_id = models.UUIDField(_("last run"), null=True, blank=True)
    fired_count = models.PositiveIntegerField(_("runs started"), default=0)
    skipped_count = models.PositiveIntegerField(_("occurrences skipped"), default=0)
    version = models.PositiveIntegerField(_("stream version"))
    updated_at = models.DateTimeField(_("updated at"))

    objects: ClassVar[CronScheduleQuerySet] = CronScheduleQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("cron schedule")
        verbose_name_plural = _("cron schedules")
        permissions = [("operate_cronschedule", "Can enable, disable and fire cron schedules")]
        indexes = [
            models.Index(fields=["next_fire_at"], name="kumiflow_cron_due_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow} ({self.expression} {self.timezone})"

    @property
    def stream_id(self) -> str:
        return f"cron:{self.workflow}"
