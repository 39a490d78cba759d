"""Flow control races, ordered by barriers on PostgreSQL and MariaDB, and the
resume loop's safety net for parked runs nobody would wake (every database)."""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

from kumiflow_django import Limit, cancel_run, define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.flow import admission
from kumiflow_django.flow.models import FlowKey
from kumiflow_django.models import RunStatus, WorkflowRun
from kumiflow_django.testing import run_until_idle
from tests.races import in_thread, wait_until_blocked_or_done


def reload(run):
    return WorkflowRun.objects.get(pk=run.pk)


@pytest.fixture
def one_per_key(registry):
    return define_workflow(
        "sync-one", concurrency=Limit(key="k", max=1), steps=[s.wait("PT1H"), s.return_(1)]
    )


def _parked(run) -> bool:
    row = reload(run)
    return (row.status, row.held_by, row.wake_at) == (RunStatus.QUEUED, "concurrency", None)


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_the_last_release_wakes_a_parked_run_another_transaction_holds(one_per_key):
    """The key's only parked run is locked by a transaction that does not end
    it (an operator's refused wake or cancel checking it, a worker reading it
    while it was due) when the active run ends. The release skipped it as
    "being decided about" and woke nobody: the run stayed parked for good,
    the key at ``held=1`` with nothing active (MariaDB, four workers)."""
    active = start_workflow("sync-one")
    parked = start_workflow("sync-one")
    assert reload(active).status == RunStatus.WAITING and _parked(parked)

    locked, done = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            list(WorkflowRun.objects.select_for_update().filter(pk=parked.pk))
            locked.set()
            assert done.wait(30), "the test never let the holder go"

    holder, holder_errors = in_thread(hold)
    assert locked.wait(30)
    ender, ender_errors = in_thread(lambda: cancel_run(active.pk, reason="ends its slot"))
    state = wait_until_blocked_or_done(ender)
    done.set()
    holder.join(30)
    ender.join(30)
    assert not holder_errors and not ender_errors, (holder_errors, ender_errors)
    assert reload(active).status == RunStatus.CANCELLED
    assert not _parked(parked), "the only parked run of a free key was left parked"
    assert reload(parked).wake_at is not None
    assert state == "blocked"  # it waited for the parked run instead of skipping it
    connections.close_all()


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_cancelling_a_parked_run_while_its_key_wakes_it_does_not_deadlock(one_per_key):
    """The waker holds the key and waits for the parked run; the cancel holding
    that run takes no key (its end frees no slot), so neither waits for the other."""
    active = start_workflow("sync-one")
    parked = start_workflow("sync-one")
    behind = start_workflow("sync-one")
    in_cancel, go = threading.Event(), threading.Event()
    real = admission.holds_slot

    def paused(run):
        if run.pk == parked.pk:
            in_cancel.set()  # the cancel holds the parked run's row now
            assert go.wait(30), "the test never let the cancel go"
        return real(run)

    from unittest import mock

    with mock.patch.object(admission, "holds_slot", paused):
        canceller, cancel_errors = in_thread(lambda: cancel_run(parked.pk, reason="not needed"))
        assert in_cancel.wait(30)
        ender, ender_errors = in_thread(lambda: cancel_run(active.pk, reason="done"))
        assert wait_until_blocked_or_done(ender) == "blocked"  # on the parked run's row
        go.set()
        canceller.join(30)
        ender.join(30)
    assert not cancel_errors and not ender_errors, (cancel_errors, ender_errors)
    assert (reload(active).status, reload(parked).status) == ("cancelled", "cancelled")
    assert reload(behind).wake_at is not None  # the slot went to the next in line
    connections.close_all()


# -- the invariant ---------------------------------------------------------------


@pytest.mark.django_db
def test_an_active_limited_run_without_its_key_row_breaks_the_invariant(one_per_key):
    start_workflow("sync-one")
    start_workflow("sync-one")  # queued
    assert admission.violations() == []
    FlowKey.objects.all().delete()  # what a purge of a busy key would do
    assert admission.violations() == [
        "run 'sync-one'/'k': active without its key's row",
        "run 'sync-one'/'k': 1 parked, its row says 0",
    ]
    assert start_workflow("sync-one").status == RunStatus.WAITING  # over the limit: why it matters


# -- the safety net ---------------------------------------------------------------


@pytest.mark.django_db
def test_the_sweep_wakes_a_parked_run_whose_key_has_a_free_slot(one_per_key, clock):
    active = start_workflow("sync-one")
    stranded = start_workflow("sync-one")
    # As a lost release would leave it: the active run ended, nobody woke the next.
    WorkflowRun.objects.filter(pk=active.pk).update(status=RunStatus.COMPLETED)
    assert _parked(stranded)
    assert admission.wake_stranded() == 1
    assert not _parked(stranded)
    run_until_idle()
    assert reload(stranded).status == RunStatus.WAITING  # admitted, running its steps
    assert admission.wake_stranded() == 0


