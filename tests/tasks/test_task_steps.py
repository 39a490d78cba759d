"""Task steps on kumiflow's own pool: outside the transaction, at least once.

Each test starts one of the shop's ``task-*`` probe workflows
(testproject/shop/workflows.py), drives the task loop and looks at the run,
the task's row and the calls the probe recorded.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.test import override_settings

from kumiflow_django import cancel_run, retry_run, start_workflow
from kumiflow_django.models import RunStatus, StepTask, TaskStatus, WorkflowRun
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import Event
from kumiflow_django.tasks import attempts
from kumiflow_django.testing import run_until_idle
from kumiflow_django.workers import tasks as pool
from kumiflow_django.workers.tasks import TaskLoop
from tests.tasks.helpers import calls, fresh_key, release, run_of, started, task_of, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def task_events(task: StepTask) -> list[str]:
    return list(
        Event.objects.filter(stream_id=str(task.id))
        .order_by("version")
        .values_list("type", flat=True)
    )


def test_a_task_result_reaches_the_next_step():
    run = start_workflow("task-double", payload={"args": [21]})
    assert run.status == RunStatus.WAITING_EVENT
    task = task_of(run)
    assert (task.status, task.function) == (TaskStatus.PENDING, "testproject.shop.tasks.double")

    loop = TaskLoop(threads=2)
    assert loop.run_once() == 1
    loop.drain()
    loop.close()

    run = run_of(run)
    assert (run.status, run.result) == (RunStatus.COMPLETED, 42)
    assert task_events(task_of(run)) == [
        ev.TASK_REQUESTED,
        ev.TASK_ATTEMPT_STARTED,
        ev.TASK_COMPLETED,
    ]
    assert task_of(run).result == 42


def _open_transactions() -> int:
    """Transactions of other sessions open now, as the database itself sees them."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
                "AND xact_start IS NOT NULL"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM information_schema.INNODB_TRX t "
                "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
                "WHERE p.DB = DATABASE() AND t.trx_mysql_thread_id <> CONNECTION_ID()"
            )
        return int(cursor.fetchone()[0])


def test_a_running_task_holds_no_transaction_and_no_row_lock():
    key = fresh_key()
    run = start_workflow("task-held", payload={"args": [key, "done"]})
    loop = TaskLoop(threads=2)
    assert loop.run_once() == 1
    started(key)  # the function runs, and goes on until it is released

    # While it runs: another transaction locks and updates the run's row and
    # the task's row at once (NOWAIT: a held lock would raise).
    began = time.monotonic()
    nowait = connection.features.has_select_for_update_nowait
    with transaction.atomic():
        locked = WorkflowRun.objects.select_for_update(nowait=nowait).get(pk=run.pk)
        WorkflowRun.objects.filter(pk=run.pk).update(updated_at=locked.updated_at)
        StepTask.objects.select_for_update(nowait=nowait).get(run_id=run.pk)
    assert time.monotonic() - began < 1.0  # on SQLite: no writer held the database
    if connection.vendor != "sqlite":
        # The loop's only busy thread is the one in the function: a transaction
        # opened around the attempt would be open now, for as long as it runs.
        assert task_of(run).status == TaskStatus.RUNNING
        assert _open_transactions() == 0

    release(key)
    loop.drain()
    loop.close()
    assert run_of(run).result == "done"


def test_a_timeout_then_a_success_follows_the_retry_policy_and_ignores_the_late_result(clock):
    key = fresh_key()
    run = start_workflow("task-slow-first", payload={"args": [key, "second"]})
    loop = TaskLoop(threads=1)
    loop.run_once()
    started(key)  # attempt 1 runs, and will outlive its 1 s timeout

    clock.advance(seconds=2)
    assert loop.run_once() == 1  # attempt 1 given up; attempt 2 not due yet
    task = task_of(run)
    assert (task.status, task.attempt) == (TaskStatus.PENDING, 1)
    assert "timed out after 1 s" in task.last_error
    assert loop.running() == 0  # its thread is abandoned: the pool takes more work

    clock.advance(seconds=1)
    assert loop.run_once() == 1  # attempt 2, on a fresh thread
    loop.drain()
    run = run_of(run)
    assert (run.status, run.result) == (RunStatus.COMPLETED, "second")
    version = run.version

    release(key)  # attempt 1 ends now: its result comes too late
    wait_until(
        lambda: ev.TASK_RESULT_IGNORED in task_events(task),
        what="the late result to be recorded as ignored",
    )
    loop.close()
    assert run_of(run).version == version and run_of(run).result == "second"
    task = task_of(run)
    assert (task.status, task.attempt, task.result) == (TaskStatus.COMPLETED, 2, "second")
    made = calls(key)
    assert [c["attempt"] for c in made] == [1, 2]
    assert made[0]["idempotency_key"] == made[1]["idempotency_key"] == str(task.id)


