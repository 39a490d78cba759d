"""Cron schedules: one ``CronSchedule`` row per cron-triggered workflow, a
projection of its stream (``cron:<workflow>``).

:func:`apply` is the fold, shared by the cron loop and ``kumiflow_rebuild``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from kumiflow_django.definition.durations import parse_instant
from kumiflow_django.projections.stream import Change, Stream, write_one
from kumiflow_django.store import clock, limits
from kumiflow_django.store import names as ev
from kumiflow_django.store import payloads as pl
from kumiflow_django.store.models import EngineManager, Event

#: How ``disabled_reason`` starts when the engine disabled a schedule itself
#: because it could not compute or fire it. Only such a schedule (or one whose
#: workflow was gone) is enabled again by a changed definition; a schedule an
#: operator disabled stays disabled until an operator enables it.
BROKEN = "broken: "
NOT_REGISTERED = "workflow not registered"


def fit(reason: str) -> str:
    """A reason on one line, cut to the width of ``disabled_reason``."""
    width = limits.DISABLED_REASON
    text = " ".join(reason.split())
    return text if len(text) <= width else text[: width - 1] + "…"


class CronScheduleQuerySet(models.QuerySet["CronSchedule", "CronSchedule"]):
    def due(self, now: object) -> CronScheduleQuerySet:
        return self.filter(enabled=True, next_fire_at__lte=now)


class CronSchedule(models.Model):
    workflow = models.CharField(_("workflow"), max_length=limits.WORKFLOW_NAME, primary_key=True)
    tenant_id = models.CharField(_("tenant"), max_length=limits.TENANT)
    expression = models.CharField(_("cron expression"), max_length=limits.CRON_EXPRESSION)
    timezone = models.CharField(_("time zone"), max_length=limits.TIME_ZONE, default="UTC")
    misfire = models.CharField(_("misfire policy"), max_length=10, default="latest")
    max_catch_up = models.PositiveIntegerField(_("most missed occurrences fired"), default=10)
    overlap = models.CharField(_("overlap policy"), max_length=10, default="allow")
    enabled = models.BooleanField(_("enabled"), default=True)
    registered = models.BooleanField(_("workflow registered"), default=True)
    disabled_reason = models.CharField(
        _("why disabled"), max_length=limits.DISABLED_REASON, blank=True
    )
    next_fire_at = models.DateTimeField(_("next fire at"), null=True, blank=True)
    last_fired_at = models.DateTimeField(_("last fired at"), null=True, blank=True)
    last_scheduled_for = models.DateTimeField(_("last occurrence"), null=True, blank=True)
    last_run_id = models.UUIDField(_("last run"), null=True, blank=True)
    fired_count = models.PositiveIntegerField(_("runs started"), default=0)
    skipped_count = models.PositiveIntegerField(_("occurrences skipped"), default=0)
    version = models.PositiveIntegerField(_("stream version"))
    updated_at = models.DateTimeField(_("updated at"))

    objects: ClassVar[CronScheduleQuerySet] = EngineManager.from_queryset(CronScheduleQuerySet)()  # type: ignore[assignment]

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
        return f"{ev.CRON_STREAM_PREFIX}{self.workflow}"


# -- the fold ---------------------------------------------------------------


def _defined(schedule: CronSchedule, event: Event) -> None:
    """``schedule-registered`` and ``schedule-changed``."""
    p: pl.CronDefinition = event.payload
    schedule.expression = p["expression"]
    schedule.timezone = p["timezone"]
    schedule.misfire = p["misfire"]
    schedule.max_catch_up = p["max_catch_up"]
    schedule.overlap = p["overlap"]
    schedule.registered = True
    reason = schedule.disabled_reason
    fixed = reason.startswith(BROKEN) and bool(p.get("next_fire_at"))
    if reason == NOT_REGISTERED or fixed:
        schedule.enabled, schedule.disabled_reason = True, ""


def _removed(schedule: CronSchedule, event: Event) -> None:
    p: pl.CronRemoved = event.payload
    schedule.registered = False
    schedule.enabled = False
    schedule.disabled_reason = fit(p["reason"])


def _fired(schedule: CronSchedule, event: Event) -> None:
    p: pl.CronFired = event.payload
    schedule.last_fired_at = event.created_at
    if p["scheduled_for"]:
        schedule.last_scheduled_for = parse_instant(p["scheduled_for"][-1])
    if p["run_ids"]:
        schedule.last_run_id = p["run_ids"][-1]
    schedule.fired_count += len(p["run_ids"])
    schedule.skipped_count += p.get("skipped", 0)


def _skipped(schedule: CronSchedule, event: Event) -> None:
    p: pl.CronSkipped = event.payload
    schedule.skipped_count += p["skipped"]


def _enabled(schedule: CronSchedule, event: Event) -> None:
    schedule.enabled = True
    schedule.disabled_reason = ""


def _disabled(schedule: CronSchedule, event: Event) -> None:
    p: pl.CronDisabled = event.payload
    schedule.enabled = False
    schedule.disabled_reason = fit(p.get("reason") or "disabled by an operator")


#: How each schedule event changes the row, after :func:`apply` set its version
#: and, where the payload has one, its next fire time.
FOLD: dict[str, Callable[[CronSchedule, Event], None]] = {
    ev.CRON_REGISTERED: _defined,
    ev.CRON_CHANGED: _defined,
    ev.CRON_REMOVED: _removed,
    ev.CRON_FIRED: _fired,
    ev.CRON_SKIPPED: _skipped,
    ev.CRON_ENABLED: _enabled,
    ev.CRON_DISABLED: _disabled,
}


def apply(schedule: CronSchedule | None, event: Event) -> CronSchedule:
    """The schedule row after ``event`` (the cron projection)."""
    p = event.payload
    if event.type == ev.CRON_REGISTERED:
        schedule = CronSchedule(workflow=event.stream_id.removeprefix(ev.CRON_STREAM_PREFIX))
        schedule.tenant_id = event.tenant_id
    if schedule is None:
        raise ValueError(f"event {event.type} precedes schedule-registered")
    schedule.version = event.version
    schedule.updated_at = event.created_at
    if "next_fire_at" in p:
        schedule.next_fire_at = parse_instant(p["next_fire_at"]) if p["next_fire_at"] else None
    handler = FOLD.get(event.type)
    if handler is not None:
        handler(schedule, event)
    return schedule


#: The schedule streams (``cron:<workflow>``).
SCHEDULES = Stream(ev.CRON_STREAM, CronSchedule, apply)


def append(
    schedule: CronSchedule | None,
    workflow: str,
    tenant: str,
    type_: str,
    payload: pl.Payload,
    *,
    created_by: str = "",
) -> CronSchedule:
    """Append one event to a schedule's stream (``schedule`` None: a new one), fold
    it and write it, in the caller's transaction."""
    change = Change(
        SCHEDULES, f"{ev.CRON_STREAM_PREFIX}{workflow}", tenant, schedule, now=clock.now()
    )
    change.add(type_, payload, created_by=created_by)
    return write_one(change)
