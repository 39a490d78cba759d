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
