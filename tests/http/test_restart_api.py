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


def test_a_token_of_another_tenant_cannot_see_or_restart_the_run(token_client, failed):
    """The run is tenant ``default``'s: another tenant's token gets a 404 for
    the pre-flight and the restart (not a 403 that says the run exists)."""
    other = token_client("view_workflowrun", "retry_workflowrun", tenant="acme")
    before = Event.objects.count()
    assert other.get(f"{API}runs/{failed.id}/restart/?from_step=1").status_code == 404
    response = other.post_json(f"{API}runs/{failed.id}/restart/", {"from_step": "1"})
    assert response.status_code == 404
    assert Event.objects.count() == before


@pytest.mark.parametrize(
    "from_step",
    ["../2", "-1", "1.then.0", "2.else.5", "9" * 5000, "٣", "³", "1 ", "0.", "", "x" * 10_000],
)
def test_a_hostile_step_path_is_refused_and_changes_nothing(api, failed, from_step):
    before = Event.objects.count()
    plan = api.get(f"{API}runs/{failed.id}/restart/", {"from_step": from_step})
    assert plan.status_code in (200, 400), plan.content
    if plan.status_code == 200:
        assert plan.json()["refusal"] or from_step == ""
    posted = api.post_json(f"{API}runs/{failed.id}/restart/", {"from_step": from_step})
    assert posted.status_code in (400, 409), posted.content
    assert Event.objects.count() == before
    assert WorkflowRun.objects.count() == 1


@pytest.mark.parametrize("body", [{"from_step": 1}, {"from_step": None}, {"from_step": ["1"]}])
def test_a_step_path_that_is_not_text_is_a_400(api, failed, body):
    response = api.post_json(f"{API}runs/{failed.id}/restart/", body)
    assert response.status_code == 400, response.content


@pytest.mark.parametrize("reason", ["line\nbreak\x00", "\x1b[31mred", "r" * 5000])
def test_a_restart_reason_is_checked_like_a_cancel_reason(api, failed, reason):
    response = api.post_json(
        f"{API}runs/{failed.id}/restart/", {"from_step": "1", "reason": reason}
    )
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == "reason"
    assert WorkflowRun.objects.count() == 1


def test_a_waiting_run_is_not_restarted(api, registry, clock):
    define_workflow("slow", steps=[s.wait("PT1H"), s.return_(lambda ctx: 1)])
    run = start_workflow("slow")
    assert api.get(f"{API}runs/{run.id}/restart/").json()["refusal"]
    response = api.post_json(f"{API}runs/{run.id}/restart/", {"from_step": "0"})
    assert response.status_code == 409
    assert WorkflowRun.objects.count() == 1


def test_a_key_taken_between_the_plan_and_the_start_is_a_409(api, registry, monkeypatch):
    """The restart's key is chosen free, then a start of its own takes it
    before the restart's start (simulated: the choice did not see it): the
    restart is a conflict (409), nothing of it is kept, never the other run."""
    from kumiflow_django.engine import restart as restart_module

    define_workflow("once", steps=[s.return_(lambda ctx: ctx.event.payload["n"])])
    old = start_workflow("once", payload={"n": 1}, idempotency_key="k")
    squatter = start_workflow("once", payload={"n": 2}, idempotency_key="k#restart-1")
    monkeypatch.setattr(restart_module, "keyed_run", lambda *args: None)
    before = Event.objects.count()

    response = api.post_json(f"{API}runs/{old.id}/restart/", {"from_step": "0"})

    assert response.status_code == 409, response.content
    assert "was taken by run" in response.json()["error"]["message"]
    assert Event.objects.count() == before
    assert set(WorkflowRun.objects.values_list("id", flat=True)) == {old.id, squatter.id}


def test_a_10000_character_step_path_is_refused_without_being_echoed(api, failed):
    from kumiflow_django import restart_plan

    plan = restart_plan(failed.id, "0." + "a.0." * 2500)
    assert "at most 200 characters" in (plan.refusal or "")
    assert len(str(plan.as_dict())) < 4000
    hostile = "0." + "a.0." * 2500
    response = api.get(f"{API}runs/{failed.id}/restart/", {"from_step": hostile})
    assert response.status_code == 400, response.content  # the query is checked first
    assert len(response.content) < 4000
    definition = api.get(f"{API}runs/{failed.id}/restart/", {"definition": "d" * 10_000})
    assert len(definition.content) < 4000
