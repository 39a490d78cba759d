"""Cron schedules: enable, disable and fire now, through ``kumiflow_django.cron.schedules``."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from kumiflow_django.admin.base import ReadOnlyAdmin, apply_each
from kumiflow_django.cron import schedules as cron
from kumiflow_django.projections.schedules import CronSchedule
from kumiflow_django.store.errors import KumiflowError


@admin.register(CronSchedule)
class CronScheduleAdmin(ReadOnlyAdmin):
    list_display = [
        "workflow",
        "expression",
        "timezone",
        "enabled",
        "next_fire_at",
        "last_fired_at",
        "fired_count",
        "skipped_count",
        "misfire",
        "overlap",
        "disabled_reason",
    ]
    list_filter = ["enabled"]
    ordering = ["workflow"]
    actions = ["enable", "disable", "fire_now"]

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "operate_cronschedule")

    @admin.action(description="Enable selected schedules", permissions=["operate"])
    def enable(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        done, skipped = apply_each(
            queryset, lambda s: cron.set_enabled(s.workflow, True), (KumiflowError,)
        )
        self.report(request, "enabled", done, skipped)

    @admin.action(description="Disable selected schedules", permissions=["operate"])
    def disable(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        done, skipped = apply_each(
            queryset,
            lambda s: cron.set_enabled(s.workflow, False, reason=f"disabled by {request.user}"),
            (KumiflowError,),
        )
        self.report(request, "disabled", done, skipped)

    @admin.action(description="Fire selected schedules now", permissions=["operate"])
    def fire_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        done, skipped = apply_each(queryset, lambda s: cron.fire_now(s.workflow), (KumiflowError,))
        self.report(request, "fired", done, skipped)
