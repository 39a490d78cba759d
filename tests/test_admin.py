"""The admin as the operations console: lists, a run's page, operations and permissions."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from kumiflow_django import append_event, define_workflow, on_cron, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import (
    CronSchedule,
    DefinitionSnapshot,
    Dispatch,
    Event,
    RunStatus,
    WorkflowRun,
)
from kumiflow_django.workers.cron import CronLoop

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(db):
    """A staff user who may only look."""
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    for model in ("workflowrun", "event", "dispatch", "cronschedule"):
        user.user_permissions.add(Permission.objects.get(codename=f"view_{model}"))
    return user


@pytest.fixture
def flows(registry):
    define_workflow(
        "order",
        trigger=on_event("order.placed"),
        idempotency_key=lambda e: f"order:{e.payload['order']}",
        steps=[
            s.mail_send(to="shop@x.io", subject="order", body="placed"),
            s.branch(
                lambda ctx: ctx.event.payload["order"] > 0,
                then=[
                    s.wait_for_event(
                        "order.paid",
                        match={"payload.order": lambda ctx: ctx.event.payload["order"]},
                    )
                ],
            ),
            s.compute("boom", lambda ctx: 1 / ctx.event.payload["divisor"]),
        ],
    )
    append_event(
        "o-1", "order.placed", {"order": 1, "divisor": 0, "note": "<script>alert(1)</script>"}
    )
    append_event("o-2", "order.placed", {"order": -2, "divisor": 0})
    return {
        "waiting": WorkflowRun.objects.get(idempotency_key="order:1"),
        "failed": WorkflowRun.objects.get(idempotency_key="order:-2"),
    }


def run_url(run) -> str:
    return reverse("admin:kumiflow_workflowrun_change", args=[run.pk])


def test_the_run_list_shows_status_and_filters(admin_client, flows):
    url = reverse("admin:kumiflow_workflowrun_changelist")
    page = admin_client.get(url).content.decode()
    assert "waiting for event" in page and "failed" in page
    assert "order.paid" in page, "what a waiting run waits for"

    failed_only = admin_client.get(url, {"status": "failed"}).content.decode()
    assert str(flows["failed"].pk)[:8] in failed_only
    assert str(flows["waiting"].pk)[:8] not in failed_only
    assert admin_client.get(url, {"workflow": "order", "tenant": "default"}).status_code == 200


@pytest.mark.parametrize("term", ["run id", "order:1", "1"])
def test_search_by_run_id_idempotency_key_or_correlation_value(admin_client, flows, term):
    waiting = flows["waiting"]
    query = str(waiting.pk) if term == "run id" else term
    page = admin_client.get(reverse("admin:kumiflow_workflowrun_changelist"), {"q": query})
    assert list(page.context["cl"].result_list) == [waiting]


def test_the_run_list_never_counts_the_whole_table(admin_client, flows):
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(reverse("admin:kumiflow_workflowrun_changelist"))
    counts = [
        q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and "workflowrun" in q["sql"]
    ]
    assert counts and all("LIMIT" in sql.upper() for sql in counts), counts


def test_a_runs_page_shows_timeline_picture_and_links(admin_client, flows):
    run = flows["waiting"]
    page = admin_client.get(run_url(run)).content.decode()
    assert "kumiflow.workflow.run-started" in page
    assert "kumiflow.workflow.step.waiting-for-event" in page
    assert 'class="kf-step kf-here" data-path="1.then.0"' in page, "the run's position"
    assert 'class="kf-step kf-done" data-path="0"' in page, "the path it took"
    assert reverse("admin:kumiflow_event_change", args=[run.trigger_position]) in page
    assert f"?run={run.pk}" in page


def test_payloads_are_shown_escaped(admin_client, flows):
    trigger = Event.objects.get(type="order.placed", stream_id="o-1")
    page = admin_client.get(
        reverse("admin:kumiflow_event_change", args=[trigger.pk])
    ).content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_failed_runs_page_marks_the_failed_step_and_retries_it(admin_client, flows, registry):
    run = flows["failed"]
    page = admin_client.get(run_url(run)).content.decode()
    assert 'class="kf-step kf-failed" data-path="2"' in page
    assert "ZeroDivisionError at step 2" in page
    assert 'id="kf-retry"' in page and 'id="kf-wake"' not in page

    response = admin_client.post(
        reverse("admin:kumiflow_workflowrun_operate", args=[run.pk, "retry"])
    )
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    assert Event.objects.filter(
        stream_id=str(run.pk), type="kumiflow.workflow.run-retried"
    ).exists()


def test_a_user_without_the_permission_sees_no_operation_and_gets_403(client, staff, flows):
    client.force_login(staff)
    run = flows["failed"]
    page = client.get(run_url(run)).content.decode()
    assert 'id="kf-retry"' not in page
    changelist = client.get(reverse("admin:kumiflow_workflowrun_changelist"))
    assert "retry_runs" not in changelist.content.decode()
    response = client.post(reverse("admin:kumiflow_workflowrun_operate", args=[run.pk, "retry"]))
    assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED

    staff.user_permissions.add(Permission.objects.get(codename="retry_workflowrun"))
    staff = User.objects.get(pk=staff.pk)
    client.force_login(staff)
    assert 'id="kf-retry"' in client.get(run_url(run)).content.decode()


def test_actions_confirm_first_then_report_the_runs_they_skipped_and_why(admin_client, flows):
    url = reverse("admin:kumiflow_workflowrun_changelist")
    selected = {
        "action": "wake_runs",
        "_selected_action": [flows["waiting"].pk, flows["failed"].pk],
    }
    confirmation = admin_client.post(url, selected)
    assert confirmation.status_code == 200, "a confirmation page, nothing done yet"
    page = confirmation.content.decode()
    assert "applies to 1 of the 2 selected" in page
    assert "skipped: the run is failed, not waiting" in page
    flows["waiting"].refresh_from_db()
    assert flows["waiting"].status == RunStatus.WAITING_EVENT

    response = admin_client.post(url, {**selected, "confirm": "yes"}, follow=True)
    text = " ".join(str(m) for m in response.context["messages"])
    assert "1 workflow run woken" in text
    assert f"Skipped 1: {flows['failed'].pk}: the run is failed, not waiting" in text


def test_nothing_can_be_added_changed_or_deleted(admin_client, flows):
    for model in ("workflowrun", "event", "dispatch", "cronschedule"):
        assert admin_client.get(reverse(f"admin:kumiflow_{model}_add")).status_code == 403
    event = Event.objects.earliest("position")
    assert (
        admin_client.post(reverse("admin:kumiflow_event_delete", args=[event.pk])).status_code
        == 403
    )
    page = admin_client.get(reverse("admin:kumiflow_event_changelist")).content.decode()
    assert "delete_selected" not in page


def test_dispatch_actions(admin_client, flows):
    dispatch = Dispatch.objects.filter(run_id=flows["waiting"].pk).get()
    url = reverse("admin:kumiflow_dispatch_changelist")
    confirm = {"confirm": "yes", "_selected_action": [dispatch.pk]}
    admin_client.post(url, {"action": "cancel_dispatches", **confirm})
    dispatch.refresh_from_db()
    assert dispatch.status == "cancelled"
    admin_client.post(url, {"action": "redeliver_dispatches", **confirm})
    dispatch.refresh_from_db()
    assert dispatch.status == "pending"
    assert admin_client.get(url, {"run": str(flows["waiting"].pk)}).status_code == 200


def test_cron_actions(admin_client, registry, clock):
    define_workflow("nightly", trigger=on_cron("0 3 * * *"), steps=[s.return_(1)])
    CronLoop().run_once()
    url = reverse("admin:kumiflow_cronschedule_changelist")
    confirm = {"confirm": "yes", "_selected_action": ["nightly"]}
    admin_client.post(url, {"action": "disable", **confirm})
    assert CronSchedule.objects.get().enabled is False
    admin_client.post(url, {"action": "enable", **confirm})
    assert CronSchedule.objects.get().enabled is True
    admin_client.post(url, {"action": "fire_now", **confirm})
    assert WorkflowRun.objects.filter(workflow="nightly", status="completed").count() == 1


def test_a_run_of_an_unregistered_workflow_still_has_a_page_and_its_picture(admin_client, registry):
    define_workflow("temp", steps=[s.wait("P1D")])
    run = start_workflow("temp")
    registry.unregister("temp")
    page = admin_client.get(run_url(run)).content.decode()
    assert 'class="kf-step kf-here" data-path="0"' in page, "drawn from the stored definition"
    assert "wait P1D" in page


def test_a_run_without_a_stored_definition_or_a_registered_one_has_a_page(admin_client, registry):
    define_workflow("temp", steps=[s.wait("P1D")])
    run = start_workflow("temp")
    registry.unregister("temp")
    DefinitionSnapshot.objects.all().delete()
    page = admin_client.get(run_url(run)).content.decode()
    assert "is not registered in this process and its definition was not stored" in page
