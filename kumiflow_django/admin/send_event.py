"""Sending the event a run waits for (an approval), as the operator.

The form is prefilled from the run's wait: the awaited type, and the fields
its match names (``payload.order_id`` becomes ``{"order_id": 7}`` in the
payload, ``stream_id`` the stream). The event is appended through the public
``append_event``, like any other event, with the operator as its
``created_by``; in the appending transaction it wakes the run (or, with
``KUMIFLOW_EVENT_WAKE = "worker"``, makes it due for a worker). Needs the
``kumiflow.send_event_workflowrun`` permission.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from kumiflow_django.admin.confirm import object_page, operator
from kumiflow_django.projections.runs import RunStatus, WorkflowRun
from kumiflow_django.projections.waits import own_wait
from kumiflow_django.store import limits
from kumiflow_django.store.errors import KumiflowError
from kumiflow_django.store.log import RESERVED_PREFIX, append_event
from kumiflow_django.store.models import Event

if TYPE_CHECKING:
    from kumiflow_django.admin.base import ReadOnlyAdmin

#: Where the console notes, in the event's metadata, that an operator sent it
#: (a key with a dot: no match path can name it, so no wait can depend on it).
METADATA_KEY = "kumiflow.console"


class JSONObjectField(forms.CharField):
    """A JSON object typed into a text area."""

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if not text:
            return {}
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise forms.ValidationError("must be a JSON object ({…})")
        return data


class SendEventForm(forms.Form):
    stream_id = forms.CharField(
        label="Stream id",
        max_length=limits.STREAM_ID,
        help_text="The stream the event is appended to (an order's stream, say).",
    )
    stream_type = forms.CharField(
        label="Stream type", max_length=limits.STREAM_TYPE, required=False
    )
    payload = JSONObjectField(
        label="Payload",
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "cols": 60, "class": "kf-code"}),
    )
    metadata = JSONObjectField(
        label="Metadata",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "class": "kf-code"}),
    )
    reason = forms.CharField(
        label="Reason",
        required=False,
        max_length=limits.OPERATOR_REASON,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Optional. Kept in the event's metadata with your user name.",
    )


def refuse(run: WorkflowRun) -> str | None:
    if run.status != RunStatus.WAITING_EVENT:
        return f"the run is {run.status}: it waits for no event"
    wait = own_wait(run)
    if wait is None:
        return "the run waits for no event"
    if wait.event_type.startswith(RESERVED_PREFIX):
        return (
            "the run waits for the delivery of an outbox request "
            f"({wait.event_type}); only the engine writes that event"
        )
    return None


def _put(target: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        nested = target.setdefault(key, {})
        if not isinstance(nested, dict):
            return
        target = nested
    target[keys[-1]] = value


def prefill(run: WorkflowRun) -> dict[str, Any]:
    """The form's first values: the fields the run's wait matches on."""
    payload: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    stream_id = stream_type = ""
    wait = own_wait(run)
    match = wait.match if wait is not None and isinstance(wait.match, dict) else {}
    for path, value in sorted(match.items()):
        if path == "stream_id":
            stream_id = str(value)
        elif path == "stream_type":
            stream_type = str(value)
        else:
            root, *keys = path.split(".")
            _put(payload if root == "payload" else metadata, keys, value)
    if not stream_id and run.trigger_position is not None:
        trigger = (
            Event.objects.filter(position=run.trigger_position)
            .values_list("stream_id", flat=True)
            .first()
        )
        stream_id = trigger or ""
    return {
        "stream_id": stream_id,
        "stream_type": stream_type,
        "payload": json.dumps(payload, indent=2, ensure_ascii=False),
        "metadata": json.dumps(metadata, indent=2, ensure_ascii=False) if metadata else "",
    }


def send_event_view(
    model_admin: ReadOnlyAdmin, request: HttpRequest, object_id: str
) -> HttpResponse:
    if not model_admin.user_can(request, "send_event_workflowrun"):
        raise PermissionDenied
    if request.method not in ("GET", "POST"):
        raise PermissionDenied
    run: WorkflowRun = model_admin.object_or_404(request, object_id)
    back = object_page(model_admin, run)
    refused = refuse(run)
    wait = own_wait(run)
    awaited_type = wait.event_type if wait is not None else ""
    awaited_match = wait.match if wait is not None and isinstance(wait.match, dict) else {}
    form = SendEventForm(request.POST if request.method == "POST" else None, initial=prefill(run))
    if request.method == "POST" and refused is not None:
        model_admin.message_user(request, f"No event sent: {refused}.", messages.ERROR)
        return HttpResponseRedirect(back)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        by = operator(request)
        metadata = dict(data["metadata"])
        note: dict[str, Any] = {"by": by, "run": str(run.id)}
        if data["reason"]:
            note["reason"] = data["reason"]
        metadata[METADATA_KEY] = note
        try:
            event = append_event(
                data["stream_id"],
                awaited_type,
                data["payload"],
                stream_type=data["stream_type"],
                tenant=run.tenant_id,
                metadata=metadata,
                created_by=by,
            )
        except (KumiflowError, ValueError) as exc:
            form.add_error(None, f"Not appended: {exc}")
        else:
            _report(model_admin, request, run, event)
            return HttpResponseRedirect(back)
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": f"Send {awaited_type} to run {str(run.id)[:8]}",
        "subject": f"Run {str(run.id)[:8]}",
        "run": run,
        "refused": refused,
        "form": form,
        "back": back,
        "match": sorted(awaited_match.items()),
        "awaited_type": awaited_type,
    }
    return TemplateResponse(request, "kumiflow/send_event.html", context)


def _report(
    model_admin: ReadOnlyAdmin, request: HttpRequest, run: WorkflowRun, event: Event
) -> None:
    after = WorkflowRun.objects.filter(pk=run.pk).first()
    if after is None or after.version != run.version:
        state = after.get_status_display() if after is not None else "gone"
        if (
            after is not None
            and after.status == RunStatus.WAITING_EVENT
            and after.matched_position == event.position
        ):
            text = f"the run took it and is due: a worker continues it (now {state})"
        else:
            text = f"the run took it and went on (now {state})"
        level = messages.SUCCESS
    else:
        text = (
            "the run did not take it: the event does not match what the run waits for "
            "(check the fields the wait matches on)"
        )
        level = messages.WARNING
    model_admin.message_user(
        request, f"Event #{event.position} {event.type} appended; {text}.", level
    )
