"""Paused workflows and tenants: pause one, resume it, each through a
confirmation page with the operator and a reason (``pause_workflow``,
``resume_workflow``, ``pause_tenant``, ``resume_tenant``)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.safestring import SafeString

from kumiflow_django.admin.base import ReadOnlyAdmin, badge
from kumiflow_django.admin.confirm import Operation, ReasonForm, bulk, operate_view, operator
from kumiflow_django.admin.display import when_short
from kumiflow_django.admin.timeline import stream_context
from kumiflow_django.conf import settings
from kumiflow_django.engine import operations
from kumiflow_django.projections.pauses import PausedScope, ScopeKind
from kumiflow_django.store import limits
from kumiflow_django.store.errors import KumiflowError

PERMISSION = "pause_pausedscope"


def _pause(kind: str, name: str, by: str, reason: str) -> PausedScope:
    if kind == ScopeKind.TENANT:
        return operations.pause_tenant(name, by=by, reason=reason)
    return operations.pause_workflow(name, by=by, reason=reason)


def _resume(kind: str, name: str, by: str, reason: str) -> PausedScope:
    if kind == ScopeKind.TENANT:
        return operations.resume_tenant(name, by=by, reason=reason)
    return operations.resume_workflow(name, by=by, reason=reason)


def _explain_pause(kind: str, name: str) -> list[str]:
    return [
        f"No worker takes the runs of the {kind} {name} until it is resumed; a segment "
        "running now finishes first.",
        "New runs are recorded and wait (a workflow that starts inline is recorded and "
        "runs when resumed). Events its runs wait for are still recorded.",
    ]


OPERATIONS = {
    "resume": Operation(
        name="resume",
        label="Resume",
        permission=PERMISSION,
        done="resumed",
        refuse=operations.refuse_resume_scope,
        explain=lambda p: [
            f"Workers take the runs of the {p.kind} {p.name} again: those that came due "
            "while it was paused at once."
        ],
        perform=lambda p, by, reason: _resume(p.kind, p.name, by, reason),
    ),
    "pause": Operation(
        name="pause",
        label="Pause again",
        permission=PERMISSION,
        done="paused",
        refuse=operations.refuse_pause_scope,
        explain=lambda p: _explain_pause(p.kind, p.name),
        perform=lambda p, by, reason: _pause(p.kind, p.name, by, reason),
        danger=True,
    ),
}


class PauseForm(ReasonForm):
    kind = forms.ChoiceField(label="Pause a", choices=ScopeKind.choices)
    name = forms.CharField(
        label="Name",
        max_length=limits.WORKFLOW_NAME,
        help_text="The workflow's name, or the tenant's id.",
    )
    field_order = ["kind", "name", "reason"]


@admin.register(PausedScope)
class PausedScopeAdmin(ReadOnlyAdmin):
    list_display = ["name", "kind", "state", "reason", "by", "since"]
    list_filter = ["kind", "paused"]
    ordering = ["-paused", "kind", "name"]
    actions = ["resume_scopes"]
    operations = OPERATIONS
    change_form_template = "kumiflow/change_form_operations.html"
    change_list_template = "admin/kumiflow/pausedscope/change_list.html"

    @admin.display(description="state", ordering="paused")
    def state(self, scope: PausedScope) -> SafeString:
        return badge("paused", "paused") if scope.paused else badge("completed", "resumed")

    @admin.display(description="paused", ordering="paused_at")
    def since(self, scope: PausedScope) -> SafeString | str:
        return when_short(scope.paused_at)

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, PERMISSION)

    @admin.action(description="Resume selected workflows and tenants", permissions=["pause"])
    def resume_scopes(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return bulk(self, request, queryset, "resume", "resume_scopes")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {"kf_can_pause": self.user_can(request, PERMISSION), **(extra_context or {})}
        return super().changelist_view(request, context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        scope = self.get_object(request, unquote(object_id))
        context: dict[str, Any] = {
            "kf_operations": []
            if scope is None
            else [
                (
                    reverse("admin:kumiflow_pausedscope_operate", args=[quote(scope.pk), name]),
                    op.label,
                )
                for name, op in self.operations.items()
                if op.refuse(scope) is None and self.user_can(request, op.permission)
            ]
        }
        if scope is not None:
            tenant = scope.name if scope.kind == ScopeKind.TENANT else None
            context.update(stream_context(scope.pk, tenant or _default_tenant()))
        return super().change_view(
            request, object_id, form_url, {**context, **(extra_context or {})}
        )

    def get_urls(self) -> list[Any]:
        return [
            path(
                "pause/",
                self.admin_site.admin_view(self.pause_view),
                name="kumiflow_pausedscope_pause",
            ),
            path(
                "<path:object_id>/operate/<str:operation>/",
                self.admin_site.admin_view(self.operate_view),
                name="kumiflow_pausedscope_operate",
            ),
            *super().get_urls(),
        ]

    def operate_view(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        return operate_view(
            self, request, object_id, operation, title=lambda p: f"{p.kind} {p.name}"
        )

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        """Pause a workflow or a tenant by name (GET: the form; POST: pause it)."""
        if not self.user_can(request, PERMISSION) or request.method not in ("GET", "POST"):
            raise PermissionDenied
        initial = {k: request.GET[k] for k in ("kind", "name") if k in request.GET}
        form = PauseForm(request.POST if request.method == "POST" else None, initial=initial)
        back = reverse("admin:kumiflow_pausedscope_changelist")
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                _pause(data["kind"], data["name"], operator(request), data["reason"])
            except KumiflowError as exc:
                self.message_user(request, f"Not paused: {exc}", messages.ERROR)
            else:
                self.message_user(
                    request, f"The {data['kind']} {data['name']} is paused.", messages.SUCCESS
                )
            return HttpResponseRedirect(back)
        kind = form["kind"].value() or ScopeKind.WORKFLOW
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Pause a workflow or a tenant",
            "form": form,
            "explain": _explain_pause(str(kind), str(form["name"].value() or "…")),
            "back": back,
        }
        return TemplateResponse(request, "kumiflow/pause_scope.html", context)


def _default_tenant() -> str:
    return settings.DEFAULT_TENANT
