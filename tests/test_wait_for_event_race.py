"""The append/suspend race: a run that begins waiting while its event is being
appended in another transaction is still woken, whichever commits first."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections, transaction

from kumiflow_django import append_event, define_workflow, event_appended, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus, WorkflowRun

pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def waiter(registry):
    define_workflow(
        "waiter",
        steps=[
            s.wait_for_event("ping", match={"payload.key": lambda ctx: ctx.event.payload["key"]}),
            s.return_("woken"),
        ],
    )


def in_thread(fn):
    errors = []

    def run():
        try:
            fn()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_the_run_suspends_and_commits_while_the_append_is_still_open(waiter):
    """The appender's in-transaction search runs before the run waits, and it
    commits after the run's own after-commit look-back: its after-commit check wakes it."""
    inserted = threading.Event()

    def hold(sender, event, **kwargs):
        if event.type == "ping":
            inserted.set()
            time.sleep(1.0)  # after the waiter search, before the commit

    event_appended.connect(hold, dispatch_uid="race-hold-append")
    try:
        appender, errors = in_thread(lambda: append_event("p", "ping", {"key": 1}))
        assert inserted.wait(10)
        run = start_workflow("waiter", payload={"key": 1})  # commits while the append is open
        assert run.status == RunStatus.WAITING_EVENT
        appender.join(20)
    finally:
        event_appended.disconnect(dispatch_uid="race-hold-append")
    assert not errors
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, "woken")


def test_the_append_commits_while_the_suspension_is_still_open(waiter):
    """The run looked back before the event existed and commits after the
    append's checks: its own after-commit look-back wakes it."""
    suspended = threading.Event()
    run_ids = []

    def suspend_slowly():
        with transaction.atomic():
            run_ids.append(start_workflow("waiter", payload={"key": 2}).id)
            suspended.set()
            time.sleep(1.0)  # the append happens and commits meanwhile

    starter, errors = in_thread(suspend_slowly)
    assert suspended.wait(10)
    append_event("p", "ping", {"key": 2})
    starter.join(20)
    assert not errors
    run = WorkflowRun.objects.get(pk=run_ids[0])
    assert (run.status, run.result) == (RunStatus.COMPLETED, "woken")
