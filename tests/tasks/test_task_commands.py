"""``manage.py kumiflow_tasks`` and the worker's task loop."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from kumiflow_django import start_workflow
from kumiflow_django.models import RunStatus
from kumiflow_django.workers.tasks import TaskLoop
from kumiflow_django.workers.worker import Worker
from tests.tasks.helpers import run_of

pytestmark = pytest.mark.django_db(transaction=True)


def test_kumiflow_tasks_once_runs_the_due_tasks_and_waits_for_them():
    run = start_workflow("task-double", payload={"args": [4]})
    call_command("kumiflow_tasks", "--once", "--threads", "2", verbosity=0)
    assert (run_of(run).status, run_of(run).result) == (RunStatus.COMPLETED, 8)


def test_a_task_pool_runs_only_its_queues():
    run = start_workflow("task-double", payload={"args": [4]})  # queue "default"
    call_command("kumiflow_tasks", "--once", "--queue", "slow", verbosity=0)
    assert run_of(run).status == RunStatus.WAITING_EVENT
    call_command("kumiflow_tasks", "--once", "--queue", "slow", "--queue", "default", verbosity=0)
    assert run_of(run).status == RunStatus.COMPLETED


def test_the_worker_runs_the_task_loop_unless_told_not_to():
    run = start_workflow("task-double", payload={"args": [5]})
    assert Worker(tasks=False).run_once().get("tasks") is None
    assert run_of(run).status == RunStatus.WAITING_EVENT
    assert Worker(task_threads=1).run_once()["tasks"] == 1
    assert run_of(run).result == 10


def test_a_pool_without_threads_runs_no_function_and_does_not_spin_on_them():
    run = start_workflow("task-double", payload={"args": [5]})
    loop = TaskLoop(threads=0)
    assert loop.run_once() == 0
    assert run_of(run).status == RunStatus.WAITING_EVENT
    assert loop.next_due() is None  # a due task it cannot run is not its next wake-up


@pytest.mark.parametrize(
    "args, message",
    [
        (["--threads", "-1"], "must be 0 or more"),
        (["--worker-id", "x" * 65], "1 to 64 characters"),
    ],
)
def test_bad_options_are_refused(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("kumiflow_tasks", "--once", *args, verbosity=0)
