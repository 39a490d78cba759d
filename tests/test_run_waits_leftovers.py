"""A run's ``RunWait`` rows go with its wait: whatever ends or resumes a
waiting run (its event, its timeout, a cancel, its parent's cancel, a
retention pass) leaves no row that could wake it again."""

from __future__ import annotations

import datetime as dt

import pytest
from django.core.management import call_command

from kumiflow_django import append_event, cancel_run, define_workflow, on_event
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus, RunWait, WorkflowRun
from kumiflow_django.projections.retention import Retention
from kumiflow_django.workers.resume import ResumeLoop

pytestmark = pytest.mark.django_db


def _order(ctx):
    return ctx.event.payload["order"]


@pytest.fixture
def flows(registry):
    define_workflow(
        "paid",
        trigger=on_event("order.placed"),
        steps=[
            s.wait_for_event(
                "payment.received", match={"payload.order": _order}, timeout="P3D", name="paid"
            ),
            s.return_(lambda ctx: ctx.steps["paid"]),
        ],
    )
    define_workflow(
        "split",
        trigger=on_event("split.placed"),
        steps=[
            s.parallel(
                "both",
                {
                    "pay": [
                        s.wait_for_event(
                            "payment.received", match={"payload.order": _order}, name="p"
                        )
                    ],
                    "ship": [
                        s.wait_for_event(
                            "carrier.booked", match={"payload.order": _order}, name="c"
                        )
                    ],
                },
            ),
        ],
    )
    define_workflow(
        "waiter",
        steps=[s.wait_for_event("payment.received", match={"payload.order": _order}, name="w")],
    )
    define_workflow(
        "parent",
        trigger=on_event("parent.placed"),
        steps=[
            s.child("kid", "waiter", input=lambda ctx: {"order": ctx.event.payload["order"]}),
        ],
    )


def test_a_cancelled_waiting_run_has_no_wait_left_and_its_event_wakes_nothing(flows):
    append_event("o-1", "order.placed", {"order": 1})
    run = WorkflowRun.objects.get()
    # What the docs show (docs/steps/wait_for_event.md, "What a run waits for").
    wait = RunWait.objects.get(run=run, branch="")
    assert (wait.event_type, wait.match) == ("payment.received", {"payload.order": 1})
    assert RunWait.objects.filter(run_id=run.id).count() == 1
    cancel_run(run.id, reason="test")
    assert not RunWait.objects.exists()
    append_event("pay-1", "payment.received", {"order": 1})
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_a_cancelled_run_waiting_in_branches_has_no_wait_left(flows):
    append_event("s-2", "split.placed", {"order": 2})
    run = WorkflowRun.objects.get()
    assert RunWait.objects.filter(run_id=run.id).count() == 2
    cancel_run(run.id, reason="test")
    assert not RunWait.objects.exists()
    call_command("kumiflow_rebuild", verbosity=0)  # the rows are the log's
    assert not RunWait.objects.exists()


def test_a_child_cancelled_with_its_parent_has_no_wait_left(flows):
    append_event("p-3", "parent.placed", {"order": 3})
    kid = WorkflowRun.objects.get(workflow="waiter")
    assert kid.status == RunStatus.WAITING_EVENT
    assert RunWait.objects.filter(run_id=kid.id).count() == 1
    cancel_run(WorkflowRun.objects.get(workflow="parent").id, reason="test")
    kid.refresh_from_db()
    assert kid.status == RunStatus.CANCELLED
    assert not RunWait.objects.exists()
    append_event("pay-3", "payment.received", {"order": 3})
    kid.refresh_from_db()
    assert kid.status == RunStatus.CANCELLED


def test_a_timed_out_wait_has_no_row_left_and_a_late_event_wakes_nothing(flows, clock):
    append_event("o-4", "order.placed", {"order": 4})
    run = WorkflowRun.objects.get()
    clock.advance(days=3)
    assert ResumeLoop().run_once() == 1
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert not RunWait.objects.exists()
    append_event("pay-4", "payment.received", {"order": 4})
    run.refresh_from_db()
    assert run.result == {"timed_out": True, "type": "payment.received", "payload": None}


def test_retention_takes_a_finished_runs_wait_rows_with_it(flows, clock):
    """A row an older release left behind for a run that ended (its cancel as
    a child did not remove it) goes with its run: no row of a deleted run."""
    append_event("o-5", "order.placed", {"order": 5})
    run = WorkflowRun.objects.get()
    left = RunWait.objects.get(run=run)
    cancel_run(run.id, reason="test")
    left.pk = None
    left.save()  # as the older release left it
    clock.advance(days=100)

    report = Retention(clock.now() - dt.timedelta(days=50)).run()

    assert report.runs == 1
    assert not WorkflowRun.objects.exists()
    assert not RunWait.objects.filter(run_id=run.id).exists()
