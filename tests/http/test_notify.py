"""notify_run_changed: one PostgreSQL notification per run and committed transaction."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test import override_settings

from kumiflow_django import start_workflow
from kumiflow_django.http import sse
from kumiflow_django.http.notify import CHANNEL, notify_run_changed

postgres = pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")


@pytest.fixture
def listener(db):
    import psycopg

    params = sse.listen_params("default")
    assert params is not None
    conn = psycopg.Connection.connect(autocommit=True, **params)
    conn.execute(f"LISTEN {CHANNEL}")
    yield conn
    conn.close()


def received(listener) -> list[str]:
    """The run ids notified so far: a marker notified now arrives after all of them
    (notifications arrive in commit order), so nothing is waited for by the clock."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, 'marker')", [CHANNEL])
    got: list[str] = []
    for note in listener.notifies(timeout=10):
        if note.payload == "marker":
            return got
        got.append(note.payload)
    raise AssertionError("the marker never arrived")


@postgres
@pytest.mark.django_db(transaction=True)
def test_a_segment_of_several_events_notifies_its_run_once(listener, approval):
    with transaction.atomic():
        run = start_workflow("approval", payload={"order": "o-1"})  # run-started, waiting
        other = start_workflow("approval", payload={"order": "o-2"})
    assert run.version == 2
    assert received(listener) == [str(run.id), str(other.id)]


@postgres
@pytest.mark.django_db(transaction=True)
def test_nothing_is_sent_for_a_rolled_back_transaction_and_the_next_one_is_not_lost(listener):
    with pytest.raises(RuntimeError), transaction.atomic():
        notify_run_changed("run-a")
        raise RuntimeError("rolled back")
    assert received(listener) == []
    with transaction.atomic():
        notify_run_changed("run-a")
    assert received(listener) == ["run-a"]


@postgres
@pytest.mark.django_db(transaction=True)
def test_a_notification_dropped_with_a_savepoint_is_registered_again(listener):
    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint: its on-commit callbacks go with it
                notify_run_changed("run-a")
                raise RuntimeError("segment failed")
        except RuntimeError:
            pass
        notify_run_changed("run-a")  # the failure is recorded: the run changed after all
        notify_run_changed("run-b")
    assert received(listener) == ["run-a", "run-b"]


@postgres
@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_the_notification_is_sent_at_once(listener):
    notify_run_changed("run-a")
    notify_run_changed("run-a")
    assert received(listener) == ["run-a", "run-a"]


