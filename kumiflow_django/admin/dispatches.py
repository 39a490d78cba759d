"""The outbox, read-only, with redeliver and cancel as the only operations."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from kumiflow_django.admin.base import InputFilter, ReadOnlyAdmin, apply_each, badge, pretty
from kumiflow_django.outbox.actions import cancel_dispatch, redeliver
from kumiflow_django.projections.dispatches import Dispatch
from kumiflow_django.store.errors import InvalidDispatchState


class RunFilter(InputFilter):
    title = "run id"
    parameter_name = "run"
    field = "run_id"


@admin.register(Dispatch)
class DispatchAdmin(ReadOnlyAdmin):
    list_display = [
        "short_id",
        "kind",
        "status_badge",
        "run_link",
        "step_path",
        "attempts",
        "next_attempt_at",
        "last_status_code",
        "short_error",
        "created_at",
    ]
    list_filter = ["status", "kind", RunFilter]
    ordering = ["-created_at"]
    show_facets = admin.ShowFacets.NEVER
    actions = ["redeliver_dispatches", "cancel_dispatches"]
    fields = [
        "id",
        "kind",
        "status",
        "run_link",
        "step_path",
        "tenant_id",
        "attempts",
        "next_attempt_at",
        "last_status_code",
        "last_error",
        "request_pretty",
        "retry",
        "events_link",
        "created_at",
        "updated_at",
        "delivered_at",
    ]
    readonly_fields = ["run_link", "request_pretty", "events_link"]

    @admin.display(description="dispatch")
    def short_id(self, dispatch: Dispatch) -> str:
        return str(dispatch.id)[:8]

    @admin.display(description="status", ordering="status")
    def status_badge(self, dispatch: Dispatch) -> SafeString:
        return badge(dispatch.status, dispatch.get_status_display())

    @admin.display(description="run")
    def run_link(self, dispatch: Dispatch) -> SafeString | str:
        if dispatch.run_id is None:
            return ""
        url = reverse("admin:kumiflow_workflowrun_change", args=[dispatch.run_id])
        return format_html('<a href="{}">{}</a>', url, str(dispatch.run_id)[:8])

    @admin.display(description="last error")
    def short_error(self, dispatch: Dispatch) -> str:
        return dispatch.last_error[:80]

    @admin.display(description="request")
    def request_pretty(self, dispatch: Dispatch) -> SafeString:
        return pretty(dispatch.request)

    @admin.display(description="events")
    def events_link(self, dispatch: Dispatch) -> SafeString:
        url = reverse("admin:kumiflow_event_changelist") + f"?stream={dispatch.id}"
        return format_html('<a href="{}">the events of this dispatch</a>', url)

    def has_redeliver_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "redeliver_dispatch")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "cancel_dispatch")

    @admin.action(description="Redeliver selected dead dispatches", permissions=["redeliver"])
    def redeliver_dispatches(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        done, skipped = apply_each(queryset, lambda d: redeliver(d.id), (InvalidDispatchState,))
        self.report(request, "queued for redelivery", done, skipped)

    @admin.action(description="Cancel selected pending dispatches", permissions=["cancel"])
    def cancel_dispatches(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        done, skipped = apply_each(
            queryset,
            lambda d: cancel_dispatch(d.id, reason=f"cancelled by {request.user}"),
            (InvalidDispatchState,),
        )
        self.report(request, "cancelled", done, skipped)
