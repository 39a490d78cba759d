"""The console's and the API's reads on a read replica; every write on the primary.

Here, on every database, the replica is an alias that mirrors the test
database: the router's choices are seen by which connection runs the queries.
tests/test_replica_standby.py does it again with a real streaming standby.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from kumiflow_django import cancel_run, define_workflow, replica_reads, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.checks import read_database_errors
from kumiflow_django.http.tokens import API_PERMISSIONS, create_token
from kumiflow_django.models import RunStatus, WorkflowRun
from kumiflow_django.routers import LAG_HEADER, SERVED_FROM_HEADER, ReplicaRouter, is_engine_model
from kumiflow_django.store import db

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "replica"])

API = "/api/kumiflow/"
MIDDLEWARE = [*django_settings.MIDDLEWARE, "kumiflow_django.routers.ReplicaReadsMiddleware"]
WRITES = ("INSERT", "UPDATE", "DELETE")
#: A write on PostgreSQL may be one statement of data-modifying ``WITH``
#: parts (``store.sql.write_together``, the append's head read).
_WITH_WRITE = re.compile(
    r"^\s*WITH\b.*\b(INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM)\b", re.I | re.S
)


@contextlib.contextmanager
def alias(name: str, config: dict[str, Any]) -> Iterator[None]:
    """``DATABASES[name]`` for the block: a mirror of the test database for
    the test runner (never created, never flushed)."""
    config = {**config, "TEST": {**config.get("TEST", {}), "MIRROR": "default"}}
    connections.settings[name] = config
    django_settings.DATABASES[name] = config
    try:
        yield
    finally:
        connections[name].close()
        del connections[name]
        connections.settings.pop(name, None)
        django_settings.DATABASES.pop(name, None)


@pytest.fixture(scope="module")
def replica(request, django_db_setup, django_db_blocker) -> Iterator[str]:
    """The alias "replica", the test database again (tests/test_replica_standby.py
    has a real standby)."""
    primary = copy.deepcopy(connections["default"].settings_dict)
    with alias("replica", primary):
        yield "mirror"


routed = override_settings(
    KUMIFLOW_READ_DATABASE="replica",
    DATABASE_ROUTERS=["kumiflow_django.routers.ReplicaRouter"],
    MIDDLEWARE=MIDDLEWARE,
)


@pytest.fixture
def waiter(registry):
    define_workflow("parcel", steps=[s.wait_for_event("parcel.delivered"), s.return_({})])


def queries(alias_name: str) -> CaptureQueriesContext:
    return CaptureQueriesContext(connections[alias_name])


def writes(captured: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].lstrip().upper().startswith(WRITES)
        or _WITH_WRITE.match(q["sql"])
        or "FOR UPDATE" in q["sql"].upper()
    ]


def engine_tables() -> set[str]:
    from django.apps import apps

    return {m._meta.db_table for m in apps.get_models() if is_engine_model(m)}


def engine_queries(captured: CaptureQueriesContext) -> list[str]:
    """The queries of ``captured`` that read or write kumiflow-django's tables."""
    tables = engine_tables()
    return [q["sql"] for q in captured.captured_queries if any(t in q["sql"] for t in tables)]


def staff_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("ops", password="pw"))
    return client


def api_client() -> Client:
    _, secret = create_token("replica-test", permissions=API_PERMISSIONS)
    return Client(HTTP_AUTHORIZATION=f"Bearer {secret}")


# -- the router, on every database --------------------------------------------


@routed
def test_only_marked_reads_outside_transactions_go_to_the_replica(replica, waiter):
    run = start_workflow("parcel")
    assert WorkflowRun.objects.all().db == "default"  # the engine's reads: the primary
    with replica_reads():
        with queries("replica") as on_replica, queries("default") as on_primary:
            assert WorkflowRun.objects.filter(pk=run.pk).count() == 1
        assert len(on_replica) == 1 and len(on_primary) == 0
        with db.atomic(), queries("replica") as on_replica:
            assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.WAITING_EVENT
            locked = db.for_update(WorkflowRun.objects.filter(pk=run.pk))
            assert list(locked) == [WorkflowRun.objects.get(pk=run.pk)]
        assert len(on_replica) == 0, "a transaction of the primary reads the primary"


@routed
def test_a_write_in_a_marked_block_goes_to_the_primary(replica, waiter):
    run = start_workflow("parcel")
    with replica_reads(), queries("replica") as on_replica, queries("default") as on_primary:
        read = WorkflowRun.objects.get(pk=run.pk)
        assert read._state.db == "replica"
        read.save(update_fields=["priority"])  # an instance read on the replica
        WorkflowRun.objects.filter(pk=run.pk).update(priority=3)  # a queryset of a marked block
        cancelled = cancel_run(run.pk, reason="replica test", by="tests")  # the engine
    assert writes(on_replica) == []
    assert len(writes(on_primary)) >= 3
    assert cancelled.status == RunStatus.CANCELLED
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.CANCELLED


def test_without_the_router_or_the_setting_nothing_moves(replica, waiter):
    start_workflow("parcel")
    with override_settings(KUMIFLOW_READ_DATABASE="replica"), replica_reads():
        assert WorkflowRun.objects.all().db == "default"  # no router: the primary
    with override_settings(DATABASE_ROUTERS=[ReplicaRouter()]), replica_reads():
        assert WorkflowRun.objects.all().db == "default"  # no replica named


