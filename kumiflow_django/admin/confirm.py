"""Operator actions with a confirmation page and an audit trail.

Every action the console offers (cancel, wake, retry, redeliver, fire now,
…) is an :class:`Operation`: who may do it, to which objects it applies,
what it will do (said on the confirmation page before anything happens),
and the public function that does it. The confirmation page takes an
optional reason; the operator (the logged-in user) and the reason go to
that function, which stores them in the event it appends.

A page of one object is ``<object>/operate/<operation>/``: GET shows the
confirmation, POST does it. The permission is checked first, on both (403
for a user without it); a malformed or unknown id is a 404. The actions of
the change lists go through a confirmation page listing the selected rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from kumiflow_django.store import limits
from kumiflow_django.store.errors import KumiflowError

if TYPE_CHECKING:
    from kumiflow_django.admin.base import ReadOnlyAdmin


@dataclass(frozen=True)
class Operation:
    """One operator action on one kind of object.

    ``refuse(obj)`` says why it does not apply (None: it does); ``explain(obj)``
    says what it will do, a line each; ``perform(obj, by, reason)`` does it
    through the public function.
    """

    name: str
    label: str
    permission: str
    done: str
    refuse: Callable[[Any], str | None]
    explain: Callable[[Any], Sequence[str]]
    perform: Callable[[Any, str, str], Any]
    danger: bool = False


class ReasonForm(forms.Form):
    reason = forms.CharField(
        label="Reason",
        required=False,
        max_length=limits.OPERATOR_REASON,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Optional. Stored with your user name in the event this appends.",
    )


def operator(request: HttpRequest) -> str:
    """Who is acting: the logged-in user's name (it fits ``created_by``)."""
    return str(request.user.get_username())[: limits.OPERATOR]


def object_page(model_admin: ReadOnlyAdmin, obj: Model) -> str:
    opts = obj._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(obj.pk)])


def operate_view(
    model_admin: ReadOnlyAdmin,
    request: HttpRequest,
    object_id: str,
    operation_name: str,
    *,
    title: Callable[[Any], str],
) -> HttpResponse:
    """The confirmation page of one operation on one object (GET), and doing it (POST)."""
    operation = model_admin.operations.get(operation_name)
    if operation is None or not model_admin.user_can(request, operation.permission):
        raise PermissionDenied
    if request.method not in ("GET", "POST"):
        raise PermissionDenied
    obj = model_admin.object_or_404(request, object_id)
    back = object_page(model_admin, obj)
    refused = operation.refuse(obj)
    form = ReasonForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and refused is not None:
        model_admin.message_user(request, f"Not {operation.done}: {refused}.", messages.ERROR)
        return HttpResponseRedirect(back)
    if request.method == "POST" and form.is_valid():
        try:
            operation.perform(obj, operator(request), form.cleaned_data["reason"])
        except KumiflowError as exc:
            model_admin.message_user(request, f"Not {operation.done}: {exc}", messages.ERROR)
        else:
            model_admin.message_user(request, f"{title(obj)} {operation.done}.", messages.SUCCESS)
        return HttpResponseRedirect(back)
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": f"{operation.label}: {title(obj)}",
        "subject": title(obj),
        "object": obj,
        "operation": operation,
        "refused": refused,
        "explain": operation.explain(obj) if refused is None else [],
        "form": form,
        "back": back,
    }
    return TemplateResponse(request, "kumiflow/confirm.html", context)


def bulk(
    model_admin: ReadOnlyAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    operation_name: str,
    action: str,
) -> TemplateResponse | None:
    """A change-list action: the confirmation page of the selected rows, then
    the operation on each that it applies to (one message says what was done,
    one what was skipped and why). "Select all N matching" of a list that
    runs bulk operations (the run list) goes to its pre-flight page instead."""
    by_filter = getattr(model_admin, "bulk_by_filter", None)
    if by_filter is not None and request.POST.get("select_across") == "1":
        return by_filter(request, queryset, operation_name, action)  # type: ignore[no-any-return]
    operation = model_admin.operations[operation_name]
    rows = list(queryset[:500])
    form = ReasonForm(request.POST if request.POST.get("confirm") == "yes" else None)
    if request.POST.get("confirm") == "yes" and form.is_valid():
        by, reason = operator(request), form.cleaned_data["reason"]
        done, skipped = 0, []
        for obj in rows:
            why = operation.refuse(obj)
            if why is None:
                try:
                    operation.perform(obj, by, reason)
                except KumiflowError as exc:
                    why = str(exc)
                else:
                    done += 1
            if why is not None:
                skipped.append(f"{obj.pk}: {why}")
        model_admin.report(request, operation.done, done, skipped)
        return None
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": f"{operation.label}: {len(rows)} selected",
        "operation": operation,
        "action": action,
        "rows": [(obj, operation.refuse(obj)) for obj in rows],
        "applicable": sum(operation.refuse(obj) is None for obj in rows),
        "form": form,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, "kumiflow/confirm_bulk.html", context)
