"""Notifications across processes, and what a worker does without them.

On PostgreSQL a worker LISTENs; behind a transaction-pooling PgBouncer it
cannot, finds out with a probe, says so once and polls. SQLite and MariaDB
have no notifications: their workers always find another process's work by
polling. The PgBouncer here is a real one (tests/pgbouncer.py).
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from django.db import connection

from kumiflow_django import append_event
from kumiflow_django.models import RunStatus, WorkflowRun
from kumiflow_django.workers.listener import listen_params, notifications_arrive
from tests.pgbouncer import pgbouncer
from tests.processes import database_url, output, spawn, stop, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def needs_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")


def pooled_url(port: int) -> str:
    """The test database through the pooler; Django's server-side cursors
    (``iterator()``) cannot work with transaction pooling, as Django documents."""
    direct = database_url()
    host, _, rest = direct.rpartition("@")[2].partition("/")
    return direct.replace(f"@{host}/", f"@127.0.0.1:{port}/") + "?disable_server_side_cursors=true"


def params(port: int | None = None) -> dict[str, Any]:
    p = listen_params()
    if port is not None:
        p["port"] = port
    return p


def completed() -> bool:
    return WorkflowRun.objects.filter(status=RunStatus.COMPLETED).exists()


def test_the_probe_tells_whether_notifications_arrive():
    needs_postgresql()
    import psycopg

    with psycopg.connect(**params(), autocommit=True) as conn:
        assert notifications_arrive(conn, params())
    with pgbouncer("session") as port, psycopg.connect(**params(port), autocommit=True) as conn:
        assert notifications_arrive(conn, params(port))
    with pgbouncer("transaction") as port, psycopg.connect(**params(port), autocommit=True) as conn:
        assert not notifications_arrive(conn, params(port), timeout=2.0)


def test_a_worker_without_notifications_finds_work_by_polling():
    """PostgreSQL behind transaction pooling, SQLite and MariaDB alike: the
    work another process commits is found by the next poll."""
    postgresql = connection.vendor == "postgresql"
    with contextlib.ExitStack() as stack:
        env = {}
        if postgresql:
            env["DATABASE_URL"] = pooled_url(stack.enter_context(pgbouncer("transaction")))
        worker = spawn(
            "kumiflow_resume", "--skip-checks", "--max-interval", "0.5", "-v", "2", env=env
        )
        try:
            wait_for(lambda: "resume loop: idle" in output(worker), 60, "the worker to poll")
            if postgresql:
                wait_for(
                    lambda: "notifications do not reach" in output(worker),
                    30,
                    "the probe's verdict",
                )
            append_event("nudge", "tally.requested", {})
            wait_for(completed, 30, "the worker to find the work by polling")
        finally:
            codes = stop([worker])
    text = output(worker)
    assert codes == [0], text[-2000:]
    assert "notified:" not in text
    assert "LISTEN connection:" not in text, "no retrying a LISTEN that cannot work"
    if postgresql:
        assert text.count("notifications do not reach") == 1
        assert "listening for notifications" not in text


def test_the_listener_can_reach_postgresql_past_the_pooler():
    """KUMIFLOW_LISTEN_DATABASE: the loops go through transaction pooling, the
    one LISTEN connection does not, and a sleeping worker is woken at once."""
    needs_postgresql()
    with pgbouncer("transaction") as port:
        env = {"DATABASE_URL": pooled_url(port), "LISTEN_DATABASE_URL": database_url()}
        worker = spawn(
            "kumiflow_resume", "--skip-checks", "--max-interval", "60", "-v", "2", env=env
        )
        try:
            wait_for(
                lambda: "listening for notifications" in output(worker), 30, "the LISTEN connection"
            )
            wait_for(lambda: "resume loop: idle" in output(worker), 60, "the worker to fall asleep")
            append_event("nudge", "tally.requested", {})
            wait_for(
                completed, 20, "the notified worker to run the new work well before its next poll"
            )
        finally:
            codes = stop([worker])
    text = output(worker)
    assert codes == [0], text[-2000:]
    assert "notified: resume" in text
