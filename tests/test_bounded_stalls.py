"""Bounded stalls: the engine's own transactions wait for locks and run
statements for a bounded time, and the checks say when the connection does not
notice a dead peer (a worker host cut off mid-transaction)."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, connections
from django.test import override_settings

from kumiflow_django.store import db


def ids(messages):
    return [m.id for m in messages]


def test_the_bounds_default_to_the_lease_and_zero_leaves_the_server_s():
    with override_settings(KUMIFLOW_LEASE_SECONDS=7.5):
        assert db.wait_bounds() == {
            "lock_timeout": 3750,  # below the statement's: a lock wait is a lock timeout
            "statement_timeout": 7500,
            "idle_in_transaction_session_timeout": 7500,
        }
    with override_settings(KUMIFLOW_LOCK_TIMEOUT=0.25, KUMIFLOW_STATEMENT_TIMEOUT=0):
        bounds = db.wait_bounds()
    assert bounds["lock_timeout"] == 250 and bounds["statement_timeout"] == 0


@pytest.mark.parametrize(
    ("options", "missing"),
    [
        ({}, ["keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout"]),
        (
            {"keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3},
            ["tcp_user_timeout"],
        ),
        (
            {
                "keepalives": 0,
                "keepalives_idle": 10,
                "keepalives_interval": 5,
                "keepalives_count": 3,
                "tcp_user_timeout": 1,
            },
            ["keepalives"],
        ),
        (
            {
                "keepalives_idle": 10,
                "keepalives_interval": 5,
                "keepalives_count": 3,
                "tcp_user_timeout": 1,
            },
            [],
        ),
    ],
)
def test_a_connection_without_keepalives_or_a_user_timeout_is_a_warning(options, missing):
    from kumiflow_django.checks import stall_warnings

    databases = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"},
        "flows": {"ENGINE": "django.db.backends.postgresql", "NAME": "x", "OPTIONS": options},
    }
    messages = stall_warnings(databases, "flows")
    assert ids(messages) == (["kumiflow.W060"] if missing else [])
    for name in missing:
        assert name in messages[0].msg
    assert stall_warnings(databases, "default") == []  # SQLite: no network


def test_unbounded_lock_or_statement_timeouts_are_a_warning_and_wrong_values_errors():
    from kumiflow_django.checks import check_settings, stall_warnings

    databases = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "x",
            "OPTIONS": {
                "keepalives_idle": 10,
                "keepalives_interval": 5,
                "keepalives_count": 3,
                "tcp_user_timeout": 1,
            },
        }
    }
    assert stall_warnings(databases, "default") == []
    with override_settings(KUMIFLOW_LOCK_TIMEOUT=0):
        messages = stall_warnings(databases, "default")
    assert ids(messages) == ["kumiflow.W061"] and "KUMIFLOW_LOCK_TIMEOUT" in messages[0].msg
    with override_settings(KUMIFLOW_LOCK_TIMEOUT=-1, KUMIFLOW_STATEMENT_TIMEOUT="5"):
        found = ids(check_settings())
    assert "kumiflow.E060" in found and "kumiflow.E061" in found


@pytest.mark.parametrize(
    ("number", "sqlstate", "transient"),
    [(1205, "HY000", True), (4031, "HY000", True), (1927, "70100", True), (1062, "23000", False)],
)
def test_a_mysql_error_is_told_by_its_number_whatever_its_sqlstate(number, sqlstate, transient):
    """PyMySQL gives the server's SQLSTATE too: a lock wait timeout's is the
    generic HY000, which once made it a refusal instead of a transient error."""
    pymysql = pytest.importorskip("pymysql")
    try:
        try:
            raise pymysql.err.OperationalError(number, "from the server", sqlstate=sqlstate)
        except pymysql.err.OperationalError as cause:
            raise OperationalError(*cause.args) from cause
    except OperationalError as error:
        assert db.is_transient(error) is transient


def _setting(cursor, name):
    cursor.execute("SELECT current_setting(%s)", [name])
    return cursor.fetchone()[0]


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_the_bounds_hold_in_the_engine_s_own_transactions_only():
    connection = db.connection()
    if connection.vendor != "postgresql":
        pytest.skip("per-transaction limits are PostgreSQL's (MariaDB's are the workers' sessions)")
    with override_settings(KUMIFLOW_LOCK_TIMEOUT=1.5, KUMIFLOW_STATEMENT_TIMEOUT=2.5):
        with connection.cursor() as cursor:
            before = _setting(cursor, "lock_timeout")
        with db.atomic(), connection.cursor() as cursor:
            assert _setting(cursor, "lock_timeout") == "1500ms"
            assert _setting(cursor, "statement_timeout") == "2500ms"
            with db.atomic():  # a savepoint inside: the same limits
                assert _setting(cursor, "lock_timeout") == "1500ms"
        with connection.cursor() as cursor:
            assert _setting(cursor, "lock_timeout") == before  # SET LOCAL: gone at the commit
        # the caller's transaction keeps its own settings
        from django.db import transaction

        with transaction.atomic(using=db.alias()), db.atomic(), connection.cursor() as cursor:
            assert _setting(cursor, "lock_timeout") == before


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_an_engine_transaction_waits_for_a_held_lock_no_longer_than_the_lock_timeout():
    """A lock held by a worker that is gone (here: a second connection that
    never lets go) fails the waiter after KUMIFLOW_LOCK_TIMEOUT, as a transient
    error the loops try again, instead of queueing every run behind it."""
    from testproject.shop.models import Tally

    row = Tally.objects.create(key="held")
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        other = connections.create_connection(db.alias())
        try:
            with other.cursor() as cursor:
                other.set_autocommit(False)
                if other.vendor == "mysql":
                    cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
                cursor.execute("SELECT id FROM shop_tally WHERE id = %s FOR UPDATE", [row.pk])
                holding.set()
                done.wait(10)  # a safety bound: the waiter below ends first
                other.rollback()
        finally:
            other.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(30)
        connection = db.connection()
        if connection.vendor == "mysql":
            from kumiflow_django.workers.loop import limit_idle_transactions

            if not getattr(connection, "mysql_is_mariadb", False):
                pytest.skip("the workers' session limits are MariaDB's")
            connection.close()  # the next connection gets the workers' session limits
            from django.db.backends.signals import connection_created

            with override_settings(KUMIFLOW_LOCK_TIMEOUT=1):
                limit_idle_transactions(60)
                try:
                    with pytest.raises(OperationalError) as raised, db.atomic():
                        list(db.for_update(Tally.objects.filter(pk=row.pk)))
                finally:
                    connection_created.disconnect(dispatch_uid="kumiflow-idle-transactions")
        else:
            with (
                override_settings(KUMIFLOW_LOCK_TIMEOUT=0.2),
                pytest.raises(OperationalError) as raised,
                db.atomic(),
            ):
                list(db.for_update(Tally.objects.filter(pk=row.pk)))
        assert not done.is_set()  # refused while the lock was still held
        assert db.is_transient(raised.value)
    finally:
        done.set()
        holder.join(30)
