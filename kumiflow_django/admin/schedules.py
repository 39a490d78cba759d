"""Cron schedules: enable, disable and fire now, through ``kumiflow_django.cron.schedules``,
each through a confirmation page with the operator and a reason."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote, unquote
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from kumiflow_django.admin.base import ReadOnlyAdmin, badge
from kumiflow_django.admin.confirm import Operation, bulk, operate_view
from kumiflow_django.admin.display import plain_when, when_short
from kumiflow_django.admin.timeline import stream_context
from kumiflow_django.cron import schedules as cron
from kumiflow_django.projections.schedules import CronSchedule

OPERATIONS = {
    "fire": Operation(
        name="fire",
        label="Fire now",
        permission="operate_cronschedule",
        done="fired",
        refuse=lambda s: cron.refuse_fire_now(s.workflow),
        explain=lambda s: [
            f"A run of {s.workflow} starts now, outside its schedule, as if an occurrence "
            "were due now (its idempotency key marks it as fired by hand).",
            f"The schedule itself does not change: its next occurrence stays "
            f"{plain_when(s.next_fire_at)}.",
        ],
        perform=lambda s, by, reason: cron.fire_now(s.workflow, by=by, reason=reason),
    ),
    "enable": Operation(
        name="enable",
        label="Enable",
        permission="operate_cronschedule",
        done="enabled",
        refuse=lambda s: cron.refuse_set_enabled(s, True),
        explain=lambda s: [
            f"{s.workflow} fires again from its next occurrence after now "
            f"({s.expression}, {s.timezone}).",
            "Occurrences missed while it was disabled are not caught up.",
        ],
        perform=lambda s, by, reason: cron.set_enabled(s.workflow, True, by=by, reason=reason),
    ),
    "disable": Operation(
        name="disable",
        label="Disable",
        permission="operate_cronschedule",
        done="disabled",
        refuse=lambda s: cron.refuse_set_enabled(s, False),
        explain=lambda s: [
            f"{s.workflow} stops firing (its next occurrence was {plain_when(s.next_fire_at)}).",
            "It stays disabled until someone enables it; a deploy does not enable it. Runs "
            "already started go on.",
        ],
        perform=lambda s, by, reason: cron.set_enabled(
            s.workflow, False, by=by, reason=reason or f"disabled by {by}"
        ),
        danger=True,
    ),
}


@admin.register(CronSchedule)
class CronScheduleAdmin(ReadOnlyAdmin):
    list_display = ["workflow", "schedule", "state", "next_fire", "last_fired"]
    list_filter = ["enabled"]
    ordering = ["workflow"]
    actions = ["enable", "disable", "fire_now"]
    operations = OPERATIONS
    change_form_template = "kumiflow/change_form_operations.html"

    @admin.display(description="schedule", ordering="expression")
    def schedule(self, schedule: CronSchedule) -> SafeString:
        return format_html(
            '<code>{}</code><span class="kf-sub">{} · misfire {} · overlap {}</span>',
            schedule.expression,
            schedule.timezone,
            schedule.misfire,
            schedule.overlap,
        )

    @admin.display(description="enabled", ordering="enabled")
    def state(self, schedule: CronSchedule) -> SafeString:
        if schedule.enabled:
            return badge("completed", "enabled")
        return format_html(
            '{}<span class="kf-sub kf-key" title="{}">{}</span>',
            badge(
                "failed" if schedule.disabled_reason.startswith("broken") else "cancelled",
                "disabled",
            ),
            schedule.disabled_reason,
            schedule.disabled_reason,
        )

    @admin.display(description="next fire", ordering="next_fire_at")
    def next_fire(self, schedule: CronSchedule) -> SafeString | str:
        return when_short(schedule.next_fire_at)

    @admin.display(description="last fired", ordering="last_fired_at")
    def last_fired(self, schedule: CronSchedule) -> SafeString | str:
        counts = format_html(
            '<span class="kf-sub">{} run(s) started, {} skipped</span>',
            schedule.fired_count,
            schedule.skipped_count,
        )
        return format_html("{}{}", when_short(schedule.last_fired_at) or "never", counts)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "operate_cronschedule")

    @admin.action(description="Enable selected schedules", permissions=["operate"])
    def enable(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return bulk(self, request, queryset, "enable", "enable")

    @admin.action(description="Disable selected schedules", permissions=["operate"])
    def disable(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return bulk(self, request, queryset, "disable", "disable")

    @admin.action(description="Fire selected schedules now", permissions=["operate"])
    def fire_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return bulk(self, request, queryset, "fire", "fire_now")

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        schedule = self.get_object(request, unquote(object_id))  # None: Django's redirect
        context: dict[str, Any] = {
            "kf_operations": []
            if schedule is None
            else [
                (
                    reverse("admin:kumiflow_cronschedule_operate", args=[quote(schedule.pk), name]),
                    op.label,
                )
                for name, op in self.operations.items()
                if op.refuse(schedule) is None and self.user_can(request, op.permission)
            ]
        }
        if schedule is not None:
            context.update(stream_context(schedule.stream_id, schedule.tenant_id))
        return super().change_view(
            request, object_id, form_url, {**context, **(extra_context or {})}
        )

    def get_urls(self) -> list[Any]:
        urls = [
            path(
                "<path:object_id>/operate/<str:operation>/",
                self.admin_site.admin_view(self.operate_view),
                name="kumiflow_cronschedule_operate",
            )
        ]
        return urls + super().get_urls()

    def operate_view(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        return operate_view(
            self, request, object_id, operation, title=lambda s: f"Schedule {s.workflow}"
        )
