"""The restart page of a run: choose a step, read the pre-flight, confirm with a reason.

GET ``<run>/restart/?from_step=…&definition=…`` shows :func:`restart_plan`
(the same pre-flight as the HTTP API's GET): the steps the run can restart
from, what runs again, each side effect that happens again and under which
idempotency key. POST restarts through :func:`restart_run` and redirects to
the new run. Restarting needs the retry permission (it is a repair of the
same kind).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from kumiflow_django.admin.confirm import ReasonForm, object_page, operator
from kumiflow_django.engine.restart import Definition, refuse_restart, restart_plan, restart_run
from kumiflow_django.projections.runs import Compensation, WorkflowRun
from kumiflow_django.store.errors import KumiflowError

if TYPE_CHECKING:
    from kumiflow_django.admin.base import ReadOnlyAdmin

PERMISSION = "retry_workflowrun"


def offer(run: WorkflowRun) -> str | None:
    """The run page's button: "Start again" for a run whose steps were undone,
    "Restart" for another finished run, None when a restart does not apply."""
    if refuse_restart(run, "0") is not None and _refused_on_current(run):
        return None
    return "Start again" if run.compensation == Compensation.COMPENSATED else "Restart"


def points(run: WorkflowRun) -> dict[str, str]:
    """The restart page of each step the run can restart from, by step path:
    the picture links its steps there ("restart from here")."""
    definition: Definition = "run" if refuse_restart(run, "0") is None else "current"
    plan = restart_plan(run.id, "0", definition=definition, tenant=run.tenant_id)
    base = reverse("admin:kumiflow_workflowrun_restart", args=[run.pk])
    return {
        c.path: f"{base}?{urlencode({'from_step': c.path, 'definition': definition})}"
        for c in plan.choices
    }


def _refused_on_current(run: WorkflowRun) -> bool:
    return refuse_restart(run, "0", definition="current") is not None


def restart_view(model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    if not model_admin.user_can(request, PERMISSION) or request.method not in ("GET", "POST"):
        raise PermissionDenied
    run = model_admin.object_or_404(request, object_id)
    back = object_page(model_admin, run)
    data = request.POST if request.method == "POST" else request.GET
    from_step = str(data.get("from_step") or "0")
    definition: Definition = "current" if data.get("definition") == "current" else "run"
    if "definition" not in data and refuse_restart(run, "0") is not None:
        definition = "current"  # the run's own definition is gone: offer the current one
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
        "label": offer(run) or "Restart",
    }
    return TemplateResponse(request, "kumiflow/restart.html", context)
