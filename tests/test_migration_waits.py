"""The migration that stores every wait as a ``RunWait`` row keeps the waits of
runs that wait while it runs: back to the run row's columns and forward again,
and the run is woken by its event after it."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from kumiflow_django import append_event, define_workflow, on_event
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus, RunWait, WorkflowRun

# Migrations run outside a test transaction (DDL commits on MariaDB).
pytestmark = pytest.mark.django_db(transaction=True)

APP = "kumiflow"


def _migrations() -> tuple[str, str]:
    """The migration of the waits and the one it follows (whatever their numbers)."""
    graph = MigrationExecutor(connection).loader.graph
    (name,) = [n for a, n in graph.nodes if a == APP and n.endswith("_run_waits_one_way")]
    (parent,) = [n for a, n in graph.node_map[(APP, name)].parents if a == APP]
    return name, parent


def _columns_at(migration: str) -> list[tuple]:
    """The run rows' wait columns, read through the models of ``migration``."""
    state = MigrationExecutor(connection).loader.project_state((APP, migration))
    Run = state.apps.get_model(APP, "WorkflowRun")
    return list(
        Run.objects.values_list(
            "awaited_event_type", "correlation_key", "awaited_match", "awaited_after"
        )
    )


@pytest.fixture
def approvals(registry):
    return define_workflow(
        "approval",
        trigger=on_event("refund.requested"),
        steps=[
            s.wait_for_event(
                "refund.approved",
                match={"payload.refund": lambda ctx: ctx.event.payload["refund"]},
                timeout="P7D",
                name="approved",
            ),
            s.return_(lambda ctx: ctx.steps["approved"]["payload"]),
        ],
    )


def test_a_waiting_run_keeps_its_wait_across_the_migration_and_is_woken_after_it(approvals):
    append_event("refund-7", "refund.requested", {"refund": 7})
    run = WorkflowRun.objects.get()
    assert run.status == RunStatus.WAITING_EVENT
    wait_fields = ("branch", "event_type", "correlation_key", "match", "after", "gaps")
    before = list(RunWait.objects.values_list(*wait_fields))
    assert before[0][:2] == ("", "refund.approved")
    assert before[0][3] == {"payload.refund": 7}

    waits_one_way, previous = _migrations()
    try:
        call_command("migrate", APP, previous, verbosity=0)
        # Back: the wait is in the run row's columns again, and its row is gone.
        assert _columns_at(previous) == [
            ("refund.approved", before[0][2], {"payload.refund": 7}, before[0][4])
        ]
        assert not RunWait.objects.exists()
    finally:
        call_command("migrate", APP, verbosity=0)

    # Forward: the columns became the run's row of the root branch, as it was.
    assert list(RunWait.objects.values_list(*wait_fields)) == before
    append_event("refund-7", "refund.approved", {"refund": 8})  # another refund's
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_EVENT

    append_event("refund-7", "refund.approved", {"refund": 7, "by": "ops"})

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.result == {"refund": 7, "by": "ops"}
    assert not RunWait.objects.exists()
