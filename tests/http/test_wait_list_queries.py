"""The lists of runs read the waits of a page's waiting runs in one query:
a page of 50 runs waiting for an event costs what a page of 2 does, in the
admin's run list (which names each run's awaited event) and in the API's
``runs/`` (whose summaries name none)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from kumiflow_django import start_workflow
from kumiflow_django.models import RunStatus, RunWait, WorkflowRun
from tests.http.conftest import API

pytestmark = pytest.mark.django_db


def _start(count: int, first: int = 0) -> None:
    for i in range(first, first + count):
        start_workflow("approval", payload={"order": f"o-{i}"})


def _queries(get) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = get()
    assert response.status_code == 200
    return len(captured)


def test_the_admin_run_list_of_50_waiting_runs_reads_their_waits_in_one_query(
    admin_client, approval
):
    url = reverse("admin:kumiflow_workflowrun_changelist")
    _start(2)
    few = _queries(lambda: admin_client.get(url))
    _start(48, first=2)
    assert WorkflowRun.objects.filter(status=RunStatus.WAITING_EVENT).count() == 50
    assert RunWait.objects.count() == 50
    many = _queries(lambda: admin_client.get(url))
    assert many == few
    page = admin_client.get(url).content.decode()
    assert page.count("order.approved") >= 50  # each row names the event it awaits


def test_the_api_run_list_of_50_waiting_runs_reads_their_waits_in_one_query(api, approval):
    _start(2)
    api.get(f"{API}runs/")  # the token's first use is recorded once
    few = _queries(lambda: api.get(f"{API}runs/", {"limit": 50}))
    _start(48, first=2)
    many = _queries(lambda: api.get(f"{API}runs/", {"limit": 50}))
    assert many == few
    runs = api.get(f"{API}runs/", {"limit": 50}).json()["runs"]
    assert len(runs) == 50
    assert all(run["status"] == RunStatus.WAITING_EVENT for run in runs)
