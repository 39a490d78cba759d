"""The API's pause, resume and fail of a run, and bulk operations by filter."""

from __future__ import annotations

import pytest

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.http import tokens
from kumiflow_django.models import Event, RunStatus, WorkflowRun
from kumiflow_django.workers.bulk import BulkLoop
from tests.http.conftest import API

pytestmark = pytest.mark.django_db


@pytest.fixture
def slow(registry, clock):
    define_workflow("slow", steps=[s.wait("P1D"), s.return_("done")])
    return [start_workflow("slow") for _ in range(4)] + [start_workflow("slow", tenant="other")]


def test_pause_resume_and_fail_a_run(api, slow):
    run = slow[0]
    paused = api.post_json(f"{API}runs/{run.id}/pause/", {"reason": "outage"})
    assert paused.status_code == 200
    assert WorkflowRun.objects.get(pk=run.pk).paused
    again = api.post_json(f"{API}runs/{run.id}/pause/", {})
    assert again.status_code == 409
    assert api.post_json(f"{API}runs/{run.id}/resume/", {}).status_code == 200
    failed = api.post_json(f"{API}runs/{run.id}/fail/", {"reason": "no"})
    assert (failed.status_code, failed.json()["status"]) == (200, "failed")
    event = Event.objects.get(stream_id=str(run.id), type__endswith="run-paused")
    assert (event.payload["reason"], event.created_by.startswith("token:")) == ("outage", True)


def test_a_token_without_the_pause_permission_changes_nothing(token_client, slow):
    client = token_client(tokens.VIEW, tokens.CANCEL)
    response = client.post_json(f"{API}runs/{slow[0].id}/pause/", {})
    assert response.status_code == 403
    assert not WorkflowRun.objects.get(pk=slow[0].pk).paused
    bulk = client.post_json(f"{API}bulk/", {"action": "pause", "filters": {"workflow": "slow"}})
    assert bulk.status_code == 403


def test_bulk_dry_run_counts_then_the_worker_cancels_the_callers_tenant_only(api, slow):
    body = {"action": "cancel", "filters": {"workflow": "slow"}, "reason": "bad batch"}
    counted = api.post_json(f"{API}bulk/", {**body, "dry_run": True})
    assert (counted.status_code, counted.json()["matching"]) == (200, 4)
    assert WorkflowRun.objects.filter(status=RunStatus.CANCELLED).count() == 0
    recorded = api.post_json(f"{API}bulk/", body)
    assert recorded.status_code == 202
    job = recorded.json()
    assert (job["status"], job["matching"], job["done"]) == ("running", 4, 0)
    BulkLoop().run_once()
    followed = api.get(f"{API}bulk/{job['id']}/").json()
    assert (followed["status"], followed["done"], followed["skipped"]) == ("done", 4, 0)
    statuses = dict(WorkflowRun.objects.values_list("tenant_id", "status").distinct())
    assert statuses == {"default": RunStatus.CANCELLED, "other": RunStatus.WAITING}


def test_bulk_refuses_another_tenant_and_unknown_filters(api, slow, token_client):
    other = api.post_json(f"{API}bulk/", {"action": "cancel", "filters": {"tenant": "other"}})
    assert other.status_code == 403
    unknown = api.post_json(f"{API}bulk/", {"action": "cancel", "filters": {"colour": "red"}})
    assert unknown.status_code == 400
    assert api.get(f"{API}bulk/not-a-uuid/").status_code == 404
    job = api.post_json(f"{API}bulk/", {"action": "cancel"}).json()
    outsider = token_client(tenant="other")
    assert outsider.get(f"{API}bulk/{job['id']}/").status_code == 404


def test_bulk_acts_on_the_callers_tenant_byte_for_byte(token_client, registry):
    """MariaDB's collation takes "ACME" and "acme " for "acme": a bulk cancel
    by "acme" counts and cancels its own runs only."""
    define_workflow("idle", steps=[s.wait_for_event("never")])
    mine = start_workflow("idle", tenant="acme")
    others = [start_workflow("idle", tenant=t) for t in ("ACME", "acme ")]
    acme = token_client(tenant="acme")
    body = {"action": "cancel", "filters": {"workflow": "idle"}, "reason": "x"}

    counted = acme.post_json(f"{API}bulk/", {**body, "dry_run": True})
    tenant = acme.post_json(f"{API}bulk/", {**body, "dry_run": True, "filters": {"tenant": "acme"}})
    assert (counted.json()["matching"], tenant.json()["matching"]) == (1, 1)
    assert acme.post_json(f"{API}bulk/", body).status_code == 202
    BulkLoop().run_once()

    assert WorkflowRun.objects.get(pk=mine.pk).status == RunStatus.CANCELLED
    assert {WorkflowRun.objects.get(pk=o.pk).status for o in others} == {RunStatus.WAITING_EVENT}
