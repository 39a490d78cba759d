"""Pausing a workflow and resuming it, and a bulk cancel of every run a filter
matches, in a real headless Chromium (screenshots for docs/admin.md with
``KUMIFLOW_UPDATE_SCREENSHOTS=1``)."""

from __future__ import annotations

import pytest

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import Event, RunStatus, WorkflowRun
from kumiflow_django.testing import run_until_idle
from tests.test_browser import page, screenshot  # noqa: F401 - the logged-in page fixture

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def newsletters(registry, clock):
    define_workflow("newsletter", steps=[s.wait("PT1H"), s.return_("sent")])
    define_workflow("invoice", steps=[s.wait("PT1H"), s.return_("paid")])
    runs = [start_workflow("newsletter") for _ in range(3)]
    start_workflow("invoice")
    return runs


def test_pause_a_workflow_and_resume_it(page, live_server, newsletters, clock):  # noqa: F811
    page.goto(f"{live_server.url}/admin/kumiflow/pausedscope/")
    page.click("#kf-pause-scope")
    page.wait_for_selector("#id_name")
    page.select_option("#id_kind", "workflow")
    page.fill("#id_name", "newsletter")
    page.fill("#id_reason", "the mail provider is down")
    screenshot(page, "pause-workflow.png")
    page.click("#kf-confirm")
    page.wait_for_selector(".messagelist .success")
    assert "The workflow newsletter is paused." in page.inner_text(".messagelist")
    assert "the mail provider is down" in page.inner_text("#result_list")
    screenshot(page, "paused-scopes.png")

    clock.advance(hours=2)
    run_until_idle()
    statuses = dict(WorkflowRun.objects.values_list("workflow", "status").distinct())
    assert statuses == {"newsletter": RunStatus.WAITING, "invoice": RunStatus.COMPLETED}

    page.click("#result_list a:has-text('newsletter')")
    page.click("a.kf-op:has-text('Resume')")
    page.wait_for_selector("text=What will happen")
    page.fill("#id_reason", "the provider is back")
    page.click("#kf-confirm")
    page.wait_for_selector(".messagelist .success")
    run_until_idle()
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {RunStatus.COMPLETED}
    resumed = Event.objects.get(type="kumiflow.pause.scope-resumed")
    assert (resumed.created_by, resumed.payload["reason"]) == ("ops", "the provider is back")


def test_a_bulk_cancel_of_all_runs_matching_a_filter(page, live_server, registry, clock):  # noqa: F811
    define_workflow("reminder", steps=[s.wait("P1D"), s.return_("reminded")])
    define_workflow("invoice", steps=[s.wait("P1D"), s.return_("paid")])
    for _ in range(105):  # more than a page of the list (100)
        start_workflow("reminder")
    start_workflow("invoice")
    page.goto(f"{live_server.url}/admin/kumiflow/workflowrun/?workflow=reminder")
    page.check("#action-toggle")
    page.click("span.question a")  # "Select all 105 workflow runs"
    page.select_option("select[name=action]", "cancel_runs")
    page.click("button[name=index]")
    page.wait_for_selector("#kf-bulk-count")
    assert "105 runs match this filter" in page.inner_text("#kf-bulk-count")
    page.fill("#id_reason", "the reminder campaign was sent by mistake")
    screenshot(page, "bulk-preflight.png")
    page.click("#kf-confirm")
    page.wait_for_selector(".messagelist .success")
    assert "105 of 105 matching runs cancelled, 0 skipped" in page.inner_text(".messagelist")
    screenshot(page, "bulk-done.png", full_page=False)
    statuses = dict(WorkflowRun.objects.values_list("workflow", "status").distinct())
    assert statuses == {"reminder": RunStatus.CANCELLED, "invoice": RunStatus.WAITING}
    cancelled = Event.objects.filter(type="kumiflow.workflow.run-cancelled")
    assert {(e.created_by, e.payload["reason"]) for e in cancelled} == {
        ("ops", "the reminder campaign was sent by mistake")
    }


def _refuse_first(tries: dict[str, int]) -> str:
    tries["n"] += 1
    if tries["n"] <= 3:
        raise RuntimeError("the partner API is down")
    return "sent"


def test_a_bulk_restart_from_a_step_of_all_failed_runs(page, live_server, registry, clock):  # noqa: F811
    tries = {"n": 0}
    define_workflow(
        "partner-sync",
        steps=[
            s.compute("fetch", lambda ctx: "rows"),
            s.wait("PT1H"),
            s.compute("sync", lambda ctx: _refuse_first(tries)),
        ],
    )
    for _ in range(3):
        start_workflow("partner-sync")
    clock.advance(hours=2)
    run_until_idle()
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {RunStatus.FAILED}
    page.goto(f"{live_server.url}/admin/kumiflow/workflowrun/?status__exact=failed")
    page.check("#action-toggle")
    page.select_option("select[name=action]", "restart_runs")
    page.click("button[name=index]")
    page.wait_for_selector("#kf-bulk-count")
    assert "3 runs match the selection" in page.inner_text("#kf-bulk-count")
    page.fill("#id_from_step", "1")
    page.fill("#id_reason", "the partner API is back")
    screenshot(page, "bulk-restart.png")
    page.click("#kf-confirm")
    page.wait_for_selector(".messagelist .success")
    assert "3 of 3 matching runs restarted, 0 skipped" in page.inner_text(".messagelist")
    clock.advance(hours=2)  # the restarted runs wait at step 1 again
    run_until_idle()
    assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == 3
    restarted = Event.objects.filter(type="kumiflow.workflow.run-restarted")
    assert {(e.created_by, e.payload["from_step"]) for e in restarted} == {("ops", "1")}
