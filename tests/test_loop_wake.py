"""Timers on time: a loop sleeps until the earliest wake time it knows, and
learns of an earlier one without a poll (in this process; from another one
through PostgreSQL's NOTIFY, whose payload carries the time; elsewhere
within its bounded poll)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from kumiflow_django import define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus, WorkflowRun
from kumiflow_django.store import clock, wakeups
from kumiflow_django.workers.listener import PgListener
from kumiflow_django.workers.loop import Loop
from kumiflow_django.workers.resume import ResumeLoop
from tests.processes import wait_for


class Sleeper(Loop):
    """A loop whose database always answers the same next due time."""

    name = "sleeper"
    kinds = ("resume",)

    def __init__(self, due: datetime | None, *, max_interval: float) -> None:
        super().__init__(max_interval=max_interval)
        self.due = due

    def run_once(self) -> int:
        return 0

    def next_due(self) -> datetime | None:
        return self.due


class Counting(ResumeLoop):
    """The resume loop, counting its passes; ``sleeping`` is set as it first idles."""

    def __init__(self, **kwargs: float) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.passes = 0
        self.sleeping = threading.Event()

    def run_once(self) -> int:
        self.passes += 1
        return super().run_once()

    def idle(self, seconds: float) -> None:
        self.sleeping.set()
        super().idle(seconds)


def test_the_sleep_ends_at_the_earliest_announced_wake_time(clock):
    loop = Sleeper(clock.now() + timedelta(seconds=60), max_interval=100)
    loop.poll()
    assert loop.sleep_seconds() == 60
    loop.notify("resume", clock.now() + timedelta(seconds=5))
    assert loop.sleep_seconds() == 5, "an earlier timer shortens the sleep"
    loop.notify("resume", clock.now() + timedelta(seconds=10))
    assert loop.sleep_seconds() == 5, "a later one does not lengthen it again"
    loop.notify("dispatch", clock.now() + timedelta(seconds=1))
    assert loop.sleep_seconds() == 5, "another loop's work is not this loop's"
    loop.poll()  # a new batch reads the database: what was announced is in it
    assert loop.sleep_seconds() == 60


def test_the_sleep_never_passes_the_databases_next_due_time_nor_max_interval(clock):
    loop = Sleeper(clock.now() + timedelta(seconds=3), max_interval=100)
    loop.notify("resume", clock.now() + timedelta(seconds=50))
    assert loop.sleep_seconds() == 3
    loop.due = clock.now() - timedelta(seconds=1)
    assert loop.sleep_seconds() == 0, "overdue: no sleep at all"
    loop.due = None
    assert Sleeper(None, max_interval=7).sleep_seconds() == 7


def _idle_in_thread(loop: Loop, seconds: float) -> tuple[threading.Thread, list[float]]:
    took: list[float] = []

    def idle() -> None:
        began = time.monotonic()
        loop.idle(seconds)
        took.append(time.monotonic() - began)

    thread = threading.Thread(target=idle)
    thread.start()
    return thread, took


def test_an_earlier_timer_announced_during_the_sleep_ends_it_at_that_time():
    loop = Sleeper(None, max_interval=60)
    thread, took = _idle_in_thread(loop, 60)
    # Before or after the wait began, either way: the sleep ends at the timer.
    loop.notify("resume", clock.now() + timedelta(seconds=0.2))
    thread.join(20)
    assert not thread.is_alive(), "slept on past the announced wake time"
    assert took[0] >= 0.2 - 0.01, "woke before the announced time: a poll for nothing"


def test_work_due_now_ends_the_sleep_at_once_and_a_later_timer_does_not():
    loop = Sleeper(None, max_interval=60)
    loop.notify("resume", clock.now() + timedelta(seconds=3600))
    thread, took = _idle_in_thread(loop, 0.3)
    thread.join(20)
    assert took[0] >= 0.3 - 0.01, "a timer after the sleep's end does not end it"
    thread, took = _idle_in_thread(loop, 60)
    loop.notify("resume", None)
    thread.join(20)
    assert not thread.is_alive()


def test_the_notification_payload_carries_the_wake_time():
    at = datetime(2026, 12, 2, 5, 30, 0, 250000, tzinfo=UTC)
    assert wakeups.payload("resume", at) == "resume@2026-12-02T05:30:00.250000+00:00"
    assert wakeups.parse(wakeups.payload("resume", at)) == ("resume", at)
    assert wakeups.parse("resume") == ("resume", None)
    # What does not parse is work due now: a spurious poll, never a lost wake-up.
    assert wakeups.parse("resume@tomorrow") == ("resume", None)
    assert wakeups.parse("resume@2026-12-02T05:30:00") == ("resume", None)


def _sleeping_loop(max_interval: float) -> tuple[Counting, threading.Thread]:
    define_workflow("later", steps=[s.wait("PT1H"), s.return_("later")])
    start_workflow("later")  # the loop's next known wake time: in an hour
    loop = Counting(max_interval=max_interval)
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    assert loop.sleeping.wait(30), "the loop polled once and went to sleep"
    return loop, thread


def _done(name: str) -> bool:
    return WorkflowRun.objects.filter(workflow=name, status=RunStatus.COMPLETED).exists()


@pytest.mark.django_db(transaction=True)
def test_a_timer_committed_here_shortens_the_loops_sleep_without_a_poll(registry):
    """The loop sleeps for a minute (its next known run is due in an hour); a
    run committed in this process with a timer in 0.5 s is resumed at its
    time by the loop's second pass: no pass in between to learn of it."""
    define_workflow("soon", steps=[s.wait("PT0.5S"), s.return_("soon")])
    loop, thread = _sleeping_loop(max_interval=60)
    try:
        start_workflow("soon")
        wait_for(lambda: _done("soon"), 20, "the earlier timer's run, well before the next poll")
        assert loop.passes == 2, "one pass before the timer, one at it"
    finally:
        loop.stop()
        thread.join(30)


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_timer_notified_by_another_connection_shortens_the_sleep(registry):
    """PostgreSQL: another connection makes a run due in 0.5 s and notifies it
    as a committing process does; the loop, asleep for a minute, learns of it
    through its listener and resumes the run at its time, with no pass between."""
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    import psycopg

    from kumiflow_django.workers.listener import listen_params

    listener = PgListener()
    listener.start()
    try:
        assert listener.listening.wait(30), "the listener listens"
        define_workflow("soon", steps=[s.wait("PT1H"), s.return_("soon")])
        soon = start_workflow("soon")  # due in an hour, like the one the loop sleeps for
        loop, thread = _sleeping_loop(max_interval=60)
        try:
            when = clock.now() + timedelta(seconds=0.5)
            with psycopg.connect(**listen_params()) as other, other.transaction():
                other.execute(
                    "UPDATE kumiflow_workflowrun SET wake_at = %s WHERE id = %s", [when, soon.id]
                )
                other.execute(
                    "SELECT pg_notify(%s, %s)",
                    [wakeups.CHANNEL, wakeups.payload(wakeups.WorkKind.RESUME, when)],
                )
            wait_for(lambda: _done("soon"), 20, "the notified timer's run, before the next poll")
            assert loop.passes == 2, "one pass before the timer, one at it"
        finally:
            loop.stop()
            thread.join(30)
    finally:
        listener.stop()
        listener.join(30)


@pytest.mark.django_db(transaction=True)
def test_without_notifications_an_earlier_timer_is_found_within_the_poll(registry):
    """SQLite and MariaDB have no NOTIFY: a run another connection makes due
    earlier, announcing nothing, is found by the next poll, ``max_interval``
    at most after the loop fell asleep (the bound of those databases)."""
    loop, thread = _sleeping_loop(max_interval=0.5)
    try:
        define_workflow("quiet", steps=[s.wait("PT1H"), s.return_("quiet")])
        quiet = start_workflow("quiet")  # due in an hour, after the loop's sleep
        WorkflowRun.objects.filter(pk=quiet.id).update(wake_at=clock.now())
        wait_for(lambda: _done("quiet"), 20, "the poll to find the earlier run")
    finally:
        loop.stop()
        thread.join(30)