@pytest.mark.slow
def test_heartbeats_keep_a_ten_second_task_alive_with_a_two_second_heartbeat_timeout():
    key = fresh_key()
    run = start_workflow("task-heartbeat", payload={"args": [key, 10.0, 0.5]})
    loop = TaskLoop(threads=2, max_interval=0.2)
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        wait_until(lambda: run_of(run).status == RunStatus.COMPLETED, 40, "the run to complete")
    finally:
        loop.stop()
        thread.join(30)
    task = task_of(run)
    assert task.attempt == 1 and len(calls(key)) == 1
    result = str(run_of(run).result)
    assert result.startswith("done after ")
    assert int(result.split()[2]) >= 15


def test_an_attempt_that_stops_heartbeating_is_given_up(clock):
    run = start_workflow("task-heartbeat", payload={"args": ["never", 60.0, 30.0]})
    claimed = attempts.claim(task_of(run).id, worker="test")
    assert claimed is not None
    clock.advance(seconds=1.5)
    assert claimed.context.heartbeat({"at": "half"}) is True  # lease: now + 2 s
    clock.advance(seconds=2.5)
    given_up = attempts.expire(claimed.task_id, clock.now())
    assert given_up is not None and given_up.status == TaskStatus.PENDING
    assert "no heartbeat for 2 s" in given_up.last_error
    assert claimed.context.heartbeat() is False  # the attempt learns it was given up
    assert claimed.context.cancelled is True


def test_a_cancelled_runs_late_result_changes_nothing():
    key = fresh_key()
    run = start_workflow("task-cancellable", payload={"args": [key]})
    loop = TaskLoop(threads=1)
    loop.run_once()
    started(key)

    cancelled = cancel_run(run.pk, reason="customer left")
    assert task_of(run).status == TaskStatus.CANCELLED
    loop.drain()  # the function sees it is cancelled and returns
    loop.close()

    assert [c.get("saw") for c in calls(key)] == [None, "cancelled"]
    after = run_of(run)
    assert (after.status, after.version) == (RunStatus.CANCELLED, cancelled.version)
    assert task_events(task_of(run))[-2:] == [ev.TASK_CANCELLED, ev.TASK_RESULT_IGNORED]


def test_failed_attempts_are_retried_by_the_policy_under_one_idempotency_key(clock):
    key = fresh_key()
    run = start_workflow("task-flaky", payload={"args": [key, 2]})
    for _ in range(2):
        run_until_idle()
        assert task_of(run).status == TaskStatus.PENDING
        clock.advance(seconds=1)
    run_until_idle()
    run = run_of(run)
    assert (run.status, run.result) == (RunStatus.COMPLETED, "succeeded")
    task = task_of(run)
    assert task.attempt == 3
    assert {c["idempotency_key"] for c in calls(key)} == {str(task.id)}
    failed = Event.objects.filter(stream_id=str(task.id), type=ev.TASK_ATTEMPT_FAILED)
    assert [e.payload["attempt"] for e in failed.order_by("version")] == [1, 2]
    assert "attempt 1 failed on purpose" in failed.order_by("version")[0].payload["traceback"]


def test_a_task_that_fails_for_good_fails_the_run_and_retry_run_runs_it_again(clock, tmp_path):
    flag = tmp_path / "service-is-up"
    run = start_workflow("task-outage", payload={"args": [str(flag)]})
    run_until_idle()
    clock.advance(seconds=1)
    run_until_idle()

    run = run_of(run)
    assert (run.status, run.reason) == (RunStatus.FAILED, ev.TASK_FAILED_REASON)
    assert "ConnectionError: the service is down" in run.last_error
    assert "fails_until_fixed" in run.last_error  # the traceback's tail
    task = task_of(run)
    assert (task.status, task.attempt) == (TaskStatus.FAILED, 2)
    assert "Traceback" in task.traceback

    Path(flag).write_text("up")
    retried = retry_run(run.pk)
    assert retried.status == RunStatus.WAITING_EVENT and retried.wake_at is None
    assert task_of(run).status == TaskStatus.PENDING
    run_until_idle()
    run = run_of(run)
    assert (run.status, run.result) == (RunStatus.COMPLETED, "fixed")
    assert task_of(run).id == task.id and task_of(run).attempt == 3


def test_an_exception_that_is_never_retried_fails_at_once():
    run = start_workflow("task-bad-input")
    run_until_idle()
    run = run_of(run)
    assert (run.status, run.reason) == (RunStatus.FAILED, ev.TASK_FAILED_REASON)
    assert task_of(run).attempt == 1
    assert "ValueError: this input can never work" in run.last_error


def test_on_error_result_gives_the_step_the_failure_to_branch_on():
    run = start_workflow("task-bad-input-result")
    run_until_idle()
    run = run_of(run)
    assert run.status == RunStatus.COMPLETED
    assert isinstance(run.result, dict)
    assert run.result["ok"] is False
    assert run.result["error_type"] == "builtins.ValueError"
    assert run.result["error"] == "this input can never work"
    assert run.result["attempts"] == 1
    assert "Traceback" in run.result["traceback"]


