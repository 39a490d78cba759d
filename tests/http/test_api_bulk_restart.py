"""The API's bulk restart from a step (``POST bulk/`` with ``from_step``)."""

from __future__ import annotations

import pytest

from kumiflow_django import continue_bulk
from kumiflow_django.models import Event
from tests.http.conftest import API
from tests.test_bulk_restart import RESTARTED
from tests.test_bulk_restart import failed as failed  # the fixture

pytestmark = pytest.mark.django_db


def test_the_http_api_restarts_in_bulk(api, failed):
    body = {
        "action": "restart",
        "filters": {"workflow": "flaky", "status": "failed"},
        "from_step": "1",
        "reason": "partner fixed",
    }
    counted = api.post_json(f"{API}bulk/", {**body, "dry_run": True})
    assert (counted.status_code, counted.json()["matching"]) == (200, 3)
    missing = api.post_json(f"{API}bulk/", {**body, "from_step": None})
    assert missing.status_code == 400
    recorded = api.post_json(f"{API}bulk/", body)
    assert recorded.status_code == 202, recorded.content
    job = recorded.json()
    assert (job["action"], job["from_step"]) == ("restart", "1")
    continue_bulk(job["id"])
    followed = api.get(f"{API}bulk/{job['id']}/").json()
    assert (followed["status"], followed["done"]) == ("done", 3)
    markers = Event.objects.filter(type=RESTARTED)
    assert {m.created_by.startswith("token:") for m in markers} == {True}
