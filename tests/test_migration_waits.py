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


def test_waits_in_branches_and_of_the_run_itself_both_survive_back_and_forth(registry):
    """Branch waits were rows before the migration and stay rows across both
    directions; a run's own wait goes to its columns and comes back; each
    run is woken by its events after the round trip."""
    order = lambda ctx: ctx.event.payload["order"]  # noqa: E731
    define_workflow(
        "own",
        trigger=on_event("own.placed"),
        steps=[s.wait_for_event("own.paid", match={"payload.order": order}, name="paid")],
    )
    define_workflow(
        "split",
        trigger=on_event("split.placed"),
        steps=[
            s.parallel(
                "both",
                {
                    "pay": [s.wait_for_event("split.paid", match={"payload.order": order})],
                    "ship": [s.wait_for_event("split.shipped", match={"payload.order": order})],
                },
            )
        ],
    )
    append_event("own-1", "own.placed", {"order": 1})
    append_event("split-2", "split.placed", {"order": 2})
    own = WorkflowRun.objects.get(workflow="own")
    split = WorkflowRun.objects.get(workflow="split")
    assert (own.status, split.status) == (RunStatus.WAITING_EVENT, RunStatus.WAITING)
    fields = ("run_id", "branch", "event_type", "correlation_key", "match", "after", "gaps")
    before = sorted(RunWait.objects.values_list(*fields), key=repr)
    assert len(before) == 3
    branch_rows = [row for row in before if row[0] == split.id]
    assert len(branch_rows) == 2 and all(row[1] for row in branch_rows)

    waits_one_way, previous = _migrations()
    try:
        call_command("migrate", APP, previous, verbosity=0)
        # Back: the branches' rows are as they were, the own wait is in its columns.
        state = MigrationExecutor(connection).loader.project_state((APP, previous))
        OldWait = state.apps.get_model(APP, "RunWait")
        left = sorted(
            OldWait.objects.values_list(
                "run_id", "branch", "event_type", "correlation_key", "match", "after", "gaps"
            ),
            key=repr,
        )
        assert left == sorted(branch_rows, key=repr)
        Run = state.apps.get_model(APP, "WorkflowRun")
        assert Run.objects.get(pk=own.id).awaited_event_type == "own.paid"
        assert Run.objects.get(pk=split.id).awaited_event_type == ""
    finally:
        call_command("migrate", APP, verbosity=0)

    assert sorted(RunWait.objects.values_list(*fields), key=repr) == before
    append_event("pay-1", "own.paid", {"order": 1})
    append_event("pay-2", "split.paid", {"order": 2})
    append_event("ship-2", "split.shipped", {"order": 2})
    own.refresh_from_db()
    split.refresh_from_db()
    assert (own.status, split.status) == (RunStatus.COMPLETED, RunStatus.COMPLETED)
    assert not RunWait.objects.exists()
