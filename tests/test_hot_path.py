"""What the start's hot path does once instead of each time must never serve
a stale or differently adapted value: the kept settings, the plain-SQL head
read of a stream, the values the hot INSERTs pass through unadapted."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from kumiflow_django import append_event, define_workflow, on_event
from kumiflow_django import steps as s
from kumiflow_django.conf import settings
from kumiflow_django.models import Event, WorkflowRun
from kumiflow_django.store import db
from kumiflow_django.store import sql as rowsql
from kumiflow_django.store.log import _head

pytestmark = pytest.mark.django_db


def test_a_kept_setting_follows_override_settings_in_and_out():
    assert settings.MAX_START_DEPTH == 8  # read, and kept
    with override_settings(KUMIFLOW_MAX_START_DEPTH=3):
        assert settings.MAX_START_DEPTH == 3
        with override_settings(KUMIFLOW_MAX_START_DEPTH=2):
            assert settings.MAX_START_DEPTH == 2
        assert settings.MAX_START_DEPTH == 3
    assert settings.MAX_START_DEPTH == 8


def test_a_kept_setting_follows_the_settings_fixture(settings_fixture):
    assert settings.DEFAULT_TENANT == "default"
    settings_fixture.KUMIFLOW_DEFAULT_TENANT = "acme"
    assert settings.DEFAULT_TENANT == "acme"
    settings_fixture.KUMIFLOW_DEFAULT_TENANT = "beta"
    assert settings.DEFAULT_TENANT == "beta"
    # (``del settings.KUMIFLOW_X`` sends no setting_changed: see kumiflow_django.conf)


def test_a_value_read_before_a_change_is_not_kept_after_it(monkeypatch):
    """A thread (a worker's loop in a test) that read a setting just before
    ``override_settings`` changed it must not keep that old value past the
    change: the override would be hidden, and the old value outlive it."""
    from kumiflow_django import conf

    read, changed = threading.Event(), threading.Event()
    real = django_settings

    class Paused:
        """Django's settings, pausing the first read between it and its keeping."""

        def __getattr__(self, name: str) -> object:
            missing = object()
            value = getattr(real, name, missing)
            if not read.is_set():
                read.set()
                assert changed.wait(timeout=30)
            if value is missing:
                raise AttributeError(name)  # the default, then
            return value

    conf._read.clear()
    monkeypatch.setattr(conf, "django_settings", Paused())
    reader = threading.Thread(target=lambda: settings.MAX_START_DEPTH)
    reader.start()
    assert read.wait(timeout=30)  # it has read 8, and keeps it next
    with override_settings(KUMIFLOW_MAX_START_DEPTH=3):
        changed.set()
        reader.join(timeout=30)
        assert settings.MAX_START_DEPTH == 3
    assert settings.MAX_START_DEPTH == 8


@pytest.fixture
def settings_fixture(settings):
    """pytest-django's ``settings`` (the name is taken here by kumiflow's)."""
    return settings


def test_a_start_runs_on_the_setting_of_the_moment(registry):
    """A start reads the depth limit as it is now, not as the last start did."""
    define_workflow(
        "relay",
        trigger=on_event("relay.hop"),
        steps=[s.compute("hop", lambda ctx: append_event("relay", "relay.hop", {}).position)],
    )
    with transaction.atomic():
        append_event("relay", "relay.hop", {})
    deep = WorkflowRun.objects.filter(reason="start_depth_exceeded").count()
    assert deep == 1
    with override_settings(KUMIFLOW_MAX_START_DEPTH=2), transaction.atomic():
        append_event("relay", "relay.hop", {})
    runs = WorkflowRun.objects.filter(reason="start_depth_exceeded")
    assert runs.count() == 2
    # the second chain stopped two levels deep: 2 completed runs before the failure
    assert WorkflowRun.objects.count() == 8 + 1 + 2 + 1


def test_the_head_read_is_the_querysets_read():
    for i in range(1, 4):
        append_event("head", "thing.happened", {"i": i})
    append_event("head", "thing.happened", {"i": 1}, tenant="other")
    assert _head("head", "default") == (3, "")
    assert _head("head", "other") == (1, "")
    assert _head("nowhere", "default") == (0, "")
    orm = (
        Event.objects.filter(tenant_id="default", stream_id="head")
        .order_by("-version")
        .values_list("version", "stream_type")
        .first()
    )
    assert _head("head", "default") == orm


def test_the_retried_head_read_locks_where_the_database_can():
    append_event("locked-head", "thing.happened", {})
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        assert _head("locked-head", "default", lock=True) == (1, "")
    (read,) = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    assert read.endswith("FOR UPDATE") == connection.features.has_select_for_update


def _orm_params(obj, *, without_pk: bool):
    return [
        f.get_db_prep_save(f.pre_save(obj, True), connection)
        for f in obj._meta.concrete_fields
        if not (without_pk and f.primary_key)
    ]


def _inserted_params(model, objs, *, return_pk: bool) -> list:
    captured: list[list] = []

    def wrapper(execute, sql, params, many, context):
        if sql.startswith("INSERT"):
            captured.append(list(params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper), transaction.atomic():
        rowsql.insert(model, objs, using=db.alias(), return_pk=return_pk)
    (params,) = captured
    return params


def _typed(values: list) -> list:
    # A driver's JSON wrapper (psycopg's Jsonb) compares by identity: by what it wraps here.
    return [(type(v), getattr(v, "obj", v)) for v in values]


def test_the_insert_passes_values_as_the_fields_would_adapt_them(registry):
    """The params of the hot INSERTs are those each field's own
    ``get_db_prep_save`` gives, value for value and type for type (a str
    subclass such as a status, an int in a PostgreSQL integer, a bool)."""
    define_workflow("adapted", trigger=on_event("a.b"), steps=[s.compute("c", lambda ctx: 1)])
    append_event("adapted-1", "a.b", {"x": "y"}, metadata={"m": 1})
    run = WorkflowRun.objects.get(workflow="adapted")
    run.id, run.idempotency_key = uuid.uuid4(), None
    from kumiflow_django.models import RunStatus

    run.status = RunStatus.FAILED  # an enum member, not a plain str
    run.paused, run.priority, run.attempt = True, -5, 3
    expected = _orm_params(run, without_pk=False)
    assert _typed(_inserted_params(WorkflowRun, [run], return_pk=False)) == _typed(expected)

    events = list(Event.objects.filter(stream_id="adapted-1"))
    for event in events:
        event.pk, event.event_id, event.stream_id = None, uuid.uuid4(), "adapted-2"
    expected = [p for e in events for p in _orm_params(e, without_pk=True)]
    assert _typed(_inserted_params(Event, events, return_pk=True)) == _typed(expected)
    assert all(e.pk is not None for e in events)


@pytest.mark.parametrize(
    "value", [None, True, False, 0, 1, -1, 10**16 - 1, -(10**16) + 1, 10**16, -(10**16), 2**70]
)
def test_a_short_scalar_reads_back_as_the_full_check_would_give_it(value):
    import json

    from kumiflow_django.store.values import dump, to_json

    result = to_json(value, "v")
    assert result == json.loads(dump(value, "v"))
    assert type(result) is type(value)


def test_a_short_integer_still_meets_a_smaller_limit():
    from kumiflow_django.store.errors import InvalidEvent
    from kumiflow_django.store.values import to_json

    assert to_json(12345, "v", max_bytes=5) == 12345
    with pytest.raises(InvalidEvent, match="6 bytes of JSON, more than the limit of 5"):
        to_json(123456, "v", max_bytes=5)
    with override_settings(KUMIFLOW_MAX_VALUE_BYTES=3), pytest.raises(InvalidEvent):
        to_json(1234, "v")


@pytest.mark.parametrize(
    ("options", "warned"),
    [
        ({}, False),
        ({"prepare_threshold": None}, False),
        ({"prepare_threshold": 5}, True),
        ({"prepare_threshold": 5, "server_side_binding": False}, True),
        ({"prepare_threshold": 5, "server_side_binding": True}, False),
        ({"server_side_binding": True}, False),
    ],
)
def test_prepared_statements_asked_for_where_none_can_be_made_are_a_warning(options, warned):
    from kumiflow_django.checks import prepared_statement_warnings

    databases = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x", "OPTIONS": options},
        "flows": {"ENGINE": "django.db.backends.postgresql", "NAME": "x", "OPTIONS": options},
    }
    messages = prepared_statement_warnings(databases, "flows")
    assert [m.id for m in messages] == (["kumiflow.W062"] if warned else [])
    assert prepared_statement_warnings(databases, "default") == []  # PostgreSQL only


@pytest.mark.django_db(transaction=True)
def test_a_lock_by_key_outside_a_transaction_is_refused_as_the_orm_refuses_it():
    """In autocommit a ``FOR UPDATE`` would hold nothing: the built lock says
    so, as ``select_for_update()`` does, on the databases that lock rows."""
    key = [uuid.uuid4()]
    if not connection.features.has_select_for_update:
        assert rowsql.by_pk(WorkflowRun, key, lock=True) == []  # SQLite: no row lock, as the ORM
        return
    with pytest.raises(transaction.TransactionManagementError):
        list(WorkflowRun.objects.select_for_update().filter(pk__in=key))
    with pytest.raises(transaction.TransactionManagementError):
        rowsql.by_pk(WorkflowRun, key, lock=True)
    with pytest.raises(transaction.TransactionManagementError):
        rowsql.lock_by_pk(WorkflowRun, key)
    with transaction.atomic():
        assert rowsql.by_pk(WorkflowRun, key, lock=True) == []
        assert rowsql.lock_by_pk(WorkflowRun, key) == []


def test_the_built_delete_removes_the_rows_the_filter_names_in_one_statement(registry):
    """A run's waits are deleted by a statement built once: those of the run
    (its UUID adapted as the ORM adapts it), no other run's."""
    from kumiflow_django.models import RunWait

    define_workflow(
        "waiter",
        trigger=on_event("w.go"),
        steps=[
            s.wait_for_event("w.reply", match={"payload.k": lambda ctx: ctx.event.payload["k"]})
        ],
    )
    for k in (1, 2):
        append_event(f"go-{k}", "w.go", {"k": k})
    first, second = WorkflowRun.objects.order_by("started_at", "id")
    assert RunWait.objects.count() == 2
    with CaptureQueriesContext(connection) as queries:
        assert rowsql.delete(RunWait, using=db.alias(), run_id=first.id) == 1
    assert [q["sql"].split()[0] for q in queries.captured_queries] == ["DELETE"]
    assert list(RunWait.objects.values_list("run_id", flat=True)) == [second.id]
    assert rowsql.delete(RunWait, using=db.alias(), run_id=first.id) == 0
