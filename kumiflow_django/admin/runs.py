"""The runs: the list, a run's page, its operations, sending an awaited event, the overview."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from functools import partial
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from kumiflow_django.admin import (
    attributes,
    bulk_filter,
    inbox,
    overview,
    restart,
    run_page,
    send_event,
)
from kumiflow_django.admin.attributes import AttributeFilter
from kumiflow_django.admin.attributes import links as attribute_links
from kumiflow_django.admin.base import (
    CheckedChangeList,
    FieldFilter,
    InputFilter,
    ReadOnlyAdmin,
    badge,
    pretty,
)
from kumiflow_django.admin.confirm import Operation, bulk, operate_view
from kumiflow_django.admin.display import plain_when, relative, when, when_short
from kumiflow_django.admin.flow import FlowKeyFilter, FlowScopeFilter
from kumiflow_django.admin.picture import find
from kumiflow_django.admin.search import runs_matching
from kumiflow_django.admin.send_event import send_event_view
from kumiflow_django.definition import matching
from kumiflow_django.definition.context import TriggerEvent
from kumiflow_django.definition.registry import registry
from kumiflow_django.engine import deploys, operations, unserved
from kumiflow_django.engine.restore import retry_point
from kumiflow_django.projections.dispatches import DELIVERABLE, Dispatch, DispatchStatus
from kumiflow_django.projections.runs import FINISHED, RunStatus, WorkflowRun
from kumiflow_django.projections.waiting_for import waiting_for
from kumiflow_django.projections.waits import own_wait, own_waits
from kumiflow_django.store import clock, leases
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import Event

# -- what each operation does, said before it is done -------------------------------


def _step_label(run: WorkflowRun, cursor: Any) -> str:
    text = ".".join(str(p) for p in cursor) if cursor else ""
    if not text:
        return "the start"
    definition = run_page.definition_of(run)
    node = find(definition.outline["steps"], text) if definition.outline else None
    return f"step {text} ({node['label']})" if node else f"step {text}"


def _explain_cancel(run: WorkflowRun) -> list[str]:
    pending = Dispatch.objects.filter(run_id=run.id, status__in=DELIVERABLE).count()
    lines = [
        f"The run stops for good at {_step_label(run, run.cursor)}: its status becomes "
        "cancelled, and no later step runs.",
        "What its steps already did stays done (database writes committed, mails and "
        "webhooks delivered).",
    ]
    if pending:
        lines.append(f"Its {pending} outbox request(s) not delivered yet are cancelled with it.")
    return lines


def _explain_wake(run: WorkflowRun) -> list[str]:
    at = _step_label(run, run.cursor)
    if run.status == RunStatus.WAITING:
        return [
            f"The wait at {at} ends early: a worker continues the run now instead of at "
            f"{plain_when(run.wake_at)}."
        ]
    if run.status == RunStatus.RETRY_SCHEDULED:
        return [
            f"The next attempt of the retry at {at} runs now instead of at "
            f"{plain_when(run.wake_at)} (attempt {run.attempt} failed: {run.last_error[:200]})."
        ]
    if run.matched_position is not None:
        return [
            f"The awaited event #{run.matched_position} has come already: the run continues "
            f"with it at {at}."
        ]
    lines = [
        f"The run waits at {at} for an event {awaited_type(run)}. Waking it now takes "
        "the TIMEOUT path: the wait ends as timed out, as if its timeout had passed, "
        "without the event.",
        "To let the run go on WITH the event (an approval), use “Send event” instead.",
    ]
    if run.wake_at:
        lines.append(f"Its timeout would have come at {plain_when(run.wake_at)}.")
    return lines


def _explain_retry(run: WorkflowRun) -> list[str]:
    point = retry_point(run)
    lines = [
        f"The failed segment runs again from {_step_label(run, point['cursor'])}, on the "
        f"definition the run started on ({run.fingerprint[:12]}…). The failed segment was "
        "rolled back as a whole, so none of it is repeated twice.",
    ]
    # What the resume will decide (the function it asks), from the retried position.
    facts = dataclasses.replace(
        deploys.RunFacts.of(run),
        cursor=point["cursor"],
        status=str(point.get("status") or RunStatus.PENDING),
    )
    decision = deploys.decide(facts)
    if decision.fate == deploys.Fate.CARRIED_ON and decision.workflow is not None:
        lines.append(
            "That definition is no longer registered, and the change is compatible for the "
            f"run: it carries on on the current one ({decision.workflow.fingerprint[:12]}…)."
        )
    elif decision.fate == deploys.Fate.WAITS:
        lines.append(
            "The workflow is not registered in this deployment: the run will fail again "
            "with workflow_not_registered."
        )
    elif decision.fate == deploys.Fate.FAILS:
        lines.append(
            "That definition is no longer registered: the run will fail again with "
            f"workflow_definition_changed ({decision.why}). Retry on the current definition "
            "instead."
        )
    return lines


def _explain_retry_current(run: WorkflowRun) -> list[str]:
    current = registry.get(run.workflow)
    cursor = retry_point(run)["cursor"]
    where = "the start"
    if cursor is not None:
        where = f"step {'.'.join(map(str, cursor))} ({current.step_at(cursor).kind})"
    lines = [
        f"The run moves from the definition it started on ({run.fingerprint[:12]}…, version "
        f"{run.workflow_version or 'none'}) to the current one ({current.fingerprint[:12]}…, "
        f"version {current.version or 'none'}).",
        f"Then its failed segment runs again from {where} of the current definition.",
    ]
    if current.fingerprint == run.fingerprint:
        lines.append("The run is on the current definition already: this is a plain retry.")
    return lines


def _explain_pause(run: WorkflowRun) -> list[str]:
    return [
        "No worker takes the run until it is resumed. Its status stays "
        f"{run.get_status_display()}; a segment running now finishes first.",
        "Events it waits for are still recorded, and its timers still come due: it takes "
        "them when it is resumed. Its tasks and deliveries already requested go on.",
    ]


def _explain_resume(run: WorkflowRun) -> list[str]:
    if run.reason:
        return [
            f"The run was paused because its retries ran out ({run.reason}): it continues at "
            f"{_step_label(run, run.cursor)} with its whole retry policy again "
            "(a task that failed for good runs again).",
        ]
    return ["Workers take the run again: at once if its timer came or its event was matched."]


def _explain_fail(run: WorkflowRun) -> list[str]:
    lines = ["The run ends failed (reason failed_by_operator), with your reason as its error."]
    if run.state.get("compensations"):
        lines.append("Its completed steps' compensations run first, the last one first.")
    lines.append("Its open tasks and the child runs it waits for are cancelled. It can be retried.")
    return lines


RUN_OPERATIONS = {
    "cancel": Operation(
        name="cancel",
        label="Cancel",
        permission="cancel_workflowrun",
        done="cancelled",
        refuse=operations.refuse_cancel,
        explain=_explain_cancel,
        perform=lambda run, by, reason: operations.cancel_run(run.id, by=by, reason=reason),
        danger=True,
    ),
    "wake": Operation(
        name="wake",
        label="Wake now",
        permission="wake_workflowrun",
        done="woken",
        refuse=operations.refuse_wake,
        explain=_explain_wake,
        perform=lambda run, by, reason: operations.wake_run(run.id, by=by, reason=reason),
    ),
    "retry": Operation(
        name="retry",
        label="Retry",
        permission="retry_workflowrun",
        done="retried",
        refuse=operations.refuse_retry,
        explain=_explain_retry,
        perform=lambda run, by, reason: operations.retry_run(run.id, by=by, reason=reason),
    ),
    "retry-current": Operation(
        name="retry-current",
        label="Retry on the current definition",
        permission="retry_workflowrun",
        done="retried on the current definition",
        refuse=partial(operations.refuse_retry, adopt_current_definition=True),
        explain=_explain_retry_current,
        perform=lambda run, by, reason: operations.retry_run(
            run.id, adopt_current_definition=True, by=by, reason=reason
        ),
    ),
    "pause": Operation(
        name="pause",
        label="Pause",
        permission="pause_workflowrun",
        done="paused",
        refuse=operations.refuse_pause,
        explain=_explain_pause,
        perform=lambda run, by, reason: operations.pause_run(run.id, by=by, reason=reason),
    ),
    "resume": Operation(
        name="resume",
        label="Resume",
        permission="pause_workflowrun",
        done="resumed",
        refuse=operations.refuse_resume,
        explain=_explain_resume,
        perform=lambda run, by, reason: operations.resume_run(run.id, by=by, reason=reason),
    ),
    "fail": Operation(
        name="fail",
        label="Fail",
        permission="fail_workflowrun",
        done="failed",
        refuse=operations.refuse_fail,
        explain=_explain_fail,
        perform=lambda run, by, reason: operations.fail_run(run.id, by=by, reason=reason),
        danger=True,
    ),
}


# -- filters -----------------------------------------------------------------------


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


class AttentionFilter(admin.SimpleListFilter):
    """The runs the overview counts: due now, stalled, recovered in the last day."""

    title = "needs attention"
    parameter_name = "attention"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("due", "due now"),
            ("stalled", "stalled (lease ran out)"),
            ("recovered", "recovered in the last day"),
            ("definition", "waits for a worker with its definition"),
            ("delivery", "completed, a delivery dead or failing"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        now = clock.now()
        if self.value() == "due":
            return queryset.filter(wake_at__lte=now)
        if self.value() == "stalled":
            return queryset.filter(leases.stalled_q(now), wake_at__lte=now)
        if self.value() == "definition":
            return queryset.filter(pk__in=unserved.waiting(now).values("pk"))
        if self.value() == "recovered":  # the overview's figure, the same query
            return queryset.filter(pk__in=overview.recovered_runs(now).values("pk"))
        if self.value() == "delivery":
            bad = Dispatch.objects.filter(status__in=[DispatchStatus.DEAD, DispatchStatus.FAILED])
            return queryset.filter(status=RunStatus.COMPLETED, id__in=bad.values("run_id"))
        return queryset


class ParentFilter(InputFilter):
    """The child runs of one run (its id): shown whatever "child runs" says."""

    title = "parent run"
    parameter_name = "parent"
    field = "parent_id"


class ChildRunsFilter(admin.SimpleListFilter):
    """Child runs are hidden by default (a fan-out of a thousand children would
    bury the runs people started); "yes" lists them, and so do a parent filter
    and a search (a run looked for by its id or key is found, child or not)."""

    title = "show child runs"
    parameter_name = "children"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "yes")]

    def choices(self, changelist: Any) -> Any:
        yield {
            "selected": self.value() != "yes",
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "no (default)",
        }
        yield {
            "selected": self.value() == "yes",
            "query_string": changelist.get_query_string({self.parameter_name: "yes"}),
            "display": "yes",
        }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if attributes.children_shown(request):
            return queryset
        if attributes.wanted(request) is not None:
            return queryset  # the attribute filter keeps the top-level runs, from its index
        return queryset.filter(parent_id__isnull=True)


def awaited_type(run: WorkflowRun) -> str:
    """The event type a run in ``wait_for_event`` awaits (read once per list
    page by :class:`RunChangeList`, else from its wait)."""
    known = getattr(run, "awaited_type", None)
    if known is not None:
        return str(known)
    wait = own_wait(run)
    return wait.event_type if wait is not None else ""


class RunChangeList(CheckedChangeList):
    """The run list, with each row's business key read in one query per page."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        queryset = super().get_queryset(request, exclude_parameters)
        # Filtered by an attribute alone: counted from the attribute index.
        rows = attributes.count_rows(request, self.get_filters_params(), bool(self.query))
        if rows is not None and not queryset.query.is_empty():
            queryset.count_rows = rows  # type: ignore[attr-defined]
        return queryset

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        page = list(self.result_list)
        business_keys(page)
        delivery_problems(page)
        waits = own_waits(page)
        for run in page:
            wait = waits.get(run.id)
            run.awaited_type = wait.event_type if wait is not None else ""
            run.own_wait = wait


