"""The run list converts each column of its rows straight to JSON
(``serializers.summaries``); its answer is, to the byte, what the runs'
models give (``serializers.run_summary``, the ORM's conversions)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.http import serializers
from kumiflow_django.http.views import json_response
from kumiflow_django.models import RunStatus, WorkflowRun
from tests.http.conftest import API

pytestmark = pytest.mark.django_db

BASE = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def filled(registry):
    """Five runs with every field of a summary filled, at the values' edges: a
    time without microseconds, two runs started at the same instant (ordered
    by id), non-ASCII text, nested attributes' values of each JSON type."""
    define_workflow("filled", steps=[s.compute("a", lambda ctx: 1)])
    for n in range(5):
        run = start_workflow("filled", payload={"n": n}, idempotency_key=f"key-{n}-é")
        started = BASE + timedelta(seconds=min(n, 3), microseconds=0 if n < 2 else 1000 * n + 7)
        WorkflowRun.objects.filter(pk=run.pk).update(
            workflow_version=f"v{n}-ü",
            status=RunStatus.COMPLETED if n % 2 else RunStatus.WAITING,
            cursor=[n, 0, "ß"] if n % 2 else [n],
            started_at=started,
            updated_at=started + timedelta(minutes=1, microseconds=999_999),
            finished_at=started + timedelta(hours=25),
            attributes={"customer": f"C-{n}-ñ", "n": n, "vip": n % 2 == 0, "ratio": n / 4},
        )


# In another zone than UTC a naive time taken as local time would show.
@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_each_page_is_what_the_models_give_to_the_byte(api, filled, settings, zone):
    settings.TIME_ZONE = zone
    ordered = list(WorkflowRun.objects.order_by("-started_at", "-id"))
    assert len(ordered) == 5
    cursor = None
    for start in range(0, 5, 2):
        query = {"limit": 2} if cursor is None else {"limit": 2, "cursor": cursor}
        response = api.get(f"{API}runs/", query)
        models = ordered[start : start + 2]
        more = start + 2 < len(ordered)
        expected = json_response(
            200,
            {
                "runs": [serializers.run_summary(run) for run in models],
                "next_cursor": serializers.encode_cursor(models[-1].started_at, models[-1].id)
                if more
                else None,
            },
        )
        assert response.content == expected.content
        cursor = response.json()["next_cursor"]
    assert cursor is None


def test_a_run_without_the_optional_fields_is_what_its_model_gives(api, registry):
    define_workflow("bare", steps=[s.wait("PT1H")])
    run = start_workflow("bare")
    WorkflowRun.objects.filter(pk=run.pk).update(cursor=None, attributes={})
    response = api.get(f"{API}runs/")
    model = WorkflowRun.objects.get(pk=run.pk)
    summary = serializers.run_summary(model)
    assert summary["finished_at"] is None and summary["idempotency_key"] is None
    assert summary["workflow_version"] is None and summary["position"] is None
    expected = json_response(200, {"runs": [summary], "next_cursor": None})
    assert response.content == expected.content


def _plan(statement: str) -> str:
    """How the database would run ``statement``; on PostgreSQL with sorting
    priced out, so that a sort shows only where no index gives the order."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"EXPLAIN QUERY PLAN {statement}")
            return "\n".join(str(row[-1]) for row in cursor.fetchall())
        if connection.vendor == "postgresql":
            cursor.execute("SET enable_sort = off")
            try:
                cursor.execute(f"EXPLAIN {statement}")
                return "\n".join(row[0] for row in cursor.fetchall())
            finally:
                cursor.execute("RESET enable_sort")
        cursor.execute(f"EXPLAIN {statement}")
        return "\n".join(str(row) for row in cursor.fetchall())


def test_a_page_is_read_in_order_from_an_index_not_sorted_from_all_the_runs(api, registry):
    """Without an index on (tenant, started, id) the list read every run of
    the tenant and sorted them, for 50 rows (3.9 ms at 3,300 runs on SQLite)."""
    define_workflow("many", steps=[s.compute("a", lambda ctx: 1)])
    for n in range(30):
        start_workflow("many", payload={"n": n})
    with CaptureQueriesContext(connection) as queries:
        page = api.get(f"{API}runs/", {"limit": 5})
    assert len(page.json()["runs"]) == 5
    (statement,) = [q["sql"] for q in queries.captured_queries if "ORDER BY" in q["sql"]]
    plan = _plan(statement)
    assert "kumiflow_run_tenant_idx" in plan, plan
    assert not any(sort in plan for sort in ("TEMP B-TREE", "Sort", "filesort")), plan
