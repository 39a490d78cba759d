"""The console's inbox and attribute filter, through Django's test client."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import Event, RunStatus
from kumiflow_django.store import names as ev
from tests.test_admin_console import staff_with

pytestmark = pytest.mark.django_db

INBOX = "admin:kumiflow_approvals"


@pytest.fixture
def refunds(registry):
    define_workflow(
        "inbox-refund",
        attributes={"customer": lambda ctx: ctx.trigger.payload["customer"]},
        steps=[s.approval("manager", fields={"amount": int, "urgent": bool})],
    )
    define_workflow(
        "inbox-payout",
        steps=[s.approval("finance", permission="kumiflow.retry_workflowrun")],
    )
    return {
        "refund": start_workflow("inbox-refund", payload={"customer": "C-17"}),
        "payout": start_workflow("inbox-payout"),
    }


def test_the_inbox_lists_waiting_runs_and_a_decision_is_audited(client, refunds):
    client.force_login(staff_with("decide_approval_workflowrun"))
    page = client.get(reverse(INBOX)).content.decode()
    assert "inbox-refund" in page and "customer</code> C-17" in page
    assert 'name="field_amount"' in page and 'type="checkbox" name="field_urgent"' in page

    run = refunds["refund"]
    response = client.post(
        reverse(INBOX),
        {
            "run": str(run.pk),
            "approval": "manager",
            "choice": "approve",
            "field_amount": "12",
            "field_urgent": "on",
            "reason": "ok",
        },
        follow=True,
    )
    assert "approve (manager)" in response.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    decision = Event.objects.get(stream_id=str(run.pk), type=ev.APPROVAL_DECIDED)
    assert decision.created_by.startswith("op-")
    assert decision.payload["fields"] == {"amount": 12, "urgent": True}
    assert decision.payload["reason"] == "ok"


def test_a_bad_field_is_refused_with_its_reason_and_nothing_is_appended(client, refunds):
    client.force_login(staff_with("decide_approval_workflowrun"))
    run = refunds["refund"]
    response = client.post(
        reverse(INBOX),
        {"run": str(run.pk), "approval": "manager", "choice": "approve", "field_amount": "x"},
        follow=True,
    )
    assert "must be a whole number" in response.content.decode()
    response = client.post(reverse(INBOX), {"run": str(run.pk), "choice": "maybe"}, follow=True)
    assert "not one of its choices" in response.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_EVENT
    assert not Event.objects.filter(type=ev.APPROVAL_DECIDED).exists()


def test_deciding_needs_the_permission_and_the_approvals_own(client, refunds):
    viewer = staff_with()
    client.force_login(viewer)
    page = client.get(reverse(INBOX)).content.decode()
    assert "you may not decide it" in page and 'class="button kf-choice"' not in page
    assert client.post(reverse(INBOX), {"run": str(refunds["refund"].pk)}).status_code == 403

    decider = staff_with("decide_approval_workflowrun")
    client.force_login(decider)
    payout = {"run": str(refunds["payout"].pk), "choice": "approve"}
    assert client.post(reverse(INBOX), payout).status_code == 403  # lacks retry_workflowrun
    decider.user_permissions.add(Permission.objects.get(codename="retry_workflowrun"))
    client.force_login(decider)
    client.post(reverse(INBOX), payout)
    refunds["payout"].refresh_from_db()
    assert refunds["payout"].status == RunStatus.COMPLETED


def test_the_overview_counts_runs_waiting_for_a_person_apart(admin_client, refunds, registry):
    define_workflow(
        "inbox-carrier", steps=[s.wait_for_event("parcel.delivered", match={"stream_id": "p-1"})]
    )
    start_workflow("inbox-carrier")
    page = admin_client.get(reverse("admin:kumiflow_overview")).content.decode()
    assert 'id="kf-waiting-person">2<' in page
    assert 'id="kf-waiting-other">1<' in page


def test_the_run_list_filters_by_attribute_and_refuses_a_malformed_filter(admin_client, refunds):
    runs = reverse("admin:kumiflow_workflowrun_changelist")
    other = start_workflow("inbox-refund", payload={"customer": "C-18"})
    page = admin_client.get(runs, {"attr": "customer:C-17"}).content.decode()
    assert str(refunds["refund"].pk)[:8] in page and str(other.pk)[:8] not in page
    for malformed in ("customer", "no such:name", ":x", "customer:" + "x" * 201):
        response = admin_client.get(runs, {"attr": malformed})
        assert response.status_code == 200
        assert str(refunds["refund"].pk)[:8] not in response.content.decode()
    page = admin_client.get(
        reverse("admin:kumiflow_workflowrun_change", args=[refunds["refund"].pk])
    ).content.decode()
    assert 'id="kf-attributes"' in page and "attr=customer%3AC-17" in page
    assert 'id="kf-approval-wait"' in page  # the wait panel points to the inbox


def test_a_reason_too_long_is_refused_not_cut(client, refunds):
    client.force_login(staff_with("decide_approval_workflowrun"))
    run = refunds["refund"]
    response = client.post(
        reverse(INBOX),
        {"run": str(run.pk), "approval": "manager", "choice": "approve", "reason": "x" * 1001},
        follow=True,
    )
    assert "reason is longer than" in response.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_EVENT
    assert not Event.objects.filter(type=ev.APPROVAL_DECIDED).exists()


def test_a_decision_without_the_csrf_token_is_refused(refunds):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(staff_with("decide_approval_workflowrun"))
    run = refunds["refund"]
    response = client.post(reverse(INBOX), {"run": str(run.pk), "choice": "approve"})
    assert response.status_code == 403
    assert not Event.objects.filter(type=ev.APPROVAL_DECIDED).exists()


def test_markup_in_attribute_values_is_escaped_in_the_inbox_and_the_run_list(
    admin_client, registry
):
    define_workflow(
        "inbox-xss",
        attributes={"customer": lambda ctx: ctx.trigger.payload["customer"]},
        steps=[s.approval("manager", fields={"note": str})],
    )
    run = start_workflow("inbox-xss", payload={"customer": "<script>alert(1)</script>"})
    inbox = admin_client.get(reverse(INBOX)).content.decode()
    assert "<script>alert(1)</script>" not in inbox and "&lt;script&gt;" in inbox
    listed = admin_client.get(
        reverse("admin:kumiflow_workflowrun_changelist"),
        {"attr": "customer:<script>alert(1)</script>"},
    ).content.decode()
    assert "<script>alert(1)</script>" not in listed
    page = admin_client.get(
        reverse("admin:kumiflow_workflowrun_change", args=[run.pk])
    ).content.decode()
    assert "<script>alert(1)</script>" not in page


def test_the_run_pages_attribute_link_finds_a_value_with_spaces_at_its_end(admin_client, refunds):
    spaced = start_workflow("inbox-refund", payload={"customer": "C 9 "})
    start_workflow("inbox-refund", payload={"customer": "C 9"})
    page = admin_client.get(
        reverse("admin:kumiflow_workflowrun_change", args=[spaced.pk])
    ).content.decode()
    assert "attr=customer%3AC+9+" in page
    runs = reverse("admin:kumiflow_workflowrun_changelist")
    response = admin_client.get(runs, {"attr": "customer:C 9 "})
    assert response.context["cl"].result_count == 1
    assert str(spaced.pk)[:8] in response.content.decode()
