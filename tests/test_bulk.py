"""Bulk operations by filter: batched, audited per run, resumable."""

from __future__ import annotations

import pytest

from kumiflow_django import (
    InvalidEvent,
    bulk_runs,
    continue_bulk,
    define_workflow,
    start_workflow,
)
from kumiflow_django import steps as s
from kumiflow_django.engine import bulk
from kumiflow_django.models import BulkOperation, RunStatus, WorkflowRun
from kumiflow_django.store.models import Event
from kumiflow_django.testing import run_until_idle

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting(registry, clock):
    define_workflow("slow", steps=[s.wait("P1D"), s.return_("done")])
    define_workflow("quick", steps=[s.return_("done")])
    runs = [start_workflow("slow") for _ in range(7)]
    start_workflow("quick")
    return runs


def test_bulk_cancel_of_every_run_matching_a_filter(waiting):
    operation = bulk_runs(
        "cancel", filters={"workflow": "slow"}, reason="bad deploy", by="ops", batch_size=3
    )
    assert (operation.status, operation.total, operation.done, operation.skipped) == (
        "done",
        7,
        7,
        0,
    )
    statuses = dict(WorkflowRun.objects.values_list("workflow", "status").distinct())
    assert statuses == {"slow": RunStatus.CANCELLED, "quick": RunStatus.COMPLETED}
    cancelled = Event.objects.filter(type="kumiflow.workflow.run-cancelled")
    assert {(e.payload["reason"], e.created_by) for e in cancelled} == {("bad deploy", "ops")}


def test_runs_the_action_refuses_are_skipped_with_their_reason(waiting):
    operation = bulk_runs("retry", filters={}, reason="again")
    assert (operation.total, operation.done, operation.skipped, operation.errors) == (8, 0, 8, 0)
    assert operation.skipped_reasons == {
        "the run is waiting, not failed: only failed runs are retried": 7,
        "the run is completed, not failed: only failed runs are retried": 1,
    }


def test_bulk_pause_then_resume_by_status(waiting, clock):
    bulk_runs("pause", filters={"status": "waiting"}, reason="freeze")
    assert WorkflowRun.objects.filter(paused=True).count() == 7
    clock.advance(days=2)
    run_until_idle()
    assert WorkflowRun.objects.filter(status=RunStatus.WAITING).count() == 7
    operation = bulk_runs("resume", filters={"paused": True}, reason="thaw")
    assert operation.done == 7
    run_until_idle()
    assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == 8


def test_an_interrupted_operation_continues_at_its_cursor_and_does_no_run_twice(waiting):
    operation = bulk_runs("cancel", filters={"workflow": "slow"}, batch_size=3, run=False)
    assert operation.total == 7
    # one batch, then the process "dies": the operation stays running at its cursor
    first, more = bulk._batch(operation.id, 60.0)
    assert (first.done, first.status, more) == (3, "running", True)
    assert WorkflowRun.objects.filter(status=RunStatus.CANCELLED).count() == 3
    resumed = continue_bulk(operation.id)
    assert (resumed.status, resumed.done, resumed.skipped) == ("done", 7, 0)
    assert Event.objects.filter(type="kumiflow.workflow.run-cancelled").count() == 7


def test_a_crash_mid_batch_keeps_what_was_done_and_does_nothing_twice(waiting, monkeypatch):
    operation = bulk_runs("cancel", filters={"workflow": "slow"}, batch_size=4, run=False)
    real = bulk.ACTIONS["cancel"]
    calls = {"n": 0}

    def cancel_then_crash(run_id, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("the worker was killed")
        return real[1](run_id, **kwargs)

    monkeypatch.setitem(bulk.ACTIONS, "cancel", (real[0], cancel_then_crash))
    with pytest.raises(RuntimeError):
        continue_bulk(operation.id)
    # each run commits with the cursor: two done, the third rolled back with its cursor
    assert WorkflowRun.objects.filter(status=RunStatus.CANCELLED).count() == 2
    recorded = BulkOperation.objects.get()
    assert recorded.done == 2 and recorded.cursor is not None
    assert WorkflowRun.objects.get(pk=recorded.cursor).status == RunStatus.CANCELLED
    monkeypatch.setitem(bulk.ACTIONS, "cancel", real)
    resumed = continue_bulk(operation.id)
    assert (resumed.status, resumed.done, resumed.skipped) == ("done", 7, 0)
    assert Event.objects.filter(type="kumiflow.workflow.run-cancelled").count() == 7


def test_filters_and_actions_are_checked():
    with pytest.raises(InvalidEvent, match="unknown bulk action"):
        bulk_runs("explode", filters={})
    with pytest.raises(InvalidEvent, match="unknown run filters"):
        bulk_runs("cancel", filters={"colour": "red"})
    with pytest.raises(InvalidEvent, match="unknown run status"):
        bulk_runs("cancel", filters={"status": "sleeping"})
    assert BulkOperation.objects.count() == 0


def test_preflight_counts_without_changing_anything(waiting):
    assert bulk.preflight("cancel", {"workflow": "slow", "tenant": "default"}) == 7
    assert bulk.preflight("cancel", {"status": ["waiting", "completed"]}) == 8
    assert WorkflowRun.objects.filter(status=RunStatus.CANCELLED).count() == 0


def test_the_workers_bulk_loop_works_through_a_recorded_operation(waiting):
    from kumiflow_django.workers.bulk import BulkLoop

    operation = bulk_runs("cancel", filters={"workflow": "slow"}, batch_size=2, run=False)
    assert BulkLoop().run_once() == 7
    operation.refresh_from_db()
    assert (operation.status, operation.done, operation.lease_until) == ("done", 7, None)
    assert BulkLoop().run_once() == 0  # nothing unfinished
