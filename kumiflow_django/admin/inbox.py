"""The inbox: runs that wait for a person, with one click per declared choice.

It lists the runs waiting at an ``approval`` step, per workflow, the longest
waiting first, with their search attributes, the approval's declared fields
as form inputs and a button per choice. Deciding calls the public
``decide_approval`` (the operator as ``by``, so the event says who decided
and when), like the HTTP API and code. Listing needs the run's view
permission; deciding, ``kumiflow.decide_approval_workflowrun`` and the
approval's own ``permission=`` (``can_decide``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from kumiflow_django.admin.attributes import links
from kumiflow_django.admin.confirm import object_page, operator
from kumiflow_django.engine.approvals import (
    Approval,
    approval_of,
    can_decide,
    decide_approval,
    waiting_approvals,
)
from kumiflow_django.projections.runs import WorkflowRun
from kumiflow_django.store.errors import KumiflowError

if TYPE_CHECKING:
    from kumiflow_django.admin.base import ReadOnlyAdmin

#: Runs the inbox shows at most (the longest waiting first).
PAGE = 200


@dataclass
class Item:
    run: WorkflowRun
    approval: Approval | None
    attributes: list[tuple[str, str, str]]
    url: str
    can_decide: bool


def _fields(approval: Approval, data: Any) -> dict[str, Any]:
    """The declared fields from the form (ValueError naming a bad one)."""
    out: dict[str, Any] = {}
    for name, kind in approval.fields.items():
        raw = data.get(f"field_{name}", "")
        if kind == "bool":
            out[name] = raw == "on"
        elif raw.strip() == "":
            continue
        elif kind == "int":
            try:
                out[name] = int(raw)
            except ValueError:
                raise ValueError(
                    f"field {name!r} must be a whole number, not {raw!r:.40}"
                ) from None
        else:
            out[name] = raw
    return out


def inbox_view(model_admin: ReadOnlyAdmin, request: HttpRequest) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    here = reverse("admin:kumiflow_approvals")
    if request.method == "POST":
        run = model_admin.object_or_404(request, request.POST.get("run", ""))
        if not can_decide(request.user, run):
            raise PermissionDenied
        approval = approval_of(run)
        try:
            fields = _fields(approval, request.POST) if approval is not None else {}
            decide_approval(
                run.id,
                request.POST.get("choice", ""),
                fields=fields,
                by=operator(request),
                reason=request.POST.get("reason", ""),
                approval=request.POST.get("approval") or None,
            )
        except (KumiflowError, ValueError) as exc:
            messages.error(request, f"Run {str(run.id)[:8]}: {exc}")
        else:
            messages.success(
                request,
                f"Run {str(run.id)[:8]}: {request.POST.get('choice')} "
                f"({approval.name if approval else 'approval'}).",
            )
        return HttpResponseRedirect(here)
    groups: dict[str, list[Item]] = {}
    runs = list(waiting_approvals()[:PAGE])
    for run in runs:
        groups.setdefault(run.workflow, []).append(
            Item(
                run=run,
                approval=approval_of(run),
                attributes=links(run.attributes),
                url=object_page(model_admin, run),
                can_decide=can_decide(request.user, run),
            )
        )
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": "Waiting for a person",
        "groups": sorted(groups.items()),
        "shown": len(runs),
        "page": PAGE,
    }
    return TemplateResponse(request, "kumiflow/inbox.html", context)