@pytest.mark.django_db
def test_the_sweep_leaves_a_run_parked_behind_an_active_one(one_per_key, clock):
    active = start_workflow("sync-one")
    parked = start_workflow("sync-one")
    assert admission.wake_stranded() == 0
    assert _parked(parked) and reload(active).status == RunStatus.WAITING


@pytest.mark.django_db
def test_the_sweep_wakes_a_stranded_run_whose_key_row_says_nothing_is_parked(one_per_key):
    start_workflow("sync-one")
    stranded = start_workflow("sync-one")
    WorkflowRun.objects.exclude(pk=stranded.pk).update(status=RunStatus.FAILED)
    FlowKey.objects.update(held=0)  # a count too low: a release would not even look
    assert admission.wake_stranded() == 1
    assert not _parked(stranded)


@pytest.mark.django_db
def test_the_resume_loop_runs_the_sweep(one_per_key, clock):
    from kumiflow_django.workers.resume import ResumeLoop

    active = start_workflow("sync-one")
    stranded = start_workflow("sync-one")
    WorkflowRun.objects.filter(pk=active.pk).update(status=RunStatus.COMPLETED)
    loop = ResumeLoop()
    loop.run_once()  # the pass sweeps first: the run it wakes is resumed in it
    assert reload(stranded).status == RunStatus.WAITING


@pytest.mark.django_db
def test_a_failing_sweep_does_not_stop_the_resumes_but_an_outage_fails_the_pass(one_per_key, clock):
    from unittest import mock

    from django.db import OperationalError

    from kumiflow_django.workers.resume import ResumeLoop

    define_workflow("plain", start_mode="deferred", steps=[s.return_(1)])
    run = start_workflow("plain")
    loop = ResumeLoop()
    with mock.patch.object(loop, "_stranded", side_effect=RuntimeError("a bug")):
        assert loop.run_once() == 1  # logged; the due run was resumed all the same
    assert reload(run).status == RunStatus.COMPLETED
    loop = ResumeLoop()
    away = OperationalError(2006, "MySQL server has gone away")
    with mock.patch.object(loop, "_stranded", side_effect=away), pytest.raises(OperationalError):
        loop.run_once()  # the loop's outage handling sees it, as with the due query


# -- a parked task attempt held while its key is released --------------------------


def call_api(n):
    return n


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_release_passes_over_a_held_parked_attempt_and_the_sweep_wakes_it(registry):
    """Pins the interleaving that strands a parked task attempt (MariaDB CI,
    four workers: 16 attempts parked, none running). A release wakes parked
    attempts with SKIP LOCKED (waiting for one would take a task row after
    its key, against the lock order), so one that another transaction holds
    at that moment is passed over, and no later release comes: the key has
    nothing running. One pass of the stranded sweep wakes it."""
    from kumiflow_django import Limit
    from kumiflow_django.models import StepTask, TaskStatus
    from kumiflow_django.store import clock
    from kumiflow_django.tasks import attempts

    define_workflow(
        "enrich-one",
        steps=[s.task("api", call_api, args=lambda ctx: [1], concurrency=Limit(key="k", max=1))],
    )
    start_workflow("enrich-one")
    start_workflow("enrich-one")
    [running] = attempts.claim_due(clock.now(), worker="w", limit=10)
    parked = StepTask.objects.get(status=TaskStatus.PENDING)
    assert (parked.held_by, parked.next_attempt_at) == ("concurrency", None)

    locked, done = threading.Event(), threading.Event()

    def hold() -> None:  # a cancellation checking it, a late result of an earlier attempt
        with transaction.atomic():
            list(StepTask.objects.select_for_update().filter(pk=parked.pk))
            locked.set()
            assert done.wait(30), "the test never let the holder go"

    holder, holder_errors = in_thread(hold)
    try:
        assert locked.wait(30)
        # The running attempt ends while the parked one is held: its release skips it.
        recorded = attempts.record(running, attempts.run(running))
        assert recorded is not None and recorded.status == TaskStatus.COMPLETED
    finally:
        done.set()
        holder.join(30)
    assert not holder_errors, holder_errors

    parked.refresh_from_db()
    key = FlowKey.objects.get(kind="task", key="k")
    stranded = (parked.status, parked.held_by, parked.next_attempt_at)
    assert stranded == (TaskStatus.PENDING, "concurrency", None), "the release woke it after all"
    assert key.held > 0
    assert not StepTask.objects.filter(status=TaskStatus.RUNNING).exists()
    assert attempts.claim_due(clock.now(), worker="w", limit=10) == []  # nothing else looks

    assert admission.StrandedSweep()() == 1  # one pass of the resume loop's sweep
    parked.refresh_from_db()
    assert parked.next_attempt_at is not None
    assert len(attempts.claim_due(clock.now(), worker="w", limit=10)) == 1
    connections.close_all()
