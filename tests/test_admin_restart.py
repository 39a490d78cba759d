"""The console's restart: the run page offers it, the pre-flight page says what repeats."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import Event, RunStatus, WorkflowRun
from kumiflow_django.testing import run_until_idle
from testproject.shop import tasks as shop_tasks
from tests.test_admin_console import run_url, staff_with

pytestmark = pytest.mark.django_db


def restart_url(run) -> str:
    return reverse("admin:kumiflow_workflowrun_restart", args=[run.pk])


@pytest.fixture
def order(registry, clock):
    broken = {"yes": True}

    def ship(ctx):
        if broken["yes"]:
            raise RuntimeError("carrier down")
        return "shipped"

    define_workflow(
        "order",
        steps=[
            s.compute("order", lambda ctx: 7),
            s.wait("PT1H"),
            s.webhook_send("https://crm.example.com/hook", body={"o": 7}, name="notify"),
            s.task("invoice", shop_tasks.double, args=lambda ctx: {"n": 2}),
            s.compute("ship", ship),
        ],
    )
    run = start_workflow("order")
    clock.advance(hours=2)
    run_until_idle(dispatch=False)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    broken["yes"] = False
    return run


def test_the_pre_flight_lists_the_webhook_and_the_task_that_happen_again(admin_client, order):
    page = admin_client.get(run_url(order)).content.decode()
    assert 'id="kf-restart"' in page and ">Restart<" in page
    # the picture links each step the run can restart from to its pre-flight
    links = re.findall(r'class="kf-restart-here" href="[^"]*from_step=([\d.a-z]+)', page)
    assert links == ["0", "1", "2", "3"]  # not 4: the failed segment began at 3
    plan = admin_client.get(restart_url(order), {"from_step": "1"}).content.decode()
    assert "<tr class=\"kf-repeat-new\"><td>2 'notify'</td><td>webhook</td>" in plan.replace(
        "&#x27;", "'"
    )
    assert "<td>3 'invoice'</td><td>task</td>" in plan.replace("&#x27;", "'")
    assert "the results of order" in plan
    refused = admin_client.get(restart_url(order), {"from_step": "4"}).content.decode()
    assert 'id="kf-restart-refused"' in refused and "rolled back" in refused


def test_confirming_restarts_and_redirects_to_the_new_run(admin_client, order, clock):
    response = admin_client.post(restart_url(order), {"from_step": "1", "reason": "carrier ok"})
    new = WorkflowRun.objects.exclude(pk=order.pk).get()
    assert response.status_code == 302 and response["Location"] == run_url(new)
    marker = Event.objects.filter(stream_id=str(order.id)).order_by("-version")[0]
    assert (marker.type, marker.created_by, marker.payload["reason"]) == (
        "kumiflow.workflow.run-restarted",
        "admin",
        "carrier ok",
    )
    timeline = admin_client.get(run_url(order)).content.decode()
    assert f"as run {new.id}" in timeline
    started = admin_client.get(run_url(new)).content.decode()
    assert f"restarted by admin from step 1 of run {order.id} (carrier ok)" in started
    clock.advance(hours=2)
    run_until_idle(dispatch=False)
    new.refresh_from_db()
    assert new.status == RunStatus.COMPLETED


def test_restarting_needs_the_retry_permission(order):
    viewer = Client()
    viewer.force_login(staff_with())
    assert 'id="kf-restart"' not in viewer.get(run_url(order)).content.decode()
    assert viewer.get(restart_url(order)).status_code == 403
    assert viewer.post(restart_url(order), {"from_step": "0"}).status_code == 403
    assert WorkflowRun.objects.count() == 1


def test_a_compensated_run_offers_start_again_not_retry(admin_client, registry, clock):
    define_workflow(
        "charge",
        steps=[
            s.compute("charge", lambda ctx: 1, compensate=[s.compute("refund", lambda ctx: 1)]),
            s.wait("PT1H"),
            s.compute("ship", lambda ctx: 1 / 0),
        ],
    )
    run = start_workflow("charge")
    clock.advance(hours=2)
    run_until_idle()
    run.refresh_from_db()
    assert run.compensation == "compensated"
    page = admin_client.get(run_url(run)).content.decode()
    assert 'id="kf-retry"' not in page
    assert ">Start again<" in page
    plan = admin_client.get(restart_url(run)).content.decode()
    assert "Start again from step 0" in plan


def test_a_hostile_step_path_is_shown_escaped_and_restarts_nothing(admin_client, order):
    hostile = "<script>alert('restart')</script>"
    page = admin_client.get(restart_url(order), {"from_step": hostile})
    assert page.status_code == 200
    html = page.content.decode()
    assert hostile not in html and "&lt;script&gt;" in html
    posted = admin_client.post(
        restart_url(order), {"from_step": hostile, "reason": "<b>why</b>"}, follow=True
    )
    assert posted.status_code == 200
    assert hostile not in posted.content.decode()
    assert WorkflowRun.objects.count() == 1