def test_a_result_that_is_not_json_fails_the_step_with_a_clear_reason():
    run = start_workflow("task-unstorable")
    run_until_idle()
    run = run_of(run)
    assert (run.status, run.reason) == (RunStatus.FAILED, ev.TASK_FAILED_REASON)
    assert "the result of testproject.shop.tasks.unstorable is not JSON" in run.last_error
    assert task_of(run).attempt == 1  # trying again would return the same


@override_settings(KUMIFLOW_MAX_RESULT_BYTES=1000)
def test_a_result_larger_than_the_setting_fails_the_step():
    run = start_workflow("task-too-large", payload={"args": [5000]})
    run_until_idle()
    run = run_of(run)
    assert run.status == RunStatus.FAILED
    assert "KUMIFLOW_MAX_RESULT_BYTES" in run.last_error


def test_arguments_that_are_not_json_fail_the_step_without_an_attempt(registry):
    from kumiflow_django import define_workflow
    from kumiflow_django import steps as s
    from testproject.shop.tasks import double

    define_workflow("odd-args", steps=[s.task("doubled", double, args=lambda ctx: [object()])])
    run = start_workflow("odd-args")
    run = run_of(run)
    assert (run.status, run.reason) == (RunStatus.FAILED, ev.TASK_FAILED_REASON)
    assert "the arguments of task 'doubled'" in run.last_error
    task = task_of(run)
    assert (task.status, task.attempt) == (TaskStatus.FAILED, 0)


def test_a_pool_records_a_few_outcomes_at_a_time(monkeypatch):
    """Its threads share one interpreter lock: outcomes recorded together each
    held their transaction open for the time of all of them. Past
    ``RECORDS_AT_ONCE``, a thread waits before its transaction begins, until
    one of those has committed."""
    at_once = getattr(pool, "RECORDS_AT_ONCE", 4)
    runs = [start_workflow("task-double", payload={"args": [n]}) for n in range(at_once + 1)]
    loop = TaskLoop(threads=at_once + 1)
    lock = threading.Lock()
    active, most, entered = [0], [0], [0]
    either = threading.Event()  # one more thread waits to record, or records
    waited: list[bool] = []

    class Watched:
        def __init__(self, inner: threading.Semaphore) -> None:
            self.inner = inner

        def acquire(self, timeout: float = -1) -> bool:
            if not self.inner.acquire(blocking=False):
                waited.append(True)
                either.set()
                return self.inner.acquire(timeout=timeout)
            return True

        def release(self) -> None:
            self.inner.release()

    inner = getattr(loop, "_recording", threading.BoundedSemaphore(at_once + 1))
    monkeypatch.setattr(loop, "_recording", Watched(inner), raising=False)
    real = attempts.record

    def record(attempt, outcome):
        with lock:
            active[0] += 1
            entered[0] += 1
            most[0] = max(most[0], active[0])
            first = entered[0] <= at_once
        if not first:
            either.set()
        try:
            if first:  # hold the first ones open until the one more comes
                assert either.wait(30), "the last outcome never came"
            return real(attempt, outcome)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(attempts, "record", record)
    assert loop.run_once() == at_once + 1
    loop.drain()
    loop.close()
    assert (most[0], waited) == (at_once, [True])
    assert [run_of(run).result for run in runs] == [2 * n for n in range(at_once + 1)]


def test_waiting_to_record_never_outlasts_the_attempts_lease(monkeypatch):
    """The pool's bound on outcomes recorded at once must not make a result
    late: when every slot stays taken (recordings that wait for a lock), an
    outcome does not wait for one past its lease's end, it is recorded then
    without one (a late result is refused by the engine)."""
    from kumiflow_django.store import clock
    from kumiflow_django.tasks.context import TaskContext

    loop = TaskLoop(threads=1)
    for _ in range(pool.RECORDS_AT_ONCE):  # every slot taken, and kept
        assert loop._recording.acquire(blocking=False)
    recorded = threading.Event()
    monkeypatch.setattr(attempts, "record", lambda attempt, outcome: recorded.set())
    context = TaskContext(
        task_id=uuid.uuid4(),
        run_id=uuid.uuid4(),
        tenant="default",
        step="s",
        attempt=1,
        started_at=clock.now(),
        timeout=0.2,
        heartbeat_timeout=None,
    )
    attempt = attempts.Attempt(context.task_id, 1, "f", [], context, ())
    thread = threading.Thread(target=loop._record, args=(attempt, attempts.Outcome(ok=True)))
    thread.start()
    try:
        assert recorded.wait(timeout=10), "the outcome waited for a slot past its lease"
    finally:
        for _ in range(pool.RECORDS_AT_ONCE):
            loop._recording.release()
        thread.join(timeout=30)
