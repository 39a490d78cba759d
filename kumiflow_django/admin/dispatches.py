"""The outbox, read-only, with redeliver and cancel as the only operations
(each through a confirmation page, with the operator and a reason)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from kumiflow_django.admin.base import InputFilter, ReadOnlyAdmin, badge, pretty
from kumiflow_django.admin.confirm import Operation, bulk, operate_view
from kumiflow_django.admin.display import when_short
from kumiflow_django.admin.timeline import stream_context, stream_url
from kumiflow_django.outbox.actions import (
    cancel_dispatch,
    redeliver,
    refuse_cancel_dispatch,
    refuse_redeliver,
)
from kumiflow_django.projections.dispatches import Dispatch


class RunFilter(InputFilter):
    title = "run id"
    parameter_name = "run"
    field = "run_id"


def _explain_redeliver(dispatch: Dispatch) -> list[str]:
    return [
        f"The {dispatch.kind} is delivered again by the dispatch loop, with a fresh retry "
        f"budget (it has had {dispatch.attempts} attempt(s); last error: "
        f"{dispatch.last_error[:200] or 'none'}).",
        f"It keeps its idempotency key ({dispatch.id}): a receiver that saw it can drop it.",
    ]


def _explain_cancel(dispatch: Dispatch) -> list[str]:
    return [
        f"The {dispatch.kind} is not delivered (no further attempt); its status becomes "
        "cancelled. It can be redelivered later.",
        "A run waiting for its delivery is not woken by this: wake or cancel the run.",
    ]


OPERATIONS = {
    "redeliver": Operation(
        name="redeliver",
        label="Redeliver",
        permission="redeliver_dispatch",
        done="queued for redelivery",
        refuse=refuse_redeliver,
        explain=_explain_redeliver,
        perform=lambda d, by, reason: redeliver(d.id, by=by, reason=reason),
    ),
    "cancel": Operation(
        name="cancel",
        label="Cancel delivery",
        permission="cancel_dispatch",
        done="cancelled",
        refuse=refuse_cancel_dispatch,
        explain=_explain_cancel,
        perform=lambda d, by, reason: cancel_dispatch(d.id, by=by, reason=reason),
        danger=True,
    ),
}


@admin.register(Dispatch)
class DispatchAdmin(ReadOnlyAdmin):
    operations = OPERATIONS
    change_form_template = "kumiflow/change_form_operations.html"
    list_display = [
        "short_id",
        "status_badge",
        "run_link",
        "next_attempt",
        "short_error",
        "created",
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
        return format_html(
            '{}<span class="kf-sub">{} · {}</span>',
            badge(dispatch.status, dispatch.get_status_display()),
            dispatch.kind,
            self.tries(dispatch),
        )

    @admin.display(description="run")
    def run_link(self, dispatch: Dispatch) -> SafeString | str:
        if dispatch.run_id is None:
            return ""
        url = reverse("admin:kumiflow_workflowrun_change", args=[dispatch.run_id])
        step = format_html('<span class="kf-sub">step {}</span>', dispatch.step_path)
        return format_html(
            '<a href="{}">{}</a>{}',
            url,
            str(dispatch.run_id)[:8],
            step if dispatch.step_path else "",
        )

    @admin.display(description="attempts")
    def tries(self, dispatch: Dispatch) -> str:
        code = f" (HTTP {dispatch.last_status_code})" if dispatch.last_status_code else ""
        return f"{dispatch.attempts} attempt{'' if dispatch.attempts == 1 else 's'}{code}"

    @admin.display(description="next attempt")
    def next_attempt(self, dispatch: Dispatch) -> SafeString | str:
        return when_short(dispatch.next_attempt_at)

    @admin.display(description="created", ordering="created_at")
    def created(self, dispatch: Dispatch) -> SafeString | str:
        return when_short(dispatch.created_at)

    @admin.display(description="last error")
    def short_error(self, dispatch: Dispatch) -> SafeString | str:
        if not dispatch.last_error:
            return ""
        return format_html(
            '<span class="kf-error-cut" title="{}">{}</span>',
            dispatch.last_error[:1000],
            dispatch.last_error[:80],
        )

    @admin.display(description="request")
    def request_pretty(self, dispatch: Dispatch) -> SafeString:
        return pretty(dispatch.request)

    @admin.display(description="events")
    def events_link(self, dispatch: Dispatch) -> SafeString:
        url = stream_url(str(dispatch.id), dispatch.tenant_id)
        return format_html('<a href="{}">the events of this dispatch</a>', url)

    def has_redeliver_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "redeliver_dispatch")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "cancel_dispatch")

    @admin.action(description="Redeliver selected dead dispatches", permissions=["redeliver"])
    def redeliver_dispatches(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return bulk(self, request, queryset, "redeliver", "redeliver_dispatches")

    @admin.action(description="Cancel selected pending dispatches", permissions=["cancel"])
    def cancel_dispatches(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return bulk(self, request, queryset, "cancel", "cancel_dispatches")

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        dispatch = self.get_object(request, unquote(object_id))  # None: Django's redirect
        context: dict[str, Any] = {
            "kf_operations": []
            if dispatch is None
            else [
                (reverse("admin:kumiflow_dispatch_operate", args=[dispatch.pk, name]), op.label)
                for name, op in self.operations.items()
                if op.refuse(dispatch) is None and self.user_can(request, op.permission)
            ]
        }
        if dispatch is not None:
            context.update(stream_context(str(dispatch.id), dispatch.tenant_id))
            # One thing, two names: a row of the outbox is a Dispatch (docs/concepts.md).
            context["title"] = f"Outbox: {dispatch.kind} dispatch {str(dispatch.id)[:8]}"
        return super().change_view(
            request, object_id, form_url, {**context, **(extra_context or {})}
        )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # The outbox is the table of Dispatch rows: the page says both names.
        title = "Outbox: one dispatch per mail, webhook or custom side effect a run asked for"
        return super().changelist_view(request, {"title": title, **(extra_context or {})})

    def get_urls(self) -> list[Any]:
        urls = [
            path(
                "<path:object_id>/operate/<str:operation>/",
                self.admin_site.admin_view(self.operate_view),
                name="kumiflow_dispatch_operate",
            )
        ]
        return urls + super().get_urls()

    def operate_view(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        return operate_view(
            self, request, object_id, operation, title=lambda d: f"Dispatch {str(d.id)[:8]}"
        )
