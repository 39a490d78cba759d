"""The console in a real headless Chromium, as an operator uses it: the overview,
a failed run's failure panel, every action through its confirmation page with
the operator and the reason in the timeline, sending an approval, search by
prefix, lists that fit 1,280 px, and ``make serve`` with its styles.

With ``KUMIFLOW_UPDATE_SCREENSHOTS=1`` the tests also write the screenshots of
docs/admin.md into docs/images/.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connections

from kumiflow_django import append_event, define_workflow, on_cron, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import CronSchedule, Dispatch, Event, WorkflowRun
from kumiflow_django.testing import run_until_idle
from kumiflow_django.workers.cron import CronLoop

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
UPDATE = bool(os.environ.get("KUMIFLOW_UPDATE_SCREENSHOTS"))
partner_up = {"yes": False}


def charge(payload):
    if not partner_up["yes"]:
        raise ConnectionError("the payment partner is down")
    return {"charged": payload["cents"]}


def screenshot(page, name: str, *, full_page: bool = True) -> None:
    if UPDATE:
        IMAGES.mkdir(exist_ok=True)
        page.screenshot(path=str(IMAGES / name), full_page=full_page)


@pytest.fixture
def page(browser, live_server):
    User.objects.create_superuser("ops", "ops@example.com", "a-long-password")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
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
        business_key="payload.order",
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
    define_workflow(
        "refund",
        trigger=on_event("refund.requested"),
        idempotency_key=lambda e: f"refund:{e.payload['refund']}",
        steps=[
            s.wait_for_event(
                "refund.approved",
                match={"payload.refund": lambda ctx: ctx.event.payload["refund"]},
                timeout="P3D",
                name="approval",
            ),
            s.return_(lambda ctx: {"approved": not ctx.steps["approval"]["timed_out"]}),
        ],
    )
    define_workflow("nightly", trigger=on_cron("0 3 * * *"), steps=[s.return_("report")])
    append_event("order-1", "order.placed", {"order": "A-1", "cents": 1200, "note": "<b>gift</b>"})
    append_event("order-2", "order.placed", {"order": "A-2", "cents": 900})
    clock.advance(hours=1)
    run_until_idle()
    append_event("order-3", "order.placed", {"order": "A-3", "cents": 500})
    append_event("refund-9", "refund.requested", {"refund": "R-9"})
    CronLoop().run_once()
    failed = WorkflowRun.objects.get(
        trigger_position=Event.objects.get(stream_id="order-1").position
    )
    return {
        "failed": failed,
        "waiting": WorkflowRun.objects.get(workflow="checkout", status="waiting"),
        "approval": WorkflowRun.objects.get(workflow="refund"),
    }


def run_page(live_server, run) -> str:
    return f"{live_server.url}/admin/kumiflow/workflowrun/{run.pk}/change/"


def confirm(page, button: str, reason: str) -> None:
    """Click an operation, read its confirmation page, give a reason, confirm."""
    page.click(button)
    page.wait_for_selector("text=What will happen")
    page.fill("#id_reason", reason)
    page.click("#kf-confirm")


def timeline_line(page, summary: str) -> str:
    return str(page.locator(".kf-lines summary", has_text=summary).last.inner_text())


def test_the_overview_counts_charts_and_links(page, live_server, shop):
    page.goto(f"{live_server.url}/admin/kumiflow/")
    page.click("text=Workflows overview")
    page.wait_for_selector(".kf-counts")
    row = page.locator(".kf-counts tr", has_text="checkout").inner_text().split("\t")
    assert row[0] == "checkout" and row[6] == "2", row  # failed: order-1 and order-2
    assert page.locator("svg.kf-chart").count() == 6
    assert page.locator("svg.kf-chart rect.kf-bar-failed").count() == 60 + 24
    screenshot(page, "overview.png")
    # every number is a link to the runs behind it
    page.locator(".kf-counts tr", has_text="checkout").locator("td a").nth(5).click()
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 2
    assert str(shop["failed"].pk)[:8] in page.inner_text("#result_list")


def test_the_overview_follows_the_dark_theme(browser, live_server, shop):
    User.objects.create_superuser("night", "n@example.com", "a-long-password")
    fills = {}
    for scheme in ("light", "dark"):
        context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
        page = context.new_page()
        page.goto(f"{live_server.url}/admin/login/?next=/admin/kumiflow/workflowrun/overview/")
        page.fill("#id_username", "night")
        page.fill("#id_password", "a-long-password")
        page.click("input[type=submit]")
        page.wait_for_selector(".kf-counts")
        # the element can be in the DOM before console.css has loaded; the
        # load event is the barrier after which every stylesheet applies
        page.wait_for_load_state("load")
        fills[scheme] = page.evaluate(
            "(() => { const s = getComputedStyle(document.querySelector('rect.kf-bar-failed'));"
            " const b = getComputedStyle(document.body);"
            " return [s.fill, b.backgroundColor]; })()"
        )
        if scheme == "dark":
            screenshot(page, "overview-dark.png", full_page=False)
        context.close()
    connections.close_all()
    assert fills["light"] == ["rgb(220, 38, 38)", "rgb(255, 255, 255)"], fills
    assert fills["dark"][0] == "rgb(248, 113, 113)", "a lighter red on a dark page"
    assert fills["dark"][1] != "rgb(255, 255, 255)", fills


def test_a_failed_runs_page_explains_the_failure_first(page, live_server, shop):
    page.goto(f"{live_server.url}/admin/kumiflow/workflowrun/?status__exact=failed")
    page.click(f"text={str(shop['failed'].pk)[:8]}")
    panel = page.inner_text("#kf-failure")
    assert "Failed: step_failed at step 2.then.0 (call charge)" in panel
    assert "ConnectionError: the payment partner is down" in panel, "the traceback's end"
    assert "Traceback (most recent call last)" in panel
    assert 'in charge\n    raise ConnectionError("the payment partner is down")' in panel
    assert page.inner_text(".kf-failed .kf-label") == "call charge"
    assert "delivered" in page.inner_text('.kf-step[data-path="0"]'), "the mail's delivery"
    assert "waited 1 h" in page.inner_text('.kf-step[data-path="1"]')
    screenshot(page, "failed-run.png")


def test_retry_through_its_confirmation_page_with_operator_and_reason(page, live_server, shop):
    page.goto(run_page(live_server, shop["failed"]))
    partner_up["yes"] = True
    confirm(page, "#kf-retry", "the partner is back (ticket 7)")
    assert "Run " in page.inner_text(".messagelist") and "retried." in page.inner_text(
        ".messagelist"
    )
    line = timeline_line(page, "retried from")
    assert "by ops" in line and "“the partner is back (ticket 7)”" in line
    run_until_idle()
    page.reload()
    assert "completed" in page.inner_text(".field-status")
    assert "completed with result" in page.inner_text(".kf-timeline")
    assert page.locator("#kf-retry").count() == 0


def test_retry_on_the_current_definition_after_a_deploy(page, live_server, shop, registry):
    partner_up["yes"] = True
    registry.unregister("checkout")
    define_workflow(
        "checkout",
        trigger=on_event("order.placed"),
        steps=[
            s.mail_send(to="shop@example.com", subject="New order", body="…"),
            s.wait("PT1H"),
            s.compute("payment", lambda ctx: {"charged": "later"}),
            s.return_(lambda ctx: ctx.steps["payment"]),
        ],
    )
    page.goto(run_page(live_server, shop["failed"]))
    assert "The registered definition differs from it" in page.inner_text(".kf-picture")
    assert page.inner_text(".kf-failed .kf-label") == "call charge", "the old definition"
    confirm(page, "#kf-retry-current", "moved to the fixed definition")
    line = timeline_line(page, "on the current definition")
    assert "by ops" in line and "moved to the fixed definition" in line
    run_until_idle()
    page.reload()
    assert "completed" in page.inner_text(".field-status")


def test_cancel_and_wake_through_their_confirmation_pages(page, live_server, shop):
    partner_up["yes"] = True
    page.goto(run_page(live_server, shop["waiting"]))
    assert page.inner_text(".kf-here .kf-label") == "wait PT1H"
    confirm(page, "#kf-wake", "the customer called")
    line = timeline_line(page, "woken now")
    assert "by ops" in line and "the customer called" in line
    run_until_idle()
    page.reload()
    assert "completed" in page.inner_text(".field-status")

    page.goto(run_page(live_server, shop["approval"]))
    page.click("#kf-wake")
    assert "takes the TIMEOUT path" in page.inner_text(".kf-explain")
    page.click("text=No, take me back")
    confirm(page, "#kf-cancel", "duplicate refund")
    line = timeline_line(page, "cancelled")
    assert "by ops" in line and "duplicate refund" in line
    assert "cancelled" in page.inner_text(".field-status")


def test_redeliver_and_fire_now_through_their_confirmation_pages(page, live_server, shop):
    pending = Dispatch.objects.get(run_id=shop["waiting"].pk, status="pending")
    page.goto(f"{live_server.url}/admin/kumiflow/dispatch/{pending.pk}/change/")
    assert "mail requested by step 0" in page.inner_text(".kf-timeline")
    confirm(page, "text=Cancel delivery", "wrong address")
    line = timeline_line(page, "delivery cancelled")
    assert "by ops" in line and "wrong address" in line
    confirm(page, "text=Redeliver", "address fixed")
    line = timeline_line(page, "redelivery requested")
    assert "by ops" in line and "address fixed" in line
    # the run's own timeline shows its outbox's events too
    assert pending.run_id is not None
    run = WorkflowRun.objects.get(pk=pending.run_id)
    page.goto(run_page(live_server, run))
    assert "redelivery requested" in page.inner_text(".kf-timeline")

    schedule = CronSchedule.objects.get()
    page.goto(f"{live_server.url}/admin/kumiflow/cronschedule/{schedule.pk}/change/")
    confirm(page, "text=Fire now", "the report is needed now")
    line = timeline_line(page, "fired by hand")
    assert "by ops" in line and "the report is needed now" in line
    assert WorkflowRun.objects.filter(workflow="nightly", status="completed").count() == 1


def test_send_the_approval_a_run_waits_for(page, live_server, shop):
    run = shop["approval"]
    page.goto(run_page(live_server, run))
    assert "Waiting for event refund.approved" in page.inner_text("#kf-waiting")
    page.click("#kf-send-event")
    assert page.inner_text("#kf-event-type") == "refund.approved"
    assert page.input_value("#id_stream_id") == "refund-9"
    assert '"refund": "R-9"' in page.input_value("#id_payload")
    page.fill("#id_payload", '{"refund": "R-9", "approved_by": "finance"}')
    page.fill("#id_reason", "approved on the phone")
    screenshot(page, "approval.png")
    page.click("#kf-confirm")
    assert "the run took it and went on (now completed)" in page.inner_text(".messagelist")
    assert "completed" in page.inner_text(".field-status")
    assert "resumed at step 0 by event" in page.inner_text(".kf-timeline")
    sent = Event.objects.get(type="refund.approved")
    assert sent.created_by == "ops"
    assert sent.metadata["kumiflow.console"]["reason"] == "approved on the phone"


def test_search_by_prefix_and_lists_that_fit_1280_px(page, live_server, shop):
    page.goto(f"{live_server.url}/admin/kumiflow/workflowrun/")
    page.fill("#searchbar", str(shop["approval"].pk)[:6])
    page.press("#searchbar", "Enter")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 1
    page.fill("#searchbar", "refund:")
    page.press("#searchbar", "Enter")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 1
    assert "refund:R-9" in page.inner_text("#result_list")

    for path in ("workflowrun/", "event/?engine=shown", "dispatch/", "cronschedule/"):
        page.goto(f"{live_server.url}/admin/kumiflow/{path}")
        fits = page.evaluate(
            "(() => { const r = document.querySelector('#changelist .results');"
            " return [document.documentElement.scrollWidth, r.scrollWidth, r.clientWidth]; })()"
        )
        assert fits[0] <= 1280 and fits[1] <= fits[2], (path, fits)
    page.goto(f"{live_server.url}/admin/kumiflow/workflowrun/")
    assert "A-2" in page.inner_text("#result_list"), "the business key the definition names"
    screenshot(page, "run-list.png", full_page=False)


def test_payloads_and_reasons_are_escaped_in_the_browser(page, live_server, shop):
    run = shop["failed"]
    page.goto(f"{live_server.url}/admin/kumiflow/event/{run.trigger_position}/change/")
    assert page.locator(".field-payload_pretty b").count() == 0
    assert "<b>gift</b>" in page.inner_text(".field-payload_pretty")
    page.goto(run_page(live_server, shop["waiting"]))
    confirm(page, "#kf-cancel", "<img src=x onerror=alert(1)>")
    assert page.locator(".kf-reason img").count() == 0
    assert "<img src=x onerror=alert(1)>" in page.inner_text(".kf-reason")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_make_serve_serves_the_admin_styled(browser, tmp_path):
    """``make serve`` as a new user runs it: the admin's CSS and the console's load."""
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'serve.sqlite3'}",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    # -o: the venv the suite runs in is taken as it is, never installed into.
    server = subprocess.Popen(
        [
            "make",
            "-o",
            "venv",
            "-o",
            "demo-venv",
            "serve",
            f"SERVE_ADDR=127.0.0.1:{port}",
            f"PY={sys.executable}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert server.stdout is not None
        for line in server.stdout:  # the handshake: runserver says it listens
            if "Quit the server with" in line:
                break
        else:
            pytest.fail("make serve ended before the server started")
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        styles: list[tuple[str, int]] = []
        page.on(
            "response",
            lambda r: (
                styles.append((r.url, r.status))
                if r.request.resource_type == "stylesheet"
                else None
            ),
        )
        page.goto(f"http://127.0.0.1:{port}/admin/login/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", "admin")
        page.click("input[type=submit]")
        page.wait_for_selector("#site-name")
        page.goto(f"http://127.0.0.1:{port}/admin/kumiflow/workflowrun/overview/")
        page.wait_for_selector(".kf-counts")
        context.close()
        urls = {url.rsplit("/static/", 1)[-1]: status for url, status in styles}
        assert urls.get("admin/css/base.css") == 200, styles
        assert urls.get("kumiflow/console.css") == 200, styles
        assert all(status == 200 for status in urls.values()), styles
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
        if server.stdout is not None:
            server.stdout.close()


def test_start_workflow_is_visible_without_a_trigger_event(page, live_server, registry):
    define_workflow("manual-one", business_key="payload.ticket", steps=[s.wait("P1D")])
    run = start_workflow("manual-one", payload={"ticket": "T-5"})
    page.goto(f"{live_server.url}/admin/kumiflow/workflowrun/")
    row = page.locator("#result_list tbody tr", has_text=str(run.pk)[:8]).inner_text()
    assert "T-5" in row and "wakes in 24 h" in row


def test_restart_from_a_step_after_its_pre_flight(page, live_server, registry, clock):
    from testproject.shop import tasks as shop_tasks

    carrier = {"up": False}

    def ship(ctx):
        if not carrier["up"]:
            raise ConnectionError("the carrier's API is down")
        return {"parcel": "P-1"}

    define_workflow(
        "fulfilment",
        steps=[
            s.compute("order", lambda ctx: {"order": "A-7"}),
            s.wait("PT1H"),
            s.webhook_send("https://crm.example.com/hook", body={"order": "A-7"}, name="notify"),
            s.task("invoice", shop_tasks.double, args=lambda ctx: {"n": 21}),
            s.compute("ship", ship),
            s.return_(lambda ctx: {"invoice": ctx.steps["invoice"], **ctx.steps["ship"]}),
        ],
    )
    old = start_workflow("fulfilment")
    clock.advance(hours=2)
    run_until_idle(dispatch=False)
    page.goto(run_page(live_server, old))
    page.click("#kf-restart")
    page.wait_for_selector("#kf-from-step")
    page.select_option("#kf-from-step", "2")
    page.click("#kf-restart-plan")
    page.wait_for_selector("#kf-restart-repeats")
    repeats = page.inner_text("#kf-restart-repeats")
    assert "webhook" in repeats and "task" in repeats and "new" in repeats
    assert "2 'notify' (webhook_send)" in page.inner_text("#kf-restart-again")
    page.fill("#id_reason", "the carrier is back (ticket 12)")
    screenshot(page, "restart.png")
    carrier["up"] = True
    page.click("#kf-confirm")
    page.wait_for_selector(".messagelist")
    assert "restarted from step 2 as run" in page.inner_text(".messagelist")
    new = WorkflowRun.objects.exclude(pk=old.pk).get()
    assert page.url.endswith(f"/workflowrun/{new.pk}/change/")
    run_until_idle(dispatch=False)
    page.reload()
    page.wait_for_load_state("load")
    assert "completed" in page.inner_text(".field-status")
    new.refresh_from_db()
    assert new.result == {"invoice": 42, "parcel": "P-1"}
    page.goto(run_page(live_server, old))
    line = timeline_line(page, "restarted from step 2")
    assert "by ops" in line and "ticket 12" in line


def test_filter_the_run_list_by_a_search_attribute(page, live_server, registry):
    define_workflow(
        "attr-orders",
        attributes={"customer": lambda ctx: ctx.trigger.payload["customer"]},
        steps=[s.wait("P1D")],
    )
    mine = start_workflow("attr-orders", payload={"customer": "C-17"})
    other = start_workflow("attr-orders", payload={"customer": "C-18"})
    page.goto(f"{live_server.url}/admin/kumiflow/workflowrun/")
    box = page.locator('details[data-filter-title^="search attribute"] input[name=attr]')
    box.fill("customer:C-17")
    box.press("Enter")
    page.wait_for_load_state("load")
    listed = page.inner_text("#result_list tbody")
    assert str(mine.pk)[:8] in listed and str(other.pk)[:8] not in listed
    page.locator("#result_list tbody a", has_text=str(mine.pk)[:8]).click()
    page.wait_for_selector("#kf-attributes")
    assert "customer C-17" in page.inner_text("#kf-attributes")
    page.click("#kf-attributes a")  # the list of the runs with this value
    page.wait_for_load_state("load")
    assert "attr=customer%3AC-17" in page.url
    assert str(other.pk)[:8] not in page.inner_text("#result_list tbody")


def test_approve_from_the_inbox_and_the_run_continues(page, live_server, registry):
    define_workflow(
        "refund-request",
        attributes={"customer": lambda ctx: ctx.trigger.payload["customer"]},
        steps=[
            s.approval("manager", choices=["approve", "decline"], fields={"note": str}),
            s.return_(lambda ctx: ctx.steps["manager"]["payload"]),
        ],
    )
    older = start_workflow("refund-request", payload={"customer": "C-17"})
    start_workflow("refund-request", payload={"customer": "C-18"})
    page.goto(f"{live_server.url}/admin/kumiflow/workflowrun/overview/")
    assert page.inner_text("#kf-waiting-person") == "2"
    page.click("#kf-waiting-person")
    page.wait_for_selector(".kf-inbox-item")
    items = page.locator(".kf-inbox-item")
    assert items.nth(0).get_attribute("data-run") == str(older.pk)  # the oldest first
    assert "customer C-17" in items.nth(0).inner_text()
    first = items.nth(0)
    first.locator("input[name=field_note]").fill("refund of a broken kettle")
    first.locator("input[name=reason]").fill("receipt checked")
    screenshot(page, "inbox.png")
    first.locator("button.kf-choice", has_text="approve").click()
    page.wait_for_load_state("load")
    assert "approve (manager)" in page.inner_text(".messagelist")
    assert page.locator(".kf-inbox-item").count() == 1
    older.refresh_from_db()
    assert older.status == "completed"
    decision = older.result or {}
    assert decision["choice"] == "approve"
    assert decision["fields"] == {"note": "refund of a broken kettle"}
    assert decision["by"] == "ops" and decision["reason"] == "receipt checked"