def delivery_problems(runs: Sequence[WorkflowRun]) -> None:
    """Set ``run.delivery_problem``: for a completed run whose outbox has a dead
    or failing delivery, what it is (``webhook dead``); one query per page."""
    for run in runs:
        run.delivery_problem = ""  # type: ignore[attr-defined]
    completed = {r.id: r for r in runs if r.status == RunStatus.COMPLETED}
    if not completed:
        return
    rows = (
        Dispatch.objects.filter(
            run_id__in=list(completed),
            status__in=[DispatchStatus.DEAD, DispatchStatus.FAILED],
        )
        .values_list("run_id", "kind", "status")
        .order_by("run_id", "kind")
    )
    found: dict[Any, list[str]] = {}
    for run_id, kind, status in rows:
        text = f"{kind} {'dead' if status == DispatchStatus.DEAD else 'failing'}"
        if text not in found.setdefault(run_id, []):
            found[run_id].append(text)
    for run_id, texts in found.items():
        completed[run_id].delivery_problem = ", ".join(texts)  # type: ignore[attr-defined]


def business_keys(runs: Sequence[WorkflowRun]) -> None:
    """Set ``run.business_key``: its idempotency key, else the field its
    workflow's ``business_key`` names in its trigger event (or input)."""
    paths = {w.name: w.business_key for w in registry.current() if w.business_key}
    wanted = [r for r in runs if not r.idempotency_key and paths.get(r.workflow)]
    positions = [r.trigger_position for r in wanted if r.trigger_position is not None]
    events = (
        {e.position: e for e in Event.objects.filter(position__in=positions)} if positions else {}
    )
    for run in runs:
        run.business_key = run.idempotency_key or ""  # type: ignore[attr-defined]
    for run in wanted:
        source: Any = events.get(run.trigger_position) if run.trigger_position else None
        if source is None and run.trigger_position is None:
            # A run started by hand or by cron: its input is its trigger's payload.
            source = TriggerEvent(type=run.trigger_type, payload=run.input or {}, tenant_id="")
        if source is not None:
            value = matching.value_at(source, paths[run.workflow])
            if isinstance(value, str | int | float) and not isinstance(value, bool):
                run.business_key = str(value)  # type: ignore[attr-defined]


