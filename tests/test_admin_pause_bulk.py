"""The console's pause, resume and fail, pausing a workflow, and bulk actions on
every run the list's filters match: all through the public functions."""

from __future__ import annotations

import pytest
from django.urls import reverse

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import BulkOperation, Event, PausedScope, RunStatus, WorkflowRun
from kumiflow_django.testing import run_until_idle

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs(registry, clock):
    define_workflow("slow", steps=[s.wait("P1D"), s.return_("done")])
    define_workflow("quick", steps=[s.return_("done")])
    waiting = [start_workflow("slow") for _ in range(5)]
    start_workflow("quick")
    return waiting


def test_pause_and_resume_a_run_from_its_page(admin_client, runs):
    run = runs[0]
    operate = reverse("admin:kumiflow_workflowrun_operate", args=[run.pk, "pause"])
    page = admin_client.get(operate).content.decode()
    assert "No worker takes the run until it is resumed" in page
    admin_client.post(operate, {"reason": "partner outage"})
    run.refresh_from_db()
    assert run.paused
    listed = admin_client.get(reverse("admin:kumiflow_workflowrun_changelist")).content.decode()
    assert ">paused</span>" in listed
    resume = reverse("admin:kumiflow_workflowrun_operate", args=[run.pk, "resume"])
    admin_client.post(resume, {"reason": "back"})
    run.refresh_from_db()
    assert not run.paused
    assert [e.created_by for e in Event.objects.filter(type__endswith="run-resumed")] == ["admin"]


def test_fail_a_run_from_its_page(admin_client, runs):
    run = runs[0]
    admin_client.post(
        reverse("admin:kumiflow_workflowrun_operate", args=[run.pk, "fail"]), {"reason": "no"}
    )
    run.refresh_from_db()
    assert (run.status, run.reason, run.last_error) == (
        RunStatus.FAILED,
        "failed_by_operator",
        "no",
    )


def test_select_all_matching_shows_the_preflight_count_then_cancels_them(admin_client, runs):
    url = reverse("admin:kumiflow_workflowrun_changelist") + "?workflow=slow&status__exact=waiting"
    chosen = {"action": "cancel_runs", "select_across": "1", "_selected_action": [runs[0].pk]}
    preflight = admin_client.post(url, chosen)
    assert preflight.status_code == 200
    page = preflight.content.decode()
    assert "<strong>5</strong> runs match this filter" in page
    assert WorkflowRun.objects.filter(status=RunStatus.CANCELLED).count() == 0
    response = admin_client.post(
        url, {**chosen, "confirm": "yes", "reason": "bad batch"}, follow=True
    )
    text = " ".join(str(m) for m in response.context["messages"])
    assert "5 of 5 matching runs cancelled, 0 skipped" in text
    assert WorkflowRun.objects.filter(status=RunStatus.CANCELLED).count() == 5
    assert WorkflowRun.objects.get(workflow="quick").status == RunStatus.COMPLETED
    operation = BulkOperation.objects.get()
    assert (operation.by, operation.reason, operation.filters) == (
        "admin",
        "bad batch",
        {"workflow": "slow", "status": ["waiting"], "roots_only": True},
    )


def test_a_filter_a_bulk_operation_cannot_take_is_said_not_guessed(admin_client, runs):
    url = reverse("admin:kumiflow_workflowrun_changelist") + "?attention=due"
    chosen = {"action": "cancel_runs", "select_across": "1", "_selected_action": [runs[0].pk]}
    page = admin_client.post(url, {**chosen, "confirm": "yes"}).content.decode()
    assert "cannot choose the runs of a bulk operation" in page
    assert WorkflowRun.objects.filter(status=RunStatus.CANCELLED).count() == 0


def test_pause_a_workflow_and_resume_it(admin_client, runs, clock):
    pause = reverse("admin:kumiflow_pausedscope_pause")
    assert "Pause a workflow or a tenant" in admin_client.get(pause).content.decode()
    admin_client.post(pause, {"kind": "workflow", "name": "slow", "reason": "deploy"})
    scope = PausedScope.objects.get()
    assert (scope.name, scope.paused, scope.by, scope.reason) == ("slow", True, "admin", "deploy")
    clock.advance(days=2)
    run_until_idle()
    assert WorkflowRun.objects.filter(workflow="slow", status=RunStatus.WAITING).count() == 5
    admin_client.post(
        reverse("admin:kumiflow_pausedscope_operate", args=[scope.pk, "resume"]), {"reason": "ok"}
    )
    run_until_idle()
    assert WorkflowRun.objects.filter(workflow="slow", status=RunStatus.COMPLETED).count() == 5
