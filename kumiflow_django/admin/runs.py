"""The runs: the list, a run's page (summary, picture, timeline) and operations."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from kumiflow_django.admin.base import (
    FieldFilter,
    InputFilter,
    ReadOnlyAdmin,
    apply_each,
    badge,
    pretty,
)
from kumiflow_django.admin.picture import render
from kumiflow_django.definition import matching
from kumiflow_django.definition.registry import registry
from kumiflow_django.engine import operations
from kumiflow_django.engine.operations import WAKEABLE
from kumiflow_django.projections.runs import FINISHED, RunStatus, WorkflowRun
from kumiflow_django.store.errors import InvalidRunState, KumiflowError
from kumiflow_django.store.models import Event

TIMELINE_EVENTS = 200

#: operation -> (function, eligible statuses, past tense)
OPERATIONS: dict[str, tuple[Callable[..., Any], list[RunStatus], str]] = {
    "cancel": (operations.cancel_run, [s for s in RunStatus if s not in FINISHED], "cancelled"),
    "retry": (operations.retry_run, [RunStatus.FAILED], "retried"),
    "wake": (operations.wake_run, list(WAKEABLE), "woken"),
}


class WorkflowFilter(FieldFilter):
    title = "workflow"
    parameter_name = "workflow"
    field = "workflow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = sorted(w.name for w in registry.current())
        return [(n, n) for n in names]  # from the registry: no query over the runs


class TenantFilter(InputFilter):
    title = "tenant"
    parameter_name = "tenant"
    field = "tenant_id"


@admin.register(WorkflowRun)
class WorkflowRunAdmin(ReadOnlyAdmin):
    list_display = [
        "short_id",
        "workflow",
        "status_badge",
        "tenant_id",
        "at_step",
        "attempt",
        "waiting_for",
        "started_at",
        "updated_at",
    ]
    list_filter = ["status", WorkflowFilter, TenantFilter]
    search_fields = ["id"]
    search_help_text = "A run id, an idempotency key, or a value a waiting run matches on."
    ordering = ["-started_at"]
    show_facets = admin.ShowFacets.NEVER
    actions = ["cancel_runs", "retry_runs", "wake_runs"]
    change_form_template = "admin/kumiflow/workflowrun/change_form.html"

    # -- list -------------------------------------------------------------
    @admin.display(description="run", ordering="id")
    def short_id(self, run: WorkflowRun) -> str:
        return str(run.id)[:8]

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: WorkflowRun) -> SafeString:
        return badge(run.status, run.get_status_display())

    @admin.display(description="at step")
    def at_step(self, run: WorkflowRun) -> str:
        return run.cursor_text

    @admin.display(description="waiting for")
    def waiting_for(self, run: WorkflowRun) -> str:
        if run.status == RunStatus.WAITING_EVENT:
            return run.awaited_event_type or ""
        if run.wake_at:
            return f"until {run.wake_at:%Y-%m-%d %H:%M:%S}"
        return ""

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """Exact, indexed matches only: a run id, an idempotency key, or a value
        a waiting run correlates on (each single-field match of the registry)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(idempotency_key=term)
        try:
            condition |= Q(id=uuid.UUID(term))
        except ValueError:
            pass
        keys = []
        candidates: list[Any] = [term]
        if term.lstrip("-").isdigit():
            candidates.append(int(term))
        for workflow in registry.all_versions():
            for path_sets in workflow.awaited.values():
                for paths in path_sets:
                    if len(paths) == 1:
                        keys += [matching.correlation_key({paths[0]: v}) for v in candidates]
        if keys:
            condition |= Q(correlation_key__in=keys)
        return queryset.filter(condition), False

    # -- a run's page -----------------------------------------------------
    fields = [
        "id",
        "workflow",
        "workflow_version",
        "tenant_id",
        "status",
        "reason",
        "last_error",
        "cursor",
        "attempt",
        "wake_at",
        "awaited_event_type",
        "awaited_match",
        "trigger_link",
        "dispatches_link",
        "recovery",
        "idempotency_key",
        "fingerprint",
        "result_pretty",
        "started_at",
        "updated_at",
        "finished_at",
    ]
    readonly_fields = ["trigger_link", "dispatches_link", "recovery", "result_pretty"]

    @admin.display(description="trigger event")
    def trigger_link(self, run: WorkflowRun) -> SafeString | str:
        if run.trigger_position is None:
            return run.trigger_type
        url = reverse("admin:kumiflow_event_change", args=[run.trigger_position])
        return format_html('<a href="{}">#{} {}</a>', url, run.trigger_position, run.trigger_type)

    @admin.display(description="dispatches")
    def dispatches_link(self, run: WorkflowRun) -> SafeString:
        url = reverse("admin:kumiflow_dispatch_changelist") + f"?run={run.id}"
        return format_html('<a href="{}">the outbox rows of this run</a>', url)

    @admin.display(description="stalled recoveries")
    def recovery(self, run: WorkflowRun) -> str:
        text = (
            f"{run.recoveries} (resumed by another worker after a lease ran out)"
            if run.recoveries
            else "0"
        )
        if run.lease_owner:
            text += f"; leased by {run.lease_owner} until {run.lease_until:%Y-%m-%d %H:%M:%S}"
        return text

    @admin.display(description="result")
    def result_pretty(self, run: WorkflowRun) -> SafeString:
        return pretty(run.result)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        run = self._run_or_404(request, object_id)
        events = list(
            Event.objects.filter(stream_id=str(run.id), tenant_id=run.tenant_id).order_by(
                "-version"
            )[:TIMELINE_EVENTS]
        )
        workflow = registry.find(run.workflow, run.workflow_version or None)
        context = {
            "run": run,
            "timeline": [(e, pretty(e.payload)) for e in reversed(events)],
            "timeline_capped": len(events) == TIMELINE_EVENTS,
            "events_url": reverse("admin:kumiflow_event_changelist") + f"?stream={run.id}",
            "picture": render(workflow, trail=run.trail, cursor=run.cursor, status=run.status)
            if workflow is not None
            else None,
            "definition_current": workflow is not None and workflow.fingerprint == run.fingerprint,
            "operations": [
                (name, label)
                for name, (_, eligible, label) in OPERATIONS.items()
                if run.status in eligible and self.user_can(request, f"{name}_workflowrun")
            ],
        }
        return super().change_view(
            request, object_id, form_url, {**context, **(extra_context or {})}
        )

    def _run_or_404(self, request: HttpRequest, object_id: str) -> WorkflowRun:
        run = self.get_object(request, unquote(object_id))  # None for a malformed id too
        if run is None:
            raise Http404("no run with this id")
        return run  # type: ignore[no-any-return]

    def get_urls(self) -> list[Any]:
        urls = [
            path(
                "<path:object_id>/operate/<str:operation>/",
                self.admin_site.admin_view(self.operate_view),
                name="kumiflow_workflowrun_operate",
            )
        ]
        return urls + super().get_urls()

    def operate_view(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        """POST one operation on one run (the buttons of a run's page)."""
        if operation not in OPERATIONS or request.method != "POST":
            raise PermissionDenied
        if not self.user_can(request, f"{operation}_workflowrun"):
            raise PermissionDenied
        run = self._run_or_404(request, object_id)
        function, _, label = OPERATIONS[operation]
        try:
            function(run.id)
        except KumiflowError as exc:
            self.message_user(request, f"Not {label}: {exc}", messages.ERROR)
        else:
            self.message_user(request, f"Run {label}.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:kumiflow_workflowrun_change", args=[run.pk]))

    # -- actions ------------------------------------------------------------
    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "cancel_workflowrun")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "retry_workflowrun")

    def has_wake_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "wake_workflowrun")

    def _operate(self, request: HttpRequest, queryset: QuerySet[Any], name: str) -> None:
        function, _, label = OPERATIONS[name]
        done, skipped = apply_each(queryset, lambda run: function(run.id), (InvalidRunState,))
        self.report(request, label, done, skipped)

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._operate(request, queryset, "cancel")

    @admin.action(
        description="Retry selected failed runs from their failed step", permissions=["retry"]
    )
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._operate(request, queryset, "retry")

    @admin.action(description="Wake selected waiting runs now", permissions=["wake"])
    def wake_runs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._operate(request, queryset, "wake")
