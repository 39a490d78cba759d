"""The same workflow on every way of running a task: kumiflow's pool in another
process, Django's immediate backend, django-tasks-db's ``db_worker`` and RQ
(``rqworker`` with redis-server), each in processes of their own.

The out-of-process ones need a server database (the test database must be
reachable from the child processes); RQ also needs redis-server on
``REDIS_URL`` (default 127.0.0.1:6379): without it the RQ test is skipped,
unless ``KUMIFLOW_REQUIRE_REDIS=1`` (CI), which fails it instead.
"""

from __future__ import annotations

import os

import pytest
from django.conf import settings

from kumiflow_django import start_workflow
from kumiflow_django.models import RunStatus, TaskStatus
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import Event
from tests.processes import output, spawn, stop
from tests.tasks.helpers import run_of, task_of, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _events(task) -> list[str]:
    return list(
        Event.objects.filter(stream_id=str(task.id))
        .order_by("version")
        .values_list("type", flat=True)
    )


def test_the_immediate_backend_runs_the_task_after_the_commit():
    run = start_workflow("task-double-immediate", payload={"args": [21]})
    # Django's immediate backend ran the attempt once the segment committed.
    run = run_of(run)
    assert (run.status, run.result) == (RunStatus.COMPLETED, 42)
    task = task_of(run)
    assert (task.backend, task.status, task.attempt) == ("default", TaskStatus.COMPLETED, 1)
    assert task.worker == ""  # the lease ended with the attempt
    assert _events(task) == [
        ev.TASK_REQUESTED,
        ev.TASK_ENQUEUED,
        ev.TASK_ATTEMPT_STARTED,
        ev.TASK_COMPLETED,
    ]
    started = Event.objects.get(stream_id=str(task.id), type=ev.TASK_ATTEMPT_STARTED)
    assert started.payload["worker"].startswith("django-tasks:")


def _redis_up() -> bool:
    try:
        import redis
    except ImportError:
        return False
    url = settings.RQ_QUEUES["default"]["URL"] if hasattr(settings, "RQ_QUEUES") else ""
    try:
        return bool(url) and redis.Redis.from_url(url, socket_timeout=1).ping()
    except redis.RedisError:
        return False


def _worker(kind: str) -> list[str]:
    if kind == "pool":
        return ["kumiflow_tasks", "--threads", "4", "--max-interval", "0.2"]
    if kind == "db":
        if "db" not in settings.TASKS:
            pytest.skip("django-tasks-db is not installed")
        return [
            *("db_worker", "--backend", "db", "--interval", "0.1"),
            *("--no-startup-delay", "--no-reload"),
        ]
    if "rq" not in settings.TASKS:
        pytest.skip("django-tasks-rq is not installed")
    if not _redis_up():
        if os.environ.get("KUMIFLOW_REQUIRE_REDIS"):
            pytest.fail("redis-server is not reachable (KUMIFLOW_REQUIRE_REDIS=1)")
        pytest.skip("redis-server is not reachable")
    return ["rqworker", "default", "--job-class", "django_tasks_rq.Job", "--burst"]


@pytest.mark.server_db
@pytest.mark.parametrize(
    "kind, workflow",
    [("pool", "task-double"), ("db", "task-double-db"), ("rq", "task-double-rq")],
)
def test_the_same_workflow_runs_on_a_worker_in_another_process(kind, workflow):
    command = _worker(kind)
    run = start_workflow(workflow, payload={"args": [21]})
    assert run.status == RunStatus.WAITING_EVENT
    # RQ's burst worker drains what is queued and exits: start it after the enqueue.
    proc = spawn(*command)
    try:
        wait_until(
            lambda: run_of(run).status == RunStatus.COMPLETED,
            60,
            f"the run to complete on {kind}",
        )
    except AssertionError:
        stop([proc])
        raise AssertionError(f"{kind} worker output:\n{output(proc)}") from None
    stop([proc])
    assert run_of(run).result == 42
    task = task_of(run)
    assert (task.status, task.attempt) == (TaskStatus.COMPLETED, 1)
    started = Event.objects.get(stream_id=str(task.id), type=ev.TASK_ATTEMPT_STARTED)
    expected = "django-tasks:" if kind != "pool" else ""
    assert started.payload["worker"].startswith(expected)
