"""The console's and the API's reads on a real streaming standby (PostgreSQL).

tests/standby.py makes the standby with ``pg_basebackup -R``; the test pauses
its replay, so that what a page shows proves where it was read, and acts on
the primary meanwhile.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.urls import reverse

from kumiflow_django import start_workflow
from kumiflow_django.models import RunStatus, WorkflowRun
from kumiflow_django.routers import LAG_HEADER, SERVED_FROM_HEADER
from tests.standby import standby, wait_for
from tests.test_replica import API, alias, api_client, routed, staff_client, waiter

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "replica"])
__all__ = ["waiter"]  # a fixture


@pytest.fixture(scope="module")
def standby_replica(django_db_setup, django_db_blocker) -> Iterator[dict[str, Any]]:
    primary = copy.deepcopy(connections["default"].settings_dict)
    if primary["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("a streaming standby is PostgreSQL's")
    with standby(primary) as params, alias("replica", {**primary, "PORT": params["port"]}):
        yield params


def replay(params: dict[str, Any], action: str) -> None:
    import psycopg

    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(f"SELECT pg_wal_replay_{action}()")


def behind(params: dict[str, Any]) -> bool:
    """Whether the standby has received WAL it has not replayed."""
    import psycopg

    with psycopg.connect(**params, autocommit=True) as conn:
        row = conn.execute("SELECT pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn()").fetchone()
    return bool(row and row[0])


def caught_up(params: dict[str, Any]) -> bool:
    import psycopg

    with (
        psycopg.connect(**params, autocommit=True) as conn,
        psycopg.connect(**{**params, "port": 5432}, autocommit=True) as primary,
    ):
        target = primary.execute("SELECT pg_current_wal_lsn()").fetchone()
        row = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s", target).fetchone()
    return bool(row and row[0])


@routed
def test_a_lagging_standby_serves_the_pages_and_refuses_nothing_it_should_not_see(
    standby_replica, waiter
):
    params = standby_replica
    old = start_workflow("parcel")
    staff, api = staff_client(), api_client()
    wait_for(lambda: caught_up(params), 60, "the standby to replay the first run")
    replay(params, "pause")
    try:
        new = start_workflow("parcel")  # committed on the primary, not replayed
        cancel = reverse("admin:kumiflow_workflowrun_operate", args=[old.pk, "cancel"])
        response = staff.post(cancel, {"reason": "lost in transit"})  # on the primary
        assert response.status_code == 302
        assert WorkflowRun.objects.get(pk=old.pk).status == RunStatus.CANCELLED
        wait_for(lambda: behind(params), 30, "the standby to receive WAL it does not replay")

        listing = staff.get(reverse("admin:kumiflow_workflowrun_changelist"))
        text = listing.content.decode()
        assert str(old.pk) in text and str(new.pk) not in text  # as the replica has it
        assert float(listing[LAG_HEADER]) > 0
        assert "s behind the primary" in text
        page = staff.get(reverse("admin:kumiflow_workflowrun_change", args=[old.pk]))
        assert page[SERVED_FROM_HEADER] == "replica"
        assert "s behind the primary" in page.content.decode()
        assert "waiting_event" in page.content.decode().lower()  # not yet cancelled there

        runs = api.get(f"{API}runs/").json()["runs"]
        assert [r["id"] for r in runs] == [str(old.pk)]
        assert runs[0]["status"] == "waiting_event"
        assert api.get(f"{API}runs/{old.pk}/").json()["status"] == "waiting_event"
        assert api.get(f"{API}runs/{new.pk}/").status_code == 404  # not on the replica yet

        # the API's write goes to the primary, though its run is not on the replica yet
        woken = api.post(
            f"{API}runs/{new.pk}/cancel/", {"reason": "duplicate"}, content_type="application/json"
        )
        assert woken.status_code == 200, woken.content
        assert WorkflowRun.objects.get(pk=new.pk).status == RunStatus.CANCELLED
    finally:
        replay(params, "resume")
    wait_for(lambda: caught_up(params), 60, "the standby to replay what the primary wrote")
    runs = api.get(f"{API}runs/").json()["runs"]
    assert {r["id"]: r["status"] for r in runs} == {
        str(old.pk): "cancelled",
        str(new.pk): "cancelled",
    }