def test_other_databases_register_nothing(db, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        notify_run_changed("run-a")
        notify_run_changed("run-a")
    assert len(callbacks) == (2 if connection.vendor == "postgresql" else 0)  # one sends


def test_without_listening_streams_nothing_is_announced(db, django_capture_on_commit_callbacks):
    with (
        override_settings(KUMIFLOW_SSE_LISTEN=False),
        django_capture_on_commit_callbacks() as callbacks,
    ):
        notify_run_changed("run-a")
    assert callbacks == []


@postgres
@pytest.mark.django_db(transaction=True)
def test_a_transaction_that_changed_many_runs_notifies_them_in_one_statement(listener):
    from django.test.utils import CaptureQueriesContext

    runs = [f"run-{i}" for i in range(100)]
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        for run_id in runs:
            notify_run_changed(run_id)
            notify_run_changed(run_id)
    sent = [q["sql"] for q in queries.captured_queries if "pg_notify" in q["sql"]]
    assert len(sent) == 1, sent  # a fan-out of a thousand children is one round trip
    assert received(listener) == runs


@postgres
@pytest.mark.django_db(transaction=True)
def test_the_work_a_segment_leaves_is_notified_in_the_same_statement_as_its_run(listener, registry):
    """A segment that leaves a timer tells the other processes' loops in the
    statement that announces its run: one round trip after the commit, not two."""
    from django.test.utils import CaptureQueriesContext

    from kumiflow_django import define_workflow
    from kumiflow_django import steps as s
    from kumiflow_django.store import wakeups

    listener.execute(f"LISTEN {wakeups.CHANNEL}")
    define_workflow("soon", steps=[s.wait("PT0.5S"), s.return_("soon")])
    with CaptureQueriesContext(connection) as queries:
        run = start_workflow("soon")
    sent = [q["sql"] for q in queries.captured_queries if "pg_notify" in q["sql"]]
    assert len(sent) == 1, sent
    notes = received_on(listener, {CHANNEL, wakeups.CHANNEL})
    assert (CHANNEL, str(run.id)) in notes
    [(kind, when)] = [wakeups.parse(p) for c, p in notes if c == wakeups.CHANNEL]
    assert kind == "resume" and when is not None and when > run.started_at


def received_on(listener, channels: set[str]) -> list[tuple[str, str]]:
    """(channel, payload) of every notification so far on ``channels``, up to a marker."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, 'marker')", [CHANNEL])
    got: list[tuple[str, str]] = []
    for note in listener.notifies(timeout=10):
        if note.payload == "marker":
            return got
        if note.channel in channels:
            got.append((note.channel, note.payload))
    raise AssertionError("the marker never arrived")


@postgres
@pytest.mark.django_db(transaction=True)
def test_work_of_a_rolled_back_transaction_is_not_notified(listener):
    from kumiflow_django.store import wakeups

    listener.execute(f"LISTEN {wakeups.CHANNEL}")
    with pytest.raises(RuntimeError), transaction.atomic():
        wakeups.work_committed(wakeups.WorkKind.TASK)
        raise RuntimeError("rolled back")
    assert received_on(listener, {wakeups.CHANNEL}) == []
    wakeups.work_committed(wakeups.WorkKind.TASK)  # outside a transaction: at once
    assert received_on(listener, {wakeups.CHANNEL}) == [(wakeups.CHANNEL, "task")]


@postgres
@pytest.mark.django_db(transaction=True)
def test_which_timers_other_processes_are_told_of_is_decided_at_the_commit(listener, clock):
    """Timers due within ``KUMIFLOW_MAX_INTERVAL`` of the commit are notified
    (a later one is read by the other processes' next poll, before it is
    due): a long transaction does not make a timer look further away than it is."""
    from datetime import timedelta

    from kumiflow_django.conf import settings
    from kumiflow_django.store import wakeups

    listener.execute(f"LISTEN {wakeups.CHANNEL}")
    interval = timedelta(seconds=settings.MAX_INTERVAL)
    with transaction.atomic():
        soon = clock.now() + interval + timedelta(seconds=1)
        far = clock.now() + 3 * interval
        wakeups.work_committed(wakeups.WorkKind.RESUME, soon)
        wakeups.work_committed(wakeups.WorkKind.RESUME, far)
        clock.advance(seconds=2)  # the transaction takes its time
    assert received_on(listener, {wakeups.CHANNEL}) == [
        (wakeups.CHANNEL, wakeups.payload(wakeups.WorkKind.RESUME, soon))
    ]


@postgres
@pytest.mark.django_db(transaction=True)
def test_a_timer_too_far_away_to_notify_costs_no_statement(clock):
    """Without a changed run to announce (``KUMIFLOW_SSE_LISTEN`` off, or no
    live streams mounted: a worker's default), a timer beyond
    ``KUMIFLOW_MAX_INTERVAL`` sends nothing, in a transaction or not."""
    from datetime import timedelta

    from django.test.utils import CaptureQueriesContext

    from kumiflow_django.conf import settings
    from kumiflow_django.store import wakeups

    far = clock.now() + timedelta(seconds=3 * settings.MAX_INTERVAL)
    with CaptureQueriesContext(connection) as queries:
        with transaction.atomic():
            wakeups.work_committed(wakeups.WorkKind.RESUME, far)
        wakeups.work_committed(wakeups.WorkKind.RESUME, far)
    assert [q["sql"] for q in queries.captured_queries if "pg_notify" in q["sql"]] == []


@postgres
@pytest.mark.django_db(transaction=True)
def test_work_after_a_rolled_back_savepoint_is_sent(listener):
    """A savepoint's rollback (a lost version clash) loses nothing the
    transaction announced before or after it; what it announced inside may
    still reach other processes (a spurious wake-up, see ``work_committed``)."""
    from kumiflow_django.store import wakeups

    listener.execute(f"LISTEN {wakeups.CHANNEL}")
    with transaction.atomic():
        wakeups.work_committed(wakeups.WorkKind.DISPATCH)
        with pytest.raises(RuntimeError), transaction.atomic():
            wakeups.work_committed(wakeups.WorkKind.TASK)
            raise RuntimeError("clash: rolled back to the savepoint")
        wakeups.work_committed(wakeups.WorkKind.CRON)
    got = received_on(listener, {wakeups.CHANNEL})
    assert (wakeups.CHANNEL, "dispatch") in got and (wakeups.CHANNEL, "cron") in got


@postgres
@pytest.mark.django_db(transaction=True)
def test_a_wake_time_that_does_not_compare_is_work_due_now_and_loses_nothing(listener):
    """One bad item (a naive wake time) is a spurious wake-up: the
    transaction's other notifications still go, in the same statement."""
    from datetime import datetime

    from kumiflow_django.store import wakeups

    listener.execute(f"LISTEN {wakeups.CHANNEL}")
    with transaction.atomic():
        wakeups.work_committed(wakeups.WorkKind.RESUME, datetime(2026, 12, 3, 12, 0))  # naive
        notify_run_changed("run-a")
    got = received_on(listener, {CHANNEL, wakeups.CHANNEL})
    assert sorted(got) == [(CHANNEL, "run-a"), (wakeups.CHANNEL, "resume")]