@routed
def test_the_console_and_the_api_read_the_replica_and_act_on_the_primary(replica, waiter):
    run = start_workflow("parcel")
    staff, api = staff_client(), api_client()
    pages = [
        (staff, reverse("admin:kumiflow_workflowrun_changelist")),
        (staff, reverse("admin:kumiflow_workflowrun_change", args=[run.pk])),
        (staff, reverse("admin:kumiflow_overview")),  # its counts are raw SQL
        (api, f"{API}runs/"),
        (api, f"{API}runs/{run.pk}/"),
    ]
    for client, url in pages:
        with queries("replica") as on_replica, queries("default") as on_primary:
            response = client.get(url)
        assert engine_queries(on_primary) == [], url  # sessions, users, tokens only
        assert response.status_code == 200, url
        assert response[SERVED_FROM_HEADER] == "replica", url
        assert response[LAG_HEADER] == "unknown", url  # a mirror is not a standby
        assert len(on_replica) > 0 and writes(on_replica) == [], url
    note = "Read from the replica (replica), how far behind the primary it is cannot be told"
    assert note in response_text(staff, pages[0][1])

    with queries("replica") as on_replica:
        response = staff.post(
            reverse("admin:kumiflow_workflowrun_operate", args=[run.pk, "wake"]),
            {"reason": "nudged"},
        )
        api_response = api.post(
            f"{API}runs/{run.pk}/cancel/", {"reason": "no parcel"}, content_type="application/json"
        )
    assert response.status_code == 302 and api_response.status_code == 200
    assert len(on_replica) == 0, "an action reads and writes on the primary only"
    assert SERVED_FROM_HEADER not in api_response
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.CANCELLED


@routed
def test_a_replica_that_does_not_answer_is_passed_over(replica, waiter, monkeypatch, caplog):
    from django.db import OperationalError

    def gone(using: str) -> float:
        raise OperationalError(f"{using}: connection refused")

    monkeypatch.setattr(db, "replica_lag", gone)
    run = start_workflow("parcel")
    with queries("replica") as on_replica:
        response = api_client().get(f"{API}runs/{run.pk}/")
    assert response.status_code == 200 and response.json()["id"] == str(run.pk)
    assert SERVED_FROM_HEADER not in response  # served from the primary
    assert len(on_replica) == 0
    assert "replica replica cannot serve reads" in caplog.text


def response_text(client: Client, url: str) -> str:
    return client.get(url).content.decode()


def test_the_checks_name_what_is_missing(replica):
    databases: dict[str, Any] = {"default": {}, "replica": {}}
    router = "kumiflow_django.routers.ReplicaRouter"
    middleware = ["kumiflow_django.routers.ReplicaReadsMiddleware"]

    def ids(*args: Any) -> list[str]:
        return [m.id or "" for m in read_database_errors(*args)]

    assert ids(None, databases, "default", [], []) == []
    assert ids("nowhere", databases, "default", [router], middleware) == ["kumiflow.E070"]
    assert ids("default", databases, "default", [router], middleware) == ["kumiflow.E070"]
    assert ids("replica", databases, "default", [], middleware) == ["kumiflow.E071"]
    assert ids("replica", databases, "default", [router], []) == ["kumiflow.W070"]
    assert ids("replica", databases, "default", [ReplicaRouter()], middleware) == []
    atomic = {**databases, "default": {"ATOMIC_REQUESTS": True}}
    assert ids("replica", atomic, "default", [router], middleware) == ["kumiflow.W071"]


@routed
def test_an_asgi_request_reads_the_replica_and_the_next_one_is_unmarked(replica, waiter):
    """Under ASGI the middleware's parts run in separate threads: the marked
    block opened in process_view is closed after the response, not in a
    Context of another thread (a ValueError, a 500), and no mark outlives it."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    from kumiflow_django.store import replica as replica_module

    run = start_workflow("parcel")
    _, secret = create_token("asgi-replica", permissions=API_PERMISSIONS)

    async def ask(path: str) -> Any:
        return await AsyncClient().get(path, headers={"Authorization": f"Bearer {secret}"})

    with queries("replica") as on_replica:
        response = async_to_sync(ask)(f"{API}runs/{run.pk}/")
        again = async_to_sync(ask)(f"{API}runs/")
    assert response.status_code == 200, response.content
    assert response[SERVED_FROM_HEADER] == "replica"
    assert again.status_code == 200 and again[SERVED_FROM_HEADER] == "replica"
    assert len(on_replica) > 0 and writes(on_replica) == []
    assert replica_module.marked() is False
    assert WorkflowRun.objects.all().db == "default"


@routed
def test_with_atomic_requests_on_the_primary_a_page_does_not_say_it_read_the_replica(
    replica, waiter, monkeypatch
):
    """ATOMIC_REQUESTS makes each view a transaction of the primary, so every
    read stays there (W071 warns): the response must not claim the replica."""
    run = start_workflow("parcel")
    client = api_client()
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    with queries("replica") as on_replica:
        response = client.get(f"{API}runs/{run.pk}/")
    assert response.status_code == 200
    assert len(on_replica) == 0
    assert SERVED_FROM_HEADER not in response
