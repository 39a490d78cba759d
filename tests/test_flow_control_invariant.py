"""The invariant flow control counts by (``flow.admission.violations``),
checked after every step of runs and task attempts driven through
admission, parking, release, cancel, retry, failure, an operator's override
and the retention purge; and each way of breaking it is found. Runs on
every database."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kumiflow_django import (
    Limit,
    cancel_run,
    define_workflow,
    retry_run,
    set_flow_limit,
    start_workflow,
)
from kumiflow_django import steps as s
from kumiflow_django.flow.admission import violations
from kumiflow_django.flow.limits import purge_idle_keys
from kumiflow_django.flow.models import FlowKey
from kumiflow_django.models import RunStatus, StepTask, TaskStatus, WorkflowRun
from kumiflow_django.store import clock as the_clock
from kumiflow_django.tasks import attempts
from kumiflow_django.testing import run_until_idle

pytestmark = pytest.mark.django_db

BROKEN = {"on": True}


def _breaks(ctx):
    if BROKEN["on"]:
        raise ZeroDivisionError("broken")
    return 1


def flaky(n):
    if BROKEN["on"]:
        raise RuntimeError("the service is down")
    return n


@pytest.fixture(autouse=True)
def broken():
    BROKEN["on"] = True
    yield
    BROKEN["on"] = True


def status(run) -> str:
    return WorkflowRun.objects.get(pk=run.pk).status


def parked(run) -> bool:
    row = WorkflowRun.objects.get(pk=run.pk)
    return (row.status, row.held_by, row.wake_at) == (RunStatus.QUEUED, "concurrency", None)


def holds(step: str) -> None:
    assert violations() == [], f"after {step}"


def test_runs_keep_the_invariant_through_every_transition(registry, clock):
    limit = Limit(key="k", max=1, scope="shared")
    define_workflow("holder", concurrency=limit, steps=[s.wait("PT1H"), s.return_(1)])
    define_workflow("fragile", concurrency=limit, steps=[s.compute("x", _breaks), s.wait("PT1H")])
    define_workflow("quick", concurrency=Limit(key="idle", max=1), steps=[s.return_(1)])
    holds("nothing")

    a = start_workflow("holder")
    holds("an admission")
    b, c = start_workflow("holder"), start_workflow("holder")
    assert status(a) == RunStatus.WAITING and parked(b) and parked(c)
    holds("two parked")

    cancel_run(b.pk, reason="not needed")
    holds("a parked run cancelled")

    clock.advance(hours=1)
    run_until_idle()
    assert (status(a), status(c)) == (RunStatus.COMPLETED, RunStatus.WAITING)
    holds("an end that admits the next")

    f, d = start_workflow("fragile"), start_workflow("holder")
    assert parked(f) and parked(d)
    holds("parked behind an active run")

    cancel_run(c.pk, reason="done")
    holds("an active run cancelled: the next woken")
    run_until_idle()
    assert (status(f), status(d)) == (RunStatus.FAILED, RunStatus.WAITING)
    holds("a failed first segment, the next admitted")

    BROKEN["on"] = False
    retry_run(f.pk, by="ops", reason="fixed")
    holds("a retry above the limit")
    run_until_idle()
    assert (status(f), status(d)) == (RunStatus.WAITING, RunStatus.WAITING)
    holds("the retried run waiting")

    e = start_workflow("holder")
    assert parked(e)
    holds("parked behind two")

    quick = start_workflow("quick")
    assert status(quick) == RunStatus.COMPLETED
    assert purge_idle_keys(clock.now() + timedelta(seconds=1)) == 1  # "idle" only
    assert list(FlowKey.objects.values_list("key", flat=True)) == ["k"]
    holds("the retention purge")

    set_flow_limit("shared", max_active=3, by="ops", reason="backlog")
    holds("a raised limit: the parked run woken")
    clock.advance(seconds=10)
    run_until_idle()
    assert status(e) == RunStatus.WAITING
    holds("admitted by the raised limit")
    set_flow_limit("shared", by="ops", reason="back to normal")
    holds("the limit lowered below the active runs")

    g = start_workflow("holder")
    assert parked(g)
    for run in (d, e, f):
        cancel_run(run.pk, reason="enough")
        holds(f"{run.pk} cancelled")
    run_until_idle()
    assert status(g) == RunStatus.WAITING
    cancel_run(g.pk, reason="enough")
    holds("everything cancelled")
    assert purge_idle_keys(clock.now() + timedelta(seconds=1)) == 1
    holds("the last key purged")


def test_task_attempts_keep_the_invariant_through_every_transition(registry, clock):
    define_workflow(
        "enrich",
        steps=[
            s.task(
                "api",
                flaky,
                args=[1],
                timeout="PT10S",
                retry=2,
                concurrency=Limit(key="geo", max=1, scope="geo"),
            )
        ],
    )
    start_workflow("enrich")
    start_workflow("enrich")
    holds("two tasks requested")

    # Either run's task may come first (both were requested in one instant).
    [attempt] = attempts.claim_due(the_clock.now(), worker="w", limit=10)
    first = WorkflowRun.objects.get(pk=StepTask.objects.get(pk=attempt.task_id).run_id)
    parked_task = StepTask.objects.get(status=TaskStatus.PENDING)
    assert (parked_task.held_by, parked_task.next_attempt_at) == ("concurrency", None)
    holds("one attempt running, one parked")

    attempts.record(attempt, attempts.run(attempt))  # fails: retried after the backoff
    task = StepTask.objects.get(pk=attempt.task_id)
    assert (task.status, task.attempt) == (TaskStatus.PENDING, 1)
    holds("a failed attempt: its slot freed, the parked one woken")

    [other] = attempts.claim_due(the_clock.now(), worker="w", limit=10)
    assert other.task_id == parked_task.pk
    holds("the woken attempt running")

    cancel_run(parked_task.run_id, reason="not needed")
    assert StepTask.objects.get(pk=other.task_id).status == TaskStatus.CANCELLED
    holds("a running attempt cancelled with its run")

    clock.advance(seconds=5)
    [retried] = attempts.claim_due(the_clock.now(), worker="w", limit=10)
    assert (retried.task_id, retried.number) == (attempt.task_id, 2)
    holds("the retry running")
    clock.advance(seconds=11)
    attempts.expire(retried.task_id, the_clock.now())  # its lease ran out: the last attempt
    assert StepTask.objects.get(pk=retried.task_id).status == TaskStatus.FAILED
    run_until_idle()
    assert status(first) == RunStatus.FAILED
    holds("an attempt given up, the task and its run failed")

    BROKEN["on"] = False
    retry_run(first.pk, by="ops", reason="the service is back")
    holds("the run retried: its task pending again")
    run_until_idle()
    assert status(first) == RunStatus.COMPLETED
    holds("completed")
    assert purge_idle_keys(clock.now() + timedelta(seconds=1)) == 1
    holds("the idle key purged")


# -- each way of breaking it is found ---------------------------------------------------


@pytest.fixture
def one_per_key(registry):
    return define_workflow(
        "sync-one", concurrency=Limit(key="k", max=1), steps=[s.wait("PT1H"), s.return_(1)]
    )


def test_an_active_run_without_its_key_row_is_found(one_per_key):
    start_workflow("sync-one")
    holds("an admission")
    FlowKey.objects.all().delete()  # what a purge of a busy key would do
    assert violations() == ["run 'sync-one'/'k': active without its key's row"]


def test_a_key_row_that_counts_too_few_parked_runs_is_found(one_per_key):
    start_workflow("sync-one")
    start_workflow("sync-one")
    FlowKey.objects.update(held=0)
    assert violations() == ["run 'sync-one'/'k': 1 parked, its row says 0"]


def test_a_stranded_run_is_found(one_per_key):
    active = start_workflow("sync-one")
    start_workflow("sync-one")
    # As a lost release would leave it: the active run ended, nobody woke the next.
    WorkflowRun.objects.filter(pk=active.pk).update(status=RunStatus.COMPLETED)
    assert violations() == ["run 'sync-one'/'k': 1 parked, 0 of 1 slots taken"]


def test_a_stranded_task_attempt_and_an_unkeyed_running_one_are_found(registry, clock):
    define_workflow(
        "enrich-one",
        steps=[s.task("api", flaky, args=[1], concurrency=Limit(key="k", max=1))],
    )
    start_workflow("enrich-one")
    start_workflow("enrich-one")
    [running] = attempts.claim_due(the_clock.now(), worker="w", limit=10)
    holds("one running, one parked")
    FlowKey.objects.filter(kind="task").update(held=0)
    FlowKey.objects.filter(kind="task").delete()
    assert violations() == [
        "task 'enrich-one/api'/'k': active without its key's row",
        "task 'enrich-one/api'/'k': 1 parked, its row says 0",
    ]
    StepTask.objects.filter(pk=running.task_id).update(status=TaskStatus.COMPLETED)
    assert violations() == [
        "task 'enrich-one/api'/'k': 1 parked, its row says 0",
        "task 'enrich-one/api'/'k': 1 parked, 0 of 1 slots taken",
    ]


# -- runs admitted in a transaction before their row is written ------------------------


def test_a_run_parked_behind_two_nested_unwritten_runs_is_woken_by_the_outer_ones_end(
    registry, clock
):
    """``a`` starts ``b`` in its segment, ``b`` starts ``c`` in its own: both
    count as active before their rows are written, so ``c`` parks behind
    them, and neither is quiet any more. ``b``'s segment ending first must not
    make ``a`` quiet again: ``a`` then ends in its segment and wakes ``c``."""
    from kumiflow_django import on_event

    limit = Limit(key="k", max=2, scope="shared")
    define_workflow("a", concurrency=limit, steps=[s.append_event("x", "b.go"), s.return_("a")])
    define_workflow(
        "b",
        trigger=on_event("b.go"),
        concurrency=limit,
        steps=[s.append_event("y", "c.go"), s.wait("PT1H")],
    )
    define_workflow("c", trigger=on_event("c.go"), concurrency=limit, steps=[s.return_("c")])
    a = start_workflow("a")
    b, c = WorkflowRun.objects.get(workflow="b"), WorkflowRun.objects.get(workflow="c")
    assert (status(a), b.status) == (RunStatus.COMPLETED, RunStatus.WAITING)
    assert c.status == RunStatus.QUEUED and c.wake_at is not None  # woken by a's end
    holds("the nested starts")
    run_until_idle()
    assert status(c) == RunStatus.COMPLETED
