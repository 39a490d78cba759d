"""Flow control in the console: keys with their active and queued work, rate
buckets (and what a throttle skipped), and the operator's limit overrides.

Keys and buckets are read-only. An override is changed through
:func:`kumiflow_django.set_flow_limit` (the same function code calls): it
records who changed it and wakes what the scope has parked.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from kumiflow_django.admin.base import InputFilter, ReadOnlyAdmin
from kumiflow_django.flow.gates import ACTIVE
from kumiflow_django.flow.limits import set_flow_limit
from kumiflow_django.flow.models import FlowKey, FlowLimit, RateBucket
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.projections.tasks import StepTask, TaskStatus


class FlowScopeFilter(InputFilter):
    """Runs of a limited scope (the flow keys' links use it)."""

    title = "limit scope"
    parameter_name = "flow_scope"
    field = "flow_scope"


class FlowKeyFilter(InputFilter):
    title = "limit key"
    parameter_name = "flow_key"
    field = "flow_key"


def _count(qs: QuerySet[Any]) -> Coalesce:
    counted = (
        qs.filter(flow_scope=OuterRef("scope"), flow_key=OuterRef("key"))
        .order_by()
        .values("flow_key")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


@admin.register(FlowKey)
class FlowKeyAdmin(ReadOnlyAdmin):
    """Per key of a limited scope: its active runs, its queued runs, its
    running and parked task attempts."""

    list_display = ["scope", "key", "active_runs", "queued_runs", "running_tasks", "parked_tasks"]
    search_fields = ["scope", "key"]
    list_per_page = 50
    ordering = ["scope", "key"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[FlowKey]:
        runs = WorkflowRun.objects.all()
        tasks = StepTask.objects.all()
        keys: QuerySet[FlowKey] = super().get_queryset(request)
        return keys.annotate(
            n_active=_count(runs.filter(status__in=ACTIVE)),
            n_queued=_count(runs.filter(status=RunStatus.QUEUED)),
            n_running=_count(tasks.filter(status=TaskStatus.RUNNING)),
            n_parked=_count(tasks.filter(status=TaskStatus.PENDING).exclude(held_by="")),
        )

    def _runs_link(self, key: FlowKey, status: str, n: int) -> SafeString | int:
        if not n:
            return 0
        url = reverse("admin:kumiflow_workflowrun_changelist")
        query = urlencode({"flow_scope": key.scope, "flow_key": key.key, "status": status})
        return format_html('<a href="{}?{}">{}</a>', url, query, n)

    @admin.display(description="active runs", ordering="n_active")
    def active_runs(self, key: FlowKey) -> SafeString | int:
        return int(getattr(key, "n_active", 0))

    @admin.display(description="queued runs", ordering="n_queued")
    def queued_runs(self, key: FlowKey) -> SafeString | int:
        return self._runs_link(key, RunStatus.QUEUED, int(getattr(key, "n_queued", 0)))

    @admin.display(description="running attempts", ordering="n_running")
    def running_tasks(self, key: FlowKey) -> int:
        return int(getattr(key, "n_running", 0))

    @admin.display(description="parked attempts", ordering="n_parked")
    def parked_tasks(self, key: FlowKey) -> int:
        return int(getattr(key, "n_parked", 0))


@admin.register(RateBucket)
class RateBucketAdmin(ReadOnlyAdmin):
    """A rate's current window per key; a throttle's last start and the events it skipped."""

    list_display = ["scope", "key", "window_start", "count", "skipped"]
    search_fields = ["scope", "key"]
    list_per_page = 50
    ordering = ["scope", "key"]


@admin.register(FlowLimit)
class FlowLimitAdmin(admin.ModelAdmin):
    """An operator's override of a declared limit or rate, saved through
    ``set_flow_limit`` (which wakes what the scope has parked)."""

    list_display = ["scope", "max_active", "rate_limit", "changed_by", "changed_at"]
    fields = ["scope", "max_active", "rate_limit"]
    search_fields = ["scope"]

    def save_model(self, request: HttpRequest, obj: FlowLimit, form: Any, change: bool) -> None:
        user = getattr(request, "user", None)
        updated = set_flow_limit(
            obj.scope,
            max_active=obj.max_active,
            rate_limit=obj.rate_limit,
            by=user.get_username() if user is not None else "",
            reason="changed in the admin",
        )
        if updated is not None:
            obj.pk, obj.changed_by, obj.changed_at = (
                updated.pk,
                updated.changed_by,
                updated.changed_at,
            )
        else:
            messages.info(request, "No limit given: the declared limits of the scope apply.")

    def delete_model(self, request: HttpRequest, obj: FlowLimit) -> None:
        user = getattr(request, "user", None)
        set_flow_limit(
            obj.scope,
            by=user.get_username() if user is not None else "",
            reason="removed in the admin",
        )

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[FlowLimit]) -> None:
        for obj in queryset:
            self.delete_model(request, obj)
