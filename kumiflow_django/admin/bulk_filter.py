"""An action on every run the run list's filters match ("select all N matching").

The run list's filters become a bulk operation's filter
(:mod:`kumiflow_django.engine.bulk`): a pre-flight page says how many runs
match and what the action does to each; on confirmation the operation is
recorded with the operator and the reason and worked through in batches:
the first few seconds in the request, the rest by the worker's bulk loop
(or ``manage.py kumiflow_bulk --continue``). Each run goes through the same
public function as one run, and a run the action refuses is skipped with
its reason.

Restart from a step is a bulk action only (its run page has its own
pre-flight, :mod:`.restart`): the page asks for the step path (each run's
own step at it) and the definition, for the runs selected on a page or for
all matching.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from kumiflow_django.admin.confirm import Operation, ReasonForm, operator
from kumiflow_django.engine import bulk
from kumiflow_django.engine import restart as restarts
from kumiflow_django.store.errors import KumiflowError

if TYPE_CHECKING:
    from kumiflow_django.admin.base import ReadOnlyAdmin

#: The run list's filters a bulk operation takes, and its filter's name for each.
LIST_FILTERS = {
    "status__exact": "status",
    "paused__exact": "paused",
    "workflow": "workflow",
    "tenant": "tenant",
    "parent": "parent",
}
#: Query parameters of the list that do not choose runs (order, page, popups).
_IGNORED = {"o", "p", "_changelist_filters", "_to_field", "_popup", "e"}
#: Seconds of the operation done in the request; the worker does the rest.
IN_REQUEST = 5.0


def _explain_restart(run: Any) -> list[str]:
    return [
        "Each run restarts as a new run, from its own step at that path, keeping the "
        "results of the steps before it (restart_run); the old run stays as it ended.",
        "A run where that step did not run, or that a restart refuses (still running, "
        "compensated, its definition gone), is skipped with the reason.",
        "The steps from it on run again, with their side effects: open a run's Restart "
        "page to see which mails, webhooks, tasks and child runs repeat.",
    ]


def _restart_needs_a_step(run: Any, by: str, reason: str) -> None:
    raise KumiflowError("a restart from the run list needs a step path: use its bulk page")


#: The actions of the bulk pages only (not offered on a run's page).
BULK_ONLY = {
    "restart": Operation(
        name="restart",
        label="Restart from a step",
        permission="retry_workflowrun",
        done="restarted",
        refuse=restarts.refuse_restart,
        explain=_explain_restart,
        # Never one run at a time: the bulk pages call bulk_runs with the step
        # path the operator chose (a restart without one would begin at step 0).
        perform=_restart_needs_a_step,
        danger=True,
    ),
}


class RestartForm(ReasonForm):
    """The reason, and the step path and definition of a bulk restart."""

    from_step = forms.CharField(
        label="Restart from step",
        max_length=restarts.MAX_PATH_LENGTH,
        initial="0",
        help_text="The step's path as the run's trail names it (2, 2.then.0); 0 starts each "
        "run again with the same input.",
    )
    definition = forms.ChoiceField(
        label="Definition",
        choices=[("run", "each run's own"), ("current", "the current one")],
        initial="run",
    )

    def clean_from_step(self) -> str:
        text = str(self.cleaned_data["from_step"]).strip()
        try:
            restarts.parse_path(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return text


def filters_of(request: HttpRequest) -> tuple[dict[str, Any], list[str]]:
    """The bulk filter of the list's query string, and the filters it cannot take."""
    filters: dict[str, Any] = {}
    unsupported = []
    for name in request.GET:
        text = str(request.GET.get(name, "")).strip()
        if name in LIST_FILTERS:
            if text:
                filters[LIST_FILTERS[name]] = text == "1" if name == "paused__exact" else text
        elif name == "children":
            continue
        elif name not in _IGNORED and text:
            unsupported.append(name)
    shown = request.GET.get("children") == "yes" or "parent" in filters
    if not shown:
        filters["roots_only"] = True  # the list hides child runs unless asked
    return filters, unsupported


def confirm(
    model_admin: ReadOnlyAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    operation_name: str,
    action: str,
) -> TemplateResponse | None:
    """The pre-flight page (GET of the action), then the bulk operation (confirmed)."""
    operation = BULK_ONLY.get(operation_name) or model_admin.operations[operation_name]
    across = operation_name not in BULK_ONLY or request.POST.get("select_across") == "1"
    selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
    if across:
        filters, unsupported = filters_of(request)
    else:  # the runs selected on the page
        filters, unsupported = {"ids": [str(pk) for pk in selected]}, []
    if operation_name not in bulk.ACTIONS:
        model_admin.message_user(
            request,
            f"{operation.label} is not a bulk action: select the runs on a page instead.",
            messages.ERROR,
        )
        return None
    kind = RestartForm if operation_name in bulk.STEP_ACTIONS else ReasonForm
    form = kind(request.POST if request.POST.get("confirm") == "yes" else None)
    if not unsupported and request.POST.get("confirm") == "yes" and form.is_valid():
        step = {k: form.cleaned_data[k] for k in ("from_step", "definition") if k in form.fields}
        try:
            recorded = bulk.bulk_runs(
                operation_name,
                filters=filters,
                reason=form.cleaned_data["reason"],
                by=operator(request),
                run=False,
                **step,
            )
            done = bulk.continue_bulk(recorded.id, budget=IN_REQUEST)
        except KumiflowError as exc:
            model_admin.message_user(request, f"Not {operation.done}: {exc}", messages.ERROR)
            return None
        model_admin.message_user(request, summary(done, operation.done), messages.SUCCESS)
        for reason, count in done.skipped_reasons.items():
            model_admin.message_user(request, f"{count} skipped: {reason}", messages.WARNING)
        return None
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": f"{operation.label}: every matching run",
        "operation": operation,
        "action": action,
        "count": matching_count(filters) if not unsupported else None,
        "across": across,
        "selected": selected if not across else [],
        "listed": queryset.count(),
        "filters": sorted((k, v) for k, v in filters.items()),
        "unsupported": unsupported,
        "explain": _explain(operation_name),
        "form": form,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, "kumiflow/confirm_bulk_filter.html", context)


def matching_count(filters: dict[str, Any]) -> int:
    """The pre-flight count of the runs ``filters`` match."""
    return bulk.matching(bulk.check_filters(filters)).count()


def summary(operation: bulk.BulkOperation, verb: str) -> str:
    """One line on a bulk operation's progress."""
    if operation.status == bulk.BulkStatus.DONE:
        head = f"{operation.done} of {operation.total} matching runs {verb}"
    else:
        head = (
            f"{operation.done} of {operation.total} matching runs {verb} so far; the worker "
            "goes on with the rest"
        )
    return (
        f"{head}, {operation.skipped} skipped, {operation.errors} errors "
        f"(bulk operation {operation.id})."
    )


def _explain(action: str) -> list[str]:
    return [
        "Runs are taken in batches (one short transaction each), each through the same "
        f"operation as one run's {action}: every run's event says who and why.",
        "A run the action does not apply to (by the time its batch comes) is skipped, with "
        "the reason counted.",
        "If it is interrupted, the worker continues it where it stopped.",
    ]
