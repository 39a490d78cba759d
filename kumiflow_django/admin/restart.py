"""The restart page of a run: choose a step, read the pre-flight, confirm with a reason.

GET ``<run>/restart/?from_step=…&definition=…`` shows :func:`restart_plan`
(the same pre-flight as the HTTP API's GET): the steps the run can restart
from, what runs again, each side effect that happens again and under which
idempotency key. POST restarts through :func:`restart_run` and redirects to
the new run. Restarting needs the retry permission (it is a repair of the
same kind).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from kumiflow_django.admin.confirm import ReasonForm, object_page, operator
from kumiflow_django.engine.restart import (
    Definition,
    applicable_plan,
    restart_plan,
    restart_run,
)
from kumiflow_django.projections.runs import Compensation, WorkflowRun
from kumiflow_django.store.errors import KumiflowError

if TYPE_CHECKING:
    from kumiflow_django.admin.base import ReadOnlyAdmin

PERMISSION = "retry_workflowrun"


@dataclass(frozen=True)
class Offer:
    """What the run page offers: the button's label, and the restart page of
    each step the run can restart from (the picture links them)."""

    label: str
    definition: Definition
    points: dict[str, str]


def offer(run: WorkflowRun) -> Offer | None:
    """The button "Start again" for a run whose steps were undone, "Restart" for
    another finished run (on its own definition, else the current one), None
    when a restart does not apply: the engine's plan decides (``applicable_plan``)."""
    plan = applicable_plan(run)
    if plan is None:
        return None
    definition: Definition = "current" if plan.definition == "current" else "run"
    base = reverse("admin:kumiflow_workflowrun_restart", args=[run.pk])
    points = {
        c.path: f"{base}?{urlencode({'from_step': c.path, 'definition': definition})}"
        for c in plan.choices
    }
    label = "Start again" if run.compensation == Compensation.COMPENSATED else "Restart"
    return Offer(label, definition, points)


def restart_view(model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    if not model_admin.user_can(request, PERMISSION) or request.method not in ("GET", "POST"):
        raise PermissionDenied
    run = model_admin.object_or_404(request, object_id)
    back = object_page(model_admin, run)
    data = request.POST if request.method == "POST" else request.GET
    from_step = str(data.get("from_step") or "0")
    definition: Definition = "current" if data.get("definition") == "current" else "run"
    offered = offer(run)
    if "definition" not in data and offered is not None:
        definition = offered.definition  # the run's own definition is gone: the current one
    plan = restart_plan(run.id, from_step, definition=definition, tenant=run.tenant_id)
    form = ReasonForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            new = restart_run(
                run.id,
                from_step=from_step,
                definition=definition,
                tenant=run.tenant_id,
                by=operator(request),
                reason=form.cleaned_data["reason"],
            )
        except KumiflowError as exc:
            model_admin.message_user(request, f"Not restarted: {exc}", messages.ERROR)
            return HttpResponseRedirect(back)
        model_admin.message_user(
            request,
            f"Run {str(run.id)[:8]} restarted from step {from_step} as run {str(new.id)[:8]}.",
            messages.SUCCESS,
        )
        opts = new._meta
        return HttpResponseRedirect(
            reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[new.pk])
        )
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": f"Restart run {str(run.id)[:8]}",
        "subject": f"Run {str(run.id)[:8]}",
        "run": run,
        "plan": plan,
        "form": form,
        "back": back,
        "label": offered.label if offered is not None else "Restart",
    }
    return TemplateResponse(request, "kumiflow/restart.html", context)
