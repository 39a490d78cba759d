"""The engine's streams, the append-only log, and tenants racing for one stream.

- Streams of runs, dispatches and cron schedules belong to the engine: an
  application cannot append to them (before: a note on a run's stream
  wedged the run, and a stream pre-created at a keyed run's predictable id
  made the keyed start raise ``DoesNotExist``).
- The log is append-only in the database itself: whatever bypasses the ORM
  guards (another queryset, the base manager, raw SQL) is refused there;
  erasure and ``flush`` are the sanctioned ways to delete.
- Two tenants creating a new stream of the same id at once: each gets its
  own stream (a stream is its tenant's).
"""

from __future__ import annotations

import threading
import uuid

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, connections, transaction
from django.db.models import QuerySet

from kumiflow_django import (
    InvalidEvent,
    append_event,
    define_workflow,
    erase_stream,
    on_event,
    start_workflow,
)
from kumiflow_django import steps as s
from kumiflow_django.models import Dispatch, Event
from kumiflow_django.testing import run_until_idle
from tests.helpers import only_run, types

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("event_type", ["note.added", "order.placed", "x"])
def test_a_runs_stream_refuses_application_events_and_the_run_goes_on(registry, clock, event_type):
    define_workflow("napper", trigger=on_event("go"), steps=[s.wait("PT1M"), s.return_("ok")])
    append_event("src", "go")
    run = only_run()

    with pytest.raises(InvalidEvent, match="engine"):
        append_event(str(run.id), event_type, {})
    with pytest.raises(InvalidEvent, match="engine"):
        append_event(run.id, event_type, {}, expected_version=run.version)

    clock.advance(minutes=1)
    run_until_idle()
    run.refresh_from_db()
    assert run.status == "completed"
    assert types(run) == ["run-started", "step.waiting", "step.resumed", "run-completed"]


def test_dispatch_and_schedule_streams_are_the_engines(registry):
    define_workflow("mailer", steps=[s.mail_send(to="a@x.io", subject="s", body="b")])
    start_workflow("mailer")
    dispatch = Dispatch.objects.get()

    with pytest.raises(InvalidEvent, match="engine"):
        append_event(str(dispatch.id), "note.added")
    with pytest.raises(InvalidEvent, match="reserved"):
        append_event("cron:nightly", "note.added")
    with pytest.raises(InvalidEvent, match="reserved"):
        append_event("fresh-1", "note.added", stream_type="workflow-run")


def test_a_keyed_start_cannot_be_wedged_by_pre_creating_its_stream(registry):
    """The first version derived a keyed run's id from (tenant, workflow, key):
    an application that appended to that id first broke the start."""
    define_workflow("keyed", steps=[s.return_("done")])
    old_namespace = uuid.UUID("6f1c1a4e-5b0d-4a8e-9d8e-2b7f3c1d9a10")
    predictable = uuid.uuid5(old_namespace, "default|keyed|k-1")
    append_event(str(predictable), "note.added")

    run = start_workflow("keyed", idempotency_key="k-1")
    again = start_workflow("keyed", idempotency_key="k-1")

    assert run.status == "completed" and again.pk == run.pk
    assert run.pk != predictable


# -- append-only in the database ------------------------------------------------


def _raw(sql: str, params: list) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda pk: QuerySet(Event).filter(pk=pk).update(type="x"), id="queryset-update"
        ),
        pytest.param(
            lambda pk: Event._base_manager.filter(pk=pk).update(type="x"), id="base-manager-update"
        ),
        pytest.param(
            lambda pk: Event._base_manager.filter(pk=pk)._raw_delete("default"),
            id="base-manager-raw-delete",
        ),
        pytest.param(lambda pk: QuerySet(Event).filter(pk=pk).delete(), id="queryset-delete"),
        pytest.param(
            lambda pk: _raw("UPDATE kumiflow_event SET type = %s WHERE position = %s", ["x", pk]),
            id="raw-update",
        ),
        pytest.param(
            lambda pk: _raw("DELETE FROM kumiflow_event WHERE position = %s", [pk]), id="raw-delete"
        ),
        pytest.param(lambda pk: _raw("DELETE FROM kumiflow_event", []), id="raw-delete-all"),
    ],
)
def test_the_database_refuses_to_change_or_delete_an_event(change):
    event = append_event("ledger-1", "money.moved", {"cents": 100})

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        change(event.position)

    stored = Event.objects.get()
    assert (stored.type, stored.payload) == ("money.moved", {"cents": 100})


def test_erasure_is_the_one_way_to_delete_and_closes_behind_itself():
    append_event("person-1", "person.registered", {"name": "Ada"})
    keep = append_event("person-2", "person.registered", {"name": "Bob"})

    with transaction.atomic():
        assert erase_stream("person-1") == 1
        # Still in the same transaction: the permit is closed again.
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            _raw("DELETE FROM kumiflow_event WHERE position = %s", [keep.position])

    assert list(Event.objects.values_list("stream_id", flat=True)) == ["person-2"]


@pytest.mark.django_db(transaction=True)
def test_flush_empties_the_log_as_an_explicit_operator_command():
    append_event("any-1", "thing.happened")
    call_command("flush", interactive=False, verbosity=0)
    assert not Event.objects.exists()


# -- two tenants, one new stream id -------------------------------------------


def _two_tenants_race(stream_id: str, *, forced: bool) -> dict[str, object]:
    """Tenants a and b append the first event of their streams ``stream_id`` at once.

    With ``forced``, a inserts first and keeps its transaction open until b's
    append has returned: b's stream is another stream, so b's insert must not
    wait for a's uncommitted row (it did while stream ids were one namespace,
    and then failed with ``TenantMismatch`` once a committed).
    """
    start = threading.Barrier(2)
    a_inserted = threading.Event()
    b_done = threading.Event()
    outcomes: dict[str, object] = {}

    def hold(sender, event, **kwargs):
        if forced and event.stream_id == stream_id and event.tenant_id == "a":
            a_inserted.set()
            assert b_done.wait(20), "b's append waited for a's transaction"

    def writer(tenant: str) -> None:
        try:
            start.wait()
            if forced and tenant == "b":
                assert a_inserted.wait(30)
            event = append_event(stream_id, "seat.claimed", {"by": tenant}, tenant=tenant)
            outcomes[tenant] = event.version
        except Exception as exc:  # noqa: BLE001 - the outcome the test checks
            outcomes[tenant] = type(exc).__name__
        finally:
            if tenant == "b":
                b_done.set()
            connections.close_all()

    from kumiflow_django import event_appended

    event_appended.connect(hold, dispatch_uid="tenant-race")
    try:
        threads = [threading.Thread(target=writer, args=(t,)) for t in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        event_appended.disconnect(dispatch_uid="tenant-race")
    return outcomes


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_two_tenants_creating_one_stream_id_at_once_both_get_their_own_stream():
    assert _two_tenants_race("shared-0", forced=True) == {"a": 1, "b": 1}
    for trial in range(1, 21):
        outcome = _two_tenants_race(f"shared-{trial}", forced=False)
        assert outcome == {"a": 1, "b": 1}, f"trial {trial}: {outcome}"
    per_stream = Event.objects.values_list("tenant_id", "stream_id", "version")
    assert sorted(per_stream) == sorted(
        (tenant, f"shared-{trial}", 1) for tenant in "ab" for trial in range(21)
    )
