"""The admin in a real headless Chromium: read a failed run's timeline, retry it
and see it complete; wake a waiting run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connections

from kumiflow_django import append_event, define_workflow, on_event
from kumiflow_django import steps as s
from kumiflow_django.models import Event, WorkflowRun
from kumiflow_django.testing import run_until_idle

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "images" / "run-page.png"
partner_up = {"yes": False}


def charge(payload):
    if not partner_up["yes"]:
        raise ConnectionError("the payment partner is down")
    return {"charged": payload["cents"]}


@pytest.fixture
def page(browser, live_server):
    User.objects.create_superuser("ops", "ops@example.com", "a-long-password")
    context = browser.new_context(viewport={"width": 1280, "height": 1600})
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "a-long-password")
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    yield page
    context.close()
    connections.close_all()  # see the browser fixture


@pytest.fixture
def shop(registry, clock):
    partner_up["yes"] = False
    define_workflow(
        "checkout",
        trigger=on_event("order.placed"),
        steps=[
            s.mail_send(to="shop@example.com", subject="New order", body="…"),
            s.wait("PT1H"),
            s.branch(
                lambda ctx: ctx.event.payload["cents"] > 0,
                then=[s.call("payment", charge, lambda ctx: {"cents": ctx.event.payload["cents"]})],
                else_=[s.compute("payment", lambda ctx: None)],
            ),
            s.return_(lambda ctx: ctx.steps["payment"]),
        ],
    )
    append_event("order-1", "order.placed", {"cents": 1200, "note": "<b>gift</b>"})
    append_event("order-2", "order.placed", {"cents": 900})
    clock.advance(hours=1)
    run_until_idle()
    append_event("order-3", "order.placed", {"cents": 500})
    return {
        "failed": WorkflowRun.objects.get(
            trigger_position=Event.objects.get(stream_id="order-1").position
        ),
        "waiting": WorkflowRun.objects.get(status="waiting"),
    }


def test_open_a_failed_run_read_its_timeline_retry_it_and_see_it_complete(page, live_server, shop):
    if os.environ.get("KUMIFLOW_UPDATE_SCREENSHOTS"):
        page.set_viewport_size({"width": 1280, "height": 560})
        page.goto(f"{live_server.url}/admin/kumiflow/workflowrun/")
        page.screenshot(path=str(SCREENSHOT.with_name("run-list.png")))
        page.set_viewport_size({"width": 1280, "height": 1600})
    page.goto(f"{live_server.url}/admin/kumiflow/workflowrun/?status=failed")
    page.click(f"text={str(shop['failed'].pk)[:8]}")
    timeline = page.inner_text(".kf-timeline")
    assert "kumiflow.workflow.run-failed" in timeline
    assert "ConnectionError at step 2.then.0 (call 'payment')" in timeline
    assert page.inner_text(".kf-failed .kf-label") == "call charge"
    if os.environ.get("KUMIFLOW_UPDATE_SCREENSHOTS"):
        SCREENSHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)

    partner_up["yes"] = True
    page.click("#kf-retry")
    assert "Run retried." in page.inner_text(".messagelist")
    run_until_idle()
    page.reload()
    assert "completed" in page.inner_text(".field-status")
    assert "kumiflow.workflow.run-completed" in page.inner_text(".kf-timeline")
    assert page.locator("#kf-retry").count() == 0


def test_open_a_waiting_run_and_wake_it(page, live_server, shop):
    partner_up["yes"] = True
    run = shop["waiting"]
    page.goto(f"{live_server.url}/admin/kumiflow/workflowrun/{run.pk}/change/")
    assert page.inner_text(".kf-here .kf-label") == "wait PT1H"
    page.click("#kf-wake")
    assert "Run woken." in page.inner_text(".messagelist")
    run_until_idle()
    page.reload()
    assert "completed" in page.inner_text(".field-status")
    run.refresh_from_db()
    assert run.result == {"charged": 500}


def test_payloads_are_escaped_in_the_browser(page, live_server, shop):
    run = shop["failed"]
    page.goto(f"{live_server.url}/admin/kumiflow/event/{run.trigger_position}/change/")
    assert page.locator(".field-payload_pretty b").count() == 0
    assert "<b>gift</b>" in page.inner_text(".field-payload_pretty")
