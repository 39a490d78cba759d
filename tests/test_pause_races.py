"""A pause racing a claim: whenever the pause commits, no segment of the run
starts after it (PostgreSQL and MariaDB, where claims run concurrently)."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from kumiflow_django import define_workflow, pause_run, pause_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus, WorkflowRun
from kumiflow_django.workers import resume as resume_loop
from kumiflow_django.workers.resume import ResumeLoop
from tests.helpers import types
from tests.races import in_thread, wait_until_blocked_or_done

pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def due_run(registry, clock):
    define_workflow("slow", steps=[s.wait("PT1H"), s.return_("done")])
    run = start_workflow("slow")
    clock.advance(hours=2)
    return run


def _handshake():
    return threading.Event(), threading.Event()


@pytest.mark.parametrize("pause", ["run", "workflow"])
def test_a_pause_after_the_due_read_keeps_the_claim_off(due_run, monkeypatch, pause):
    read, go = _handshake()
    real = resume_loop.due_runs

    def due_then_wait(*args, **kwargs):
        found = real(*args, **kwargs)
        read.set()
        assert go.wait(30), "the test never let the worker go"
        return found

    monkeypatch.setattr(resume_loop, "due_runs", due_then_wait)
    resumed: list[int] = []
    worker, errors = in_thread(lambda: resumed.append(ResumeLoop(threads=1).run_once()))
    assert read.wait(30)
    if pause == "run":
        pause_run(due_run.id, reason="race")
    else:
        pause_workflow("slow", reason="race")
    go.set()
    worker.join(30)
    assert not errors, errors
    assert resumed == [0]
    row = WorkflowRun.objects.get(pk=due_run.pk)
    assert row.status == RunStatus.WAITING
    assert "step.resumed" not in types(row)
    connections.close_all()


@pytest.mark.parametrize("pause", ["run", "workflow"])
def test_a_pause_after_the_lease_is_obeyed_under_the_runs_lock(due_run, monkeypatch, pause):
    leased, go = _handshake()
    real = ResumeLoop._resume_claimed

    def wait_then_resume(self, claimed):
        leased.set()
        assert go.wait(30), "the test never let the worker go"
        return real(self, claimed)

    monkeypatch.setattr(ResumeLoop, "_resume_claimed", wait_then_resume)
    resumed: list[int] = []
    worker, errors = in_thread(lambda: resumed.append(ResumeLoop(threads=1).run_once()))
    assert leased.wait(30)
    if pause == "run":
        pause_run(due_run.id, reason="race")
    else:
        pause_workflow("slow", reason="race")
    go.set()
    worker.join(30)
    assert not errors, errors
    assert resumed == [0]
    row = WorkflowRun.objects.get(pk=due_run.pk)
    assert (row.status, row.lease_owner) == (RunStatus.WAITING, "")
    assert "step.resumed" not in types(row)
    connections.close_all()


def test_a_pause_waits_for_the_segment_in_flight_and_holds_the_next_one(registry, clock):
    inside, finish = _handshake()

    def slow_step(payload):
        inside.set()
        assert finish.wait(30), "the test never let the step finish"
        return 1

    define_workflow(
        "two-waits",
        start_mode="deferred",
        steps=[s.call("a", slow_step), s.wait("PT1M"), s.return_("done")],
    )
    run = start_workflow("two-waits")
    worker, worker_errors = in_thread(lambda: ResumeLoop(threads=1).run_once())
    assert inside.wait(30)
    pauser, pauser_errors = in_thread(lambda: pause_run(run.id, reason="mid-segment"))
    state = wait_until_blocked_or_done(pauser)
    finish.set()
    worker.join(30)
    pauser.join(30)
    assert not worker_errors and not pauser_errors, (worker_errors, pauser_errors)
    assert state == "blocked"  # it waited for the segment's lock
    row = WorkflowRun.objects.get(pk=run.pk)
    assert (row.status, row.paused) == (RunStatus.WAITING, True)
    assert types(row)[-2:] == ["step.waiting", "run-paused"]
    clock.advance(minutes=2)
    assert ResumeLoop(threads=1).run_once() == 0
    connections.close_all()


def test_two_processes_continuing_one_bulk_operation_do_each_run_once(registry, clock):
    from kumiflow_django import bulk_runs, continue_bulk
    from kumiflow_django.models import BulkOperation, Event

    define_workflow("slow", steps=[s.wait("P1D"), s.return_("done")])
    for _ in range(30):
        start_workflow("slow")
    operation = bulk_runs("cancel", filters={"workflow": "slow"}, batch_size=4, run=False)
    barrier = threading.Barrier(2)

    def work():
        barrier.wait(30)
        continue_bulk(operation.id)

    threads = [in_thread(work) for _ in range(2)]
    for thread, _ in threads:
        thread.join(60)
    assert not any(errors for _, errors in threads), threads
    done = BulkOperation.objects.get()
    assert (done.status, done.done, done.skipped, done.errors) == ("done", 30, 0, 0)
    assert Event.objects.filter(type="kumiflow.workflow.run-cancelled").count() == 30
    connections.close_all()


def test_a_workflow_paused_between_the_wake_look_up_and_the_runs_lock_holds_the_wake(
    registry, monkeypatch
):
    """The appender's wake-up reads the waiting runs, then locks them: a pause
    of their workflow that commits in between is obeyed under the run's lock
    (pause_workflow has returned; no segment of the run may start after it)."""
    from kumiflow_django import append_event
    from kumiflow_django.engine import resuming

    define_workflow("pinged", steps=[s.wait_for_event("ping"), s.return_("woken")])
    run = start_workflow("pinged")
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.WAITING_EVENT
    read, go = _handshake()
    real = resuming._found

    def found_then_wait(qs, **kwargs):
        found = real(qs, **kwargs)
        if found:
            read.set()
            assert go.wait(30), "the test never let the appender go"
        return found

    monkeypatch.setattr(resuming, "_found", found_then_wait)
    appender, errors = in_thread(lambda: append_event("pings", "ping", {}))
    assert read.wait(30)
    pause_workflow("pinged", reason="race")
    go.set()
    appender.join(30)
    assert not errors, errors
    row = WorkflowRun.objects.get(pk=run.pk)
    assert row.status == RunStatus.WAITING_EVENT
    assert "step.resumed" not in types(row)
    assert "event-matched" in types(row)  # recorded, taken when it is resumed
    connections.close_all()
