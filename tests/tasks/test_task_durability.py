"""A task attempt survives the death of the process that runs it."""

from __future__ import annotations

import os
import signal

import pytest

from kumiflow_django import start_workflow
from kumiflow_django.models import RunStatus, TaskStatus
from tests.processes import output, spawn, stop
from tests.tasks.helpers import calls, fresh_key, run_of, task_of, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server_db]


def test_sigkill_during_an_attempt_leads_to_exactly_one_more_attempt_with_the_same_key(tmp_path):
    key, marker = fresh_key(), tmp_path / "attempt-1-runs"
    run = start_workflow("task-sigkill", payload={"args": [key, str(marker), 120.0]})
    first = spawn("kumiflow_tasks", "--threads", "2", "--max-interval", "0.2")
    try:
        wait_until(marker.exists, 60, "attempt 1 to run")
    except AssertionError:
        stop([first])
        raise AssertionError(output(first)) from None
    assert int(marker.read_text()) == first.pid
    os.kill(first.pid, signal.SIGKILL)
    first.wait(30)
    assert task_of(run).status == TaskStatus.RUNNING  # as the dead process left it

    # Two survivors: the lease (the task's 3 s timeout) runs out, and exactly
    # one of them gives the attempt up and runs the next one.
    survivors = [spawn("kumiflow_tasks", "--threads", "2", "--max-interval", "0.2") for _ in "ab"]
    try:
        wait_until(lambda: run_of(run).status == RunStatus.COMPLETED, 60, "the run to complete")
    finally:
        codes = stop(survivors)
    assert codes == [0, 0], [output(p) for p in survivors]
    assert run_of(run).result == "attempt 2"
    made = calls(key)
    assert [c["attempt"] for c in made] == [1, 2]
    assert made[0]["idempotency_key"] == made[1]["idempotency_key"] == str(task_of(run).id)
    assert made[0]["pid"] == first.pid and made[1]["pid"] != first.pid
    task = task_of(run)
    assert (task.status, task.attempt) == (TaskStatus.COMPLETED, 2)
    assert "timed out after 3 s" in task.last_error
