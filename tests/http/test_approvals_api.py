"""GET approvals/ and POST runs/{id}/approve/: decide_approval over HTTP, hostile callers too."""

from __future__ import annotations

import pytest

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.http.tokens import DECIDE, VIEW
from kumiflow_django.models import Event, RunStatus, WorkflowRun
from kumiflow_django.store import names as ev
from tests.http.conftest import API

pytestmark = pytest.mark.django_db


@pytest.fixture
def refunds(registry):
    return define_workflow(
        "refund",
        attributes={"customer": lambda ctx: ctx.trigger.payload.get("customer")},
        steps=[
            s.approval("manager", choices=["approve", "decline"], fields={"note": str, "n": int}),
            s.return_(lambda ctx: ctx.steps["manager"]["payload"]),
        ],
    )


def decisions(run):
    return Event.objects.filter(stream_id=str(run.id), type=ev.APPROVAL_DECIDED).count()


def error(response):
    return response.json()["error"]


def test_the_inbox_lists_the_tenants_runs_and_a_decision_completes_the_run(token_client, refunds):
    mine = start_workflow("refund", payload={"customer": "<b>C-1</b>"})
    start_workflow("refund", payload={"customer": "C-2"}, tenant="acme")
    api = token_client()
    listed = api.get(f"{API}approvals/").json()["approvals"]
    assert [a["run"]["id"] for a in listed] == [str(mine.id)]
    assert listed[0]["choices"] == ["approve", "decline"]
    response = api.post_json(
        f"{API}runs/{mine.id}/approve/", {"choice": "approve", "fields": {"n": 3}, "reason": "ok"}
    )
    assert response.status_code == 200, response.content
    assert WorkflowRun.objects.get(pk=mine.id).status == RunStatus.COMPLETED


def test_another_tenants_run_is_not_found_and_nothing_is_appended(token_client, refunds):
    theirs = start_workflow("refund", tenant="acme")
    response = token_client(tenant="default").post_json(
        f"{API}runs/{theirs.id}/approve/", {"choice": "approve"}
    )
    assert response.status_code == 404
    assert "acme" not in response.content.decode()
    assert decisions(theirs) == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "choice"),
        ({"choice": 1}, "choice"),
        ({"choice": ["approve"]}, "choice"),
        ({"choice": "maybe"}, "choice"),
        ({"choice": "approve", "fields": {"colour": "red"}}, "fields"),
        ({"choice": "approve", "fields": {"n": True}}, "fields"),
        ({"choice": "approve", "fields": {"n": "3"}}, "fields"),
        ({"choice": "approve", "fields": {"n": 2.5}}, "fields"),
        ({"choice": "approve", "fields": {"note": {"nested": 1}}}, "fields"),
        ({"choice": "approve", "fields": {"note": "x" * 10_000_000}}, None),
        ({"choice": "approve", "fields": {"note": "nul\x00byte"}}, "fields"),
        ({"choice": "approve", "fields": ["note"]}, "fields"),
        ({"choice": "approve", "reason": 5}, "reason"),
        ({"choice": "approve", "reason": "x" * 100_000}, "reason"),
        ({"choice": "approve", "reason": "bad\x00"}, "reason"),
        ({"choice": "approve", "approval": 3}, "approval"),
        ({"choice": "approve", "extra": 1}, None),
    ],
)
def test_a_bad_decision_is_a_400_naming_its_field(token_client, refunds, body, field):
    run = start_workflow("refund")
    response = token_client().post_json(f"{API}runs/{run.id}/approve/", body)
    assert response.status_code in (400, 413), response.content[:300]
    if field is not None and response.status_code == 400:
        assert error(response)["field"] == field, response.content[:300]
    assert decisions(run) == 0


def test_unicode_in_a_field_is_kept(token_client, refunds):
    run = start_workflow("refund")
    response = token_client().post_json(
        f"{API}runs/{run.id}/approve/", {"choice": "approve", "fields": {"note": "ça va ✓ 🎉\t"}}
    )
    assert response.status_code == 200, response.content
    result = WorkflowRun.objects.get(pk=run.id).result
    assert result is not None and result["fields"]["note"] == "ça va ✓ 🎉\t"


def test_a_second_decision_is_a_409(token_client, refunds):
    run = start_workflow("refund")
    api = token_client()
    assert api.post_json(f"{API}runs/{run.id}/approve/", {"choice": "approve"}).status_code == 200
    again = api.post_json(f"{API}runs/{run.id}/approve/", {"choice": "decline"})
    assert again.status_code == 409
    assert decisions(run) == 1


def test_deciding_needs_the_decide_permission(token_client, refunds):
    run = start_workflow("refund")
    response = token_client(VIEW).post_json(f"{API}runs/{run.id}/approve/", {"choice": "approve"})
    assert response.status_code == 403
    assert decisions(run) == 0
    only = token_client(DECIDE).post_json(f"{API}runs/{run.id}/approve/", {"choice": "approve"})
    assert only.status_code == 200


@pytest.mark.parametrize("stream", ["own", "other"])
def test_the_decision_event_cannot_be_forged_through_the_append_endpoint(
    token_client, refunds, stream
):
    run = start_workflow("refund")
    other = start_workflow("refund")
    target = run if stream == "own" else other
    response = token_client().post_json(
        f"{API}events/",
        {
            "stream_id": str(target.id),
            "type": ev.APPROVAL_DECIDED,
            "payload": {"approval": "manager", "choice": "approve", "fields": {}},
        },
    )
    assert response.status_code in (400, 403), response.content
    assert decisions(run) == 0 and decisions(other) == 0
    assert WorkflowRun.objects.get(pk=run.id).status == RunStatus.WAITING_EVENT


@pytest.mark.parametrize(
    "attribute",
    ["nocolon", ":value", "customer:", "1bad:x", "customer:" + "x" * 201, "a" * 65 + ":x"],
)
def test_a_malformed_attribute_filter_is_a_400(token_client, refunds, attribute):
    response = token_client().get(f"{API}runs/", {"attribute": attribute})
    assert response.status_code == 400, response.content
    assert error(response)["field"] == "attribute"


def test_the_attribute_filter_takes_the_value_after_the_first_colon(token_client, refunds):
    a = start_workflow("refund", payload={"customer": "a:b:c"})
    start_workflow("refund", payload={"customer": "a"})
    sql = start_workflow("refund", payload={"customer": "x' OR '1'='1"})
    api = token_client()

    def ids(value):
        return [r["id"] for r in api.get(f"{API}runs/", {"attribute": value}).json()["runs"]]

    assert ids("customer:a:b:c") == [str(a.id)]
    assert ids("customer:x' OR '1'='1") == [str(sql.id)]
    assert ids("customer:nobody") == []


def test_the_inbox_shows_a_tenant_its_own_runs_not_those_a_collation_calls_equal(
    token_client, refunds
):
    """MariaDB compares text ignoring case and trailing spaces: "acme"'s
    inbox must not list the runs of "ACME" or "acme "."""
    mine = start_workflow("refund", tenant="acme")
    for other in ("ACME", "acme "):
        start_workflow("refund", tenant=other)

    listed = token_client(tenant="acme").get(f"{API}approvals/").json()["approvals"]

    assert [(a["run"]["id"], a["run"]["tenant"]) for a in listed] == [(str(mine.id), "acme")]