# -- the admin ------------------------------------------------------------------------


@admin.register(WorkflowRun)
class WorkflowRunAdmin(ReadOnlyAdmin):
    # Few, narrow columns: the list fits 1,280 px beside the admin's sidebar and
    # the filters. Where a run is and what it waits for sit under its status.
    list_display = ["short_id", "workflow", "status_badge", "key", "started"]
    list_display_links = ["short_id"]
    list_filter = [
        "status",
        "paused",
        WorkflowFilter,
        TenantFilter,
        AttentionFilter,
        ChildRunsFilter,
        ParentFilter,
        FlowScopeFilter,
        FlowKeyFilter,
        AttributeFilter,
    ]
    search_fields = ["id"]
    search_help_text = (
        "The first characters of a run id (4 or more) or of an idempotency key, or a value "
        "a waiting run matches on."
    )
    ordering = ["-started_at"]
    show_facets = admin.ShowFacets.NEVER
    actions = [
        "cancel_runs",
        "retry_runs",
        "wake_runs",
        "pause_runs",
        "resume_runs",
        "fail_runs",
        "restart_runs",
    ]
    change_form_template = "admin/kumiflow/workflowrun/change_form.html"
    change_list_template = "admin/kumiflow/workflowrun/change_list.html"
    operations = RUN_OPERATIONS

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RunChangeList

    # -- list -------------------------------------------------------------
    @admin.display(description="run", ordering="id")
    def short_id(self, run: WorkflowRun) -> str:
        return str(run.id)[:8]

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: WorkflowRun) -> SafeString:
        where = self.at_step(run)
        waiting = self.waiting_for(run)
        parts = [p for p in (f"at {where}" if where else "", waiting) if p]
        # why it failed, was cancelled, or is not quite done: under its status
        why = self.problem(run)
        why_line = format_html('<span class="kf-sub">{}</span>', why) if why else ""
        shown = badge(run.status, run.get_status_display())
        if run.paused:  # held by an operator, or by its exhausted retries
            shown = format_html("{} {}", shown, badge("paused", "paused"))
        if not parts:
            return format_html("{}{}", shown, why_line)
        return format_html(
            '{}<span class="kf-sub">{}</span>{}',
            shown,
            format_html_join(" · ", "{}", ((p,) for p in parts)),
            why_line,
        )

    @admin.display(description="why")
    def problem(self, run: WorkflowRun) -> SafeString | str:
        """Why a run failed or was cancelled (its reason, the error's first line),
        or the dead or failing delivery of a run that completed."""
        delivery = getattr(run, "delivery_problem", "")
        if delivery:
            return format_html('<span class="kf-delivery-problem">⚠ {}</span>', delivery)
        if run.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
            return ""
        first = (run.last_error or "").strip().splitlines()
        text = first[0][:120] if first else ""
        reason = run.reason if run.status == RunStatus.FAILED else ""
        return format_html(
            '<span class="kf-why" title="{}">{}{}</span>',
            run.last_error or "",
            f"{reason}: " if reason and text else reason,
            text,
        )

    @admin.display(description="business key")
    def key(self, run: WorkflowRun) -> SafeString | str:
        value = getattr(run, "business_key", None) or run.idempotency_key or ""
        if not value:
            return ""
        return format_html('<span class="kf-key" title="{}">{}</span>', value, value)

    @admin.display(description="at step")
    def at_step(self, run: WorkflowRun) -> str:
        if run.attempt > 1 and run.status == RunStatus.RETRY_SCHEDULED:
            return f"{run.cursor_text} (attempt {run.attempt})"
        return run.cursor_text

    @admin.display(description="waiting for")
    def waiting_for(self, run: WorkflowRun) -> SafeString | str:
        awaited = waiting_for(run)
        if awaited is not None and awaited["kind"] != "event":
            # The engine's own events (a task's, a delivery's) are said as what they are.
            return format_html(
                '<span class="kf-key" title="{}">{}</span>', awaited["event_type"], awaited["text"]
            )
        if run.status == RunStatus.WAITING_EVENT:
            event_type = awaited_type(run)
            return format_html(
                'for <span class="kf-key" title="{}">{}</span>', event_type, event_type
            )
        if run.wake_at and run.status not in FINISHED:
            local = timezone.localtime(run.wake_at)
            return format_html(
                '<span title="{} {}">wakes {}</span>',
                local.strftime("%Y-%m-%d %H:%M:%S"),
                local.tzname(),
                relative(run.wake_at),
            )
        return ""

    @admin.display(description="started", ordering="started_at")
    def started(self, run: WorkflowRun) -> SafeString | str:
        return when_short(run.started_at)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = runs_matching(term)
        return (queryset.none() if condition is None else queryset.filter(condition)), False

    # -- a run's page -----------------------------------------------------
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "status",
                    "workflow",
                    "workflow_version",
                    "tenant_id",
                    "cursor",
                    "attempt",
                    "wake_when",
                    "awaited_event_type",
                    "awaited_match",
                    "trigger_link",
                    "idempotency_key",
                    "result_pretty",
                    "started_when",
                    "updated_when",
                    "finished_when",
                ]
            },
        ),
        (
            "Engine details",
            {
                "classes": ["collapse"],
                "fields": [
                    "id",
                    "reason",
                    "last_error",
                    "fingerprint",
                    "recovery",
                    "dispatches_link",
                ],
            },
        ),
    ]
    readonly_fields = [
        "awaited_event_type",
        "awaited_match",
        "trigger_link",
        "dispatches_link",
        "recovery",
        "result_pretty",
        "wake_when",
        "started_when",
        "updated_when",
        "finished_when",
    ]

    @admin.display(description="awaited event")
    def awaited_event_type(self, run: WorkflowRun) -> str:
        return awaited_type(run) or "—"

    @admin.display(description="awaited match")
    def awaited_match(self, run: WorkflowRun) -> str:
        wait = own_wait(run)
        return json.dumps(wait.match, ensure_ascii=False) if wait is not None else "—"

    @admin.display(description="wakes at")
    def wake_when(self, run: WorkflowRun) -> SafeString | str:
        return when(run.wake_at) or "—"

    @admin.display(description="started at")
    def started_when(self, run: WorkflowRun) -> SafeString | str:
        return when(run.started_at)

    @admin.display(description="updated at")
    def updated_when(self, run: WorkflowRun) -> SafeString | str:
        return when(run.updated_at)

    @admin.display(description="finished at")
    def finished_when(self, run: WorkflowRun) -> SafeString | str:
        return when(run.finished_at) or "—"

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
            if leases.stalled(run.lease_owner, run.lease_until, clock.now()):
                text += " (ran out: the next worker takes it over)"
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
        run = self.object_or_404(request, object_id)
        business_keys([run])
        # restart from a step (its own page: the pre-flight); the picture links its steps
        offered = restart.offer(run) if self.user_can(request, restart.PERMISSION) else None
        context = run_page.context(run, restart_points=offered.points if offered else None)
        context["attribute_links"] = attribute_links(run.attributes)
        context["approval_event"] = ev.APPROVAL_DECIDED
        context["operations"] = [
            (name, op.label)
            for name, op in self.operations.items()
            if op.refuse(run) is None and self.user_can(request, op.permission)
        ]
        context["can_send_event"] = send_event.refuse(run) is None and self.user_can(
            request, "send_event_workflowrun"
        )
        context["restart_label"] = offered.label if offered else None
        return super().change_view(
            request, object_id, form_url, {**context, **(extra_context or {})}
        )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = {"overview_url": reverse("admin:kumiflow_overview"), **(extra_context or {})}
        return super().changelist_view(request, extra)

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view
        urls = [
            path("overview/", view(self.overview_view), name="kumiflow_overview"),
            path("approvals/", view(self.inbox_view), name="kumiflow_approvals"),
            path(
                "<path:object_id>/operate/<str:operation>/",
                view(self.operate_view),
                name="kumiflow_workflowrun_operate",
            ),
            path(
                "<path:object_id>/restart/",
                view(self.restart_view),
                name="kumiflow_workflowrun_restart",
            ),
            path(
                "<path:object_id>/send-event/",
                view(self.send_event_view),
                name="kumiflow_workflowrun_send_event",
            ),
        ]
        return urls + super().get_urls()

    def operate_view(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        return operate_view(
            self, request, object_id, operation, title=lambda run: f"Run {str(run.id)[:8]}"
        )

    def restart_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return restart.restart_view(self, request, object_id)

    def send_event_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return send_event_view(self, request, object_id)

    def inbox_view(self, request: HttpRequest) -> HttpResponse:
        return inbox.inbox_view(self, request)

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Workflows overview",
            **overview.context(),
        }
        return TemplateResponse(request, "kumiflow/overview.html", context)

    # -- actions ------------------------------------------------------------
    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "cancel_workflowrun")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "retry_workflowrun")

    def has_wake_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "wake_workflowrun")

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return bulk(self, request, queryset, "cancel", "cancel_runs")

    @admin.action(
        description="Retry selected failed runs from their failed step", permissions=["retry"]
    )
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return bulk(self, request, queryset, "retry", "retry_runs")

    @admin.action(description="Wake selected waiting runs now", permissions=["wake"])
    def wake_runs(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return bulk(self, request, queryset, "wake", "wake_runs")

    # -- pause, resume, fail (and every action on "all N matching": .bulk_filter) ----
    def has_pause_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "pause_workflowrun")

    def has_fail_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "fail_workflowrun")

    @admin.action(description="Pause selected runs", permissions=["pause"])
    def pause_runs(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return bulk(self, request, queryset, "pause", "pause_runs")

    @admin.action(description="Resume selected paused runs", permissions=["pause"])
    def resume_runs(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return bulk(self, request, queryset, "resume", "resume_runs")

    @admin.action(description="Fail selected runs", permissions=["fail"])
    def fail_runs(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return bulk(self, request, queryset, "fail", "fail_runs")

    @admin.action(description="Restart selected runs from a step", permissions=["retry"])
    def restart_runs(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return bulk_filter.confirm(self, request, queryset, "restart", "restart_runs")

    def bulk_by_filter(
        self, request: HttpRequest, queryset: QuerySet[Any], operation_name: str, action: str
    ) -> Any:
        return bulk_filter.confirm(self, request, queryset, operation_name, action)
