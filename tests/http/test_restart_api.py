"""POST /runs/{id}/restart/ and its pre-flight (GET): the same functions as code and the admin."""

from __future__ import annotations

import pytest

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import Event, RunStatus, WorkflowRun
from kumiflow_django.testing import run_until_idle
from tests.http.conftest import API

pytestmark = pytest.mark.django_db


@pytest.fixture
def failed(registry, clock):
    broken = {"yes": True}

    def ship(ctx):
        if broken["yes"]:
            raise RuntimeError("carrier down")
        return "shipped"

    define_workflow(
        "ship",
        steps=[
            s.compute("order", lambda ctx: 7),
            s.wait("PT1H"),
            s.webhook_send("https://crm.example.com/hook", body={"o": 7}, name="hook"),
            s.compute("ship", ship),
            s.return_(lambda ctx: ctx.steps["ship"]),
        ],
    )
    run = start_workflow("ship")
    clock.advance(hours=2)
    run_until_idle(dispatch=False)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    broken["yes"] = False
    return run


def test_the_pre_flight_says_what_happens_again_and_changes_nothing(api, failed):
    before = Event.objects.count()
    response = api.get(f"{API}runs/{failed.id}/restart/?from_step=1")
    assert response.status_code == 200
    plan = response.json()
    assert plan["refusal"] is None
    assert [c["path"] for c in plan["choices"]] == ["0", "1"]
    assert [(r["what"], r["key"]) for r in plan["repeats"]] == [("webhook", "new")]
    assert plan["carried"] == ["order"]
    assert Event.objects.count() == before
    refused = api.get(f"{API}runs/{failed.id}/restart/?from_step=3").json()
    assert "rolled back" in refused["refusal"]


def test_a_restart_answers_the_new_run_and_a_refusal_is_a_409(api, failed, clock):
    response = api.post_json(
        f"{API}runs/{failed.id}/restart/", {"from_step": "1", "reason": "carrier is back"}
    )
    assert response.status_code == 201, response.content
    new = response.json()
    assert new["id"] != str(failed.id) and new["status"] == "waiting"
    clock.advance(hours=2)
    run_until_idle(dispatch=False)
    assert WorkflowRun.objects.get(pk=new["id"]).result == "shipped"
    marker = Event.objects.filter(stream_id=str(failed.id)).order_by("-version")[0]
    assert marker.type == "kumiflow.workflow.run-restarted"
    assert marker.payload["reason"] == "carrier is back"
    assert marker.created_by.startswith("token:")

    conflict = api.post_json(f"{API}runs/{failed.id}/restart/", {"from_step": "3"})
    assert conflict.status_code == 409
    assert "rolled back" in conflict.json()["error"]["message"]
    missing = api.post_json(f"{API}runs/{failed.id}/restart/", {})
    assert missing.status_code == 400 and missing.json()["error"]["field"] == "from_step"


def test_restarting_needs_the_retry_permission(token_client, failed):
    client = token_client("view_workflowrun")
    response = client.post_json(f"{API}runs/{failed.id}/restart/", {"from_step": "1"})
    assert response.status_code == 403
    assert client.get(f"{API}runs/{failed.id}/restart/").status_code == 200
