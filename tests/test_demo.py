"""``make demo`` tells its story and leaves a run waiting for an approval and a
failed run to look at in the console."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from kumiflow_django.models import Event, RunStatus, RunWait, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_demo_leaves_a_waiting_and_a_failed_run_for_the_console():
    out = io.StringIO()
    call_command("demo", stdout=out)
    text = out.getvalue()
    assert "2 of 2 onboarding runs completed." in text
    waiting = WorkflowRun.objects.get(workflow="refund-approval")
    assert waiting.status == RunStatus.WAITING_EVENT
    assert RunWait.objects.get(run_id=waiting.pk).event_type == "refund.approved"
    failed = WorkflowRun.objects.get(workflow="invoice-reminder")
    assert failed.status == RunStatus.FAILED
    failure = Event.objects.get(stream_id=str(failed.pk), type="kumiflow.workflow.run-failed")
    assert failure.payload["steps"] == {"customer": None}, "the None the next step indexed"
    assert "TypeError: 'NoneType' object is not subscriptable" in failure.payload["traceback"]
    assert f"/admin/kumiflow/workflowrun/{waiting.pk}/change/" in text
    assert f"/admin/kumiflow/workflowrun/{failed.pk}/change/" in text
    assert "/admin/kumiflow/workflowrun/overview/" in text
