"""The worker process, Django Tasks wake-ups, and stalled-run recovery."""

from __future__ import annotations

import datetime as dt
import signal
import threading
from typing import Any

import django
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.urls import reverse

from kumiflow_django import append_event, define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.checks import check_settings
from kumiflow_django.models import Event, RunStatus, WorkflowRun
from kumiflow_django.workers.worker import Worker
from testproject.shop.models import Tally
from tests.processes import output, spawn, stop, wait_for

DUMMY_TASKS = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}


@pytest.mark.django_db
def test_worker_run_once_runs_every_loop(registry, clock, mailoutbox):
    define_workflow("w", steps=[s.mail_send(to="a@x.io", subject="s", body="b"), s.wait("PT1M")])
    start_workflow("w")
    clock.advance(minutes=1)
    assert Worker().run_once() == {"resume": 1, "bulk": 0, "dispatch": 1, "cron": 0, "tasks": 0}
    assert len(mailoutbox) == 1


@pytest.mark.django_db
def test_kumiflow_worker_once_and_its_options(capsys):
    call_command("kumiflow_worker", "--once", "--no-cron", verbosity=0)
    assert "resume: 0" in capsys.readouterr().out
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="at least one loop"):
        call_command(
            "kumiflow_worker", "--once", "--no-cron", "--no-resume", "--no-dispatch", "--no-tasks"
        )


@pytest.mark.django_db(transaction=True)
def test_stop_ends_every_loop_thread(registry):
    worker = Worker(max_interval=0.2)
    thread = threading.Thread(target=worker.run)
    thread.start()
    worker.stop()
    thread.join(10)
    assert not thread.is_alive()


needs_tasks = pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is Django 6.0+")


@needs_tasks
@pytest.mark.django_db
@override_settings(TASKS=DUMMY_TASKS, KUMIFLOW_TASKS_BACKEND="default")
def test_wake_ups_are_also_enqueued_as_tasks(registry, clock, django_capture_on_commit_callbacks):
    from django.tasks import task_backends

    from kumiflow_django import tasks

    wake_run: Any = tasks.wake_run  # a Task (rebound over its function)
    backend: Any = task_backends["default"]
    backend.clear()
    define_workflow("sleepy", steps=[s.wait("PT10M"), s.return_("done")])
    with django_capture_on_commit_callbacks(execute=True):
        run = start_workflow("sleepy")
    [queued] = backend.results
    assert queued.task.name == "wake_run"
    assert queued.args == [str(run.id)]
    assert queued.task.run_after == clock.now() + dt.timedelta(minutes=10)

    assert wake_run.call(str(run.id)) == "nothing to do", "an early task does nothing"
    clock.advance(minutes=10)
    assert wake_run.call(str(run.id)) == "resumed"
    assert wake_run.call(str(run.id)) == "nothing to do", "a repeated task does nothing"
    run.refresh_from_db()
    assert run.result == "done"


@needs_tasks
def test_the_tasks_setting_is_checked():
    with override_settings(KUMIFLOW_TASKS_BACKEND="missing", TASKS=DUMMY_TASKS):
        assert [m.id for m in check_settings()] == ["kumiflow.E015"]
    immediate = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
    with override_settings(KUMIFLOW_TASKS_BACKEND="default", TASKS=immediate):
        assert [m.id for m in check_settings()] == ["kumiflow.E016"]


@pytest.mark.server_db
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_segment_is_taken_over_after_its_lease(admin_client):
    """The dead worker's transaction is rolled back by the database, but its lease
    is left on the row: after it expires another worker resumes the run and the
    recovery is recorded, and shown on the run's page."""
    env = {"KUMIFLOW_LEASE_SECONDS": "2"}
    with transaction.atomic():
        for i in range(3):
            append_event(f"slow-{i}", "tally.requested", {"sleep": 1.0})
    first = spawn(
        "kumiflow_worker", "--no-cron", "--no-dispatch", "--max-interval", "0.2", "-v", "0", env=env
    )
    try:
        wait_for(lambda: WorkflowRun.objects.exclude(lease_owner="").exists(), 60, "a leased run")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    # The dead worker leased the runs it had taken on (a few at a time), and was
    # in the middle of one of them; its transaction was rolled back.
    stalled = list(WorkflowRun.objects.exclude(lease_owner=""))
    assert stalled and all(run.status == RunStatus.PENDING for run in stalled)

    second = spawn(
        "kumiflow_worker", "--no-cron", "--no-dispatch", "--max-interval", "0.2", "-v", "0", env=env
    )
    try:
        wait_for(
            lambda: not WorkflowRun.objects.exclude(status=RunStatus.COMPLETED).exists(),
            60,
            "every run to complete",
        )
    finally:
        codes = stop([second])
    assert codes == [0], output(second)[-2000:]

    for run in stalled:
        run.refresh_from_db()
        assert (run.recoveries, run.lease_owner) == (1, "")
        resumed = Event.objects.get(stream_id=str(run.id), type="kumiflow.workflow.step.resumed")
        assert resumed.payload["recovered"]["from"], "names the worker that died"
    assert max(Tally.objects.values_list("count", flat=True)) == 1
    page = admin_client.get(reverse("admin:kumiflow_workflowrun_change", args=[stalled[0].pk]))
    assert "1 (resumed by another worker after a lease ran out)" in page.content.decode()


def listening() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN kumiflow%%'")
        return bool(cursor.fetchone()[0])


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_postgresql_notifications_wake_a_sleeping_worker():
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    worker = spawn("kumiflow_resume", "--max-interval", "60", "-v", "2")
    try:
        # It listens, polled, found nothing, and sleeps for up to a minute.
        wait_for(listening, 60, "the worker's LISTEN connection")
        wait_for(lambda: "resume loop: idle" in output(worker), 60, "the worker to fall asleep")
        append_event("nudge", "tally.requested", {})
        wait_for(
            lambda: WorkflowRun.objects.filter(status=RunStatus.COMPLETED).exists(),
            20,
            "the notified worker to run the new work well before its next poll",
        )
    finally:
        stop([worker])


@pytest.mark.skipif(django.VERSION >= (6, 0), reason="django.tasks exists")
def test_the_tasks_setting_needs_django_tasks():
    with override_settings(KUMIFLOW_TASKS_BACKEND="default"):
        assert [m.id for m in check_settings()] == ["kumiflow.E014"]


@pytest.mark.django_db(transaction=True)
def test_a_second_signal_exits_at_once_while_a_step_is_busy():
    """The first SIGINT asks the loops to finish the segment at hand; the second
    ends the process at once (status 1), although a loop thread is busy in a
    30-second step. The database rolls the segment back; nothing is lost."""
    with transaction.atomic():
        append_event("slow-1", "tally.requested", {"sleep": 30})
    worker = spawn("kumiflow_worker", "--no-cron", "--no-dispatch", "--max-interval", "0.2")
    try:
        wait_for(lambda: WorkflowRun.objects.exclude(lease_owner="").exists(), 60, "a busy segment")
        worker.send_signal(signal.SIGINT)
        wait_for(lambda: "signal again to force" in output(worker), 30, "the first signal")
        worker.send_signal(signal.SIGINT)
        code = worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert code == 1, output(worker)[-2000:]
    assert "second signal: exiting now" in output(worker)
    run = WorkflowRun.objects.get()
    assert run.status == RunStatus.PENDING, "the busy segment was rolled back"
