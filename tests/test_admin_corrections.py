"""The console, corrected (issue 25): what a run's page, the run list and the overview say."""

from __future__ import annotations

import pytest
from django.urls import reverse

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.admin import run_page
from kumiflow_django.models import Dispatch, Event, RunStatus, StepTask
from kumiflow_django.store import names as ev
from kumiflow_django.tasks import attempts
from kumiflow_django.testing import run_until_idle
from testproject.shop import tasks as shop_tasks
from tests.test_admin_console import run_url

pytestmark = pytest.mark.django_db

RUNS = "/admin/kumiflow/workflowrun/"


def test_a_failed_compensation_is_named_in_words_not_by_its_cursor(admin_client, registry, clock):
    def refund(ctx):
        raise ConnectionError("the bank is down")

    define_workflow(
        "booking",
        steps=[
            s.compute("charge", lambda ctx: 1, compensate=[s.compute("refund", refund)]),
            s.wait("PT1H"),
            s.compute("ship", lambda ctx: 1 / 0),
        ],
    )
    run = start_workflow("booking")
    clock.advance(hours=2)
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.compensation) == (RunStatus.FAILED, "compensation_failed")
    page = admin_client.get(run_url(run)).content.decode()
    headline = page.split('id="kf-failure"', 1)[1].split("</h2>", 1)[0]
    assert "$compensate" not in headline
    assert "compute refund" in headline
    assert "the compensation of step 0 (compute charge)" in headline
    # A run stopped at a position in its compensations says the same.
    outline = run_page.definition_of(run).outline
    assert outline is not None
    steps = outline["steps"]
    run.state = {**run.state, "compensations": [{"path": [0], "scope": {}, "branch": ""}]}
    assert run_page.step_words(run, "$compensate.0.0", steps) == (
        "0.compensate.0",
        "compute refund, the compensation of step 0 (compute charge)",
    )


def test_a_completed_run_with_a_dead_delivery_is_flagged_everywhere(admin_client, registry):
    define_workflow(
        "notify",
        steps=[s.webhook_send("ftp://crm.example.com/hook", body={}, name="hook"), s.return_(1)],
    )
    define_workflow("fine", steps=[s.return_(1)])
    run = start_workflow("notify")
    start_workflow("fine")
    assert run.status == RunStatus.COMPLETED
    assert Dispatch.objects.get(run_id=run.id).status == "dead"

    page = admin_client.get(run_url(run)).content.decode()
    assert 'id="kf-delivery-problems"' in page
    assert "Completed, but 1 delivery is dead or failing" in page
    listed = admin_client.get(RUNS).content.decode()
    assert listed.count("kf-delivery-problem") == 1 and "⚠ webhook dead" in listed
    overview = admin_client.get(reverse("admin:kumiflow_overview")).content.decode()
    figure = overview.split('id="kf-delivery-problems">', 1)[1].split("<", 1)[0]
    assert figure.strip() == "1"
    flagged = admin_client.get(RUNS, {"attention": "delivery"}).content.decode()
    assert str(run.id)[:8] in flagged and flagged.count('class="field-short_id"') == 1


def test_the_run_list_says_why_a_run_failed(admin_client, registry):
    define_workflow("broken", steps=[s.compute("x", lambda ctx: 1 / 0)])
    start_workflow("broken")
    listed = admin_client.get(RUNS).content.decode()
    assert '<span class="kf-sub"><span class="kf-why"' in listed  # under its status
    assert "step_failed: ZeroDivisionError at step 0 (compute &#x27;x&#x27;)" in listed


def test_the_overview_lists_the_workflows_that_have_runs(admin_client, registry):
    define_workflow("used", steps=[s.return_(1)])
    for name in ("idle-a", "idle-b"):
        define_workflow(name, steps=[s.return_(1)])
    start_workflow("used")
    page = admin_client.get(reverse("admin:kumiflow_overview")).content.decode()
    assert ">used</a>" in page
    assert "idle-a" not in page and "idle-b" not in page
    assert "2 registered workflows without runs not listed." in page


def test_a_task_step_shows_how_long_its_task_ran(admin_client, registry, clock):
    define_workflow(
        "slow",
        steps=[
            s.task("work", shop_tasks.heartbeating, args=lambda ctx: ["slow-1", 0.3, 0.1]),
            s.return_(lambda ctx: ctx.steps["work"]),
        ],
    )
    run = start_workflow("slow")
    run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    page = admin_client.get(run_url(run)).content.decode()
    step = page.split('data-path="0">', 1)[1].split("</li>", 1)[0]
    took = step.split('class="kf-took">', 1)[1].split("<", 1)[0]
    # The attempt's own time, not the instant the segment took to hand it over.
    assert took.startswith("ran ") and took.split()[1].isdigit() and int(took.split()[1]) >= 300


def test_the_branch_not_taken_shows_no_result(admin_client, registry):
    define_workflow(
        "pay",
        steps=[
            s.branch(
                lambda ctx: True,
                then=[s.compute("payment", lambda ctx: "card")],
                else_=[s.compute("payment", lambda ctx: "invoice")],
            ),
            s.return_(1),
        ],
    )
    run = start_workflow("pay")
    page = admin_client.get(run_url(run)).content.decode()
    taken = page.split('data-path="0.then.0">', 1)[1].split("</li>", 1)[0]
    other = page.split('data-path="0.else.0">', 1)[1].split("</li>", 1)[0]
    assert "card" in taken
    assert "kf-result" not in other and "card" not in other


def test_a_lost_worker_is_said_so_timed_and_counted_as_a_recovery(admin_client, registry, clock):
    define_workflow(
        "invoice",
        steps=[
            s.task(
                "pdf",
                shop_tasks.double,
                args=lambda ctx: [2],
                timeout=30,
                retry={"attempts": 2, "base": 0.1, "jitter": 0.0},
            ),
            s.return_(lambda ctx: ctx.steps["pdf"]),
        ],
    )
    run = start_workflow("invoice")
    task = StepTask.objects.get(run_id=run.id)
    assert attempts.claim(task.id, worker="w1") is not None  # then w1 is SIGKILLed
    clock.advance(seconds=31)
    assert attempts.expire(task.id, clock.now()) is not None  # the sweep gives it up
    failed = Event.objects.get(stream_id=str(task.id), type=ev.TASK_ATTEMPT_FAILED).payload
    assert failed["error_type"] == ev.WORKER_LOST
    assert failed["error"].startswith("worker lost: ") and "(worker w1)" in failed["error"]
    assert failed["duration"] == 30.0  # started to the end of its lease, not 0.0
    clock.advance(seconds=1)  # the second attempt is due
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, 4)

    page = admin_client.get(run_url(run)).content.decode()
    lost = page.split(f'id="kf-task-{task.id}-1">', 1)[1].split("</tr>", 1)[0]
    assert "<td>worker lost, retried</td>" in lost
    assert "<td>30.0 s</td>" in lost and "TimeoutError" not in lost
    overview = admin_client.get(reverse("admin:kumiflow_overview")).content.decode()
    recovered = overview.split("recovered from a stalled worker (last day)</dt>", 1)[1]
    assert 'class="kf-figure">1<' in recovered.split("</dd>", 1)[0]
    listed = admin_client.get(RUNS, {"attention": "recovered"}).content.decode()
    assert str(run.id)[:8] in listed
