"""The event store: append, load, read, immutability, erasure, and bad input."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from kumiflow_django import (
    ImmutableEvent,
    InvalidEvent,
    NewEvent,
    VersionConflict,
    append_event,
    append_events,
    erase_stream,
    event_appended,
    load_stream,
    read_log,
    stream_version,
)
from kumiflow_django.models import Event
from kumiflow_django.store import db
from kumiflow_django.store.log import FUSED_APPEND_MAX
from tests.factories import EventFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def received():
    events: list[Event] = []

    def receiver(sender, event, **kwargs):
        events.append(event)

    event_appended.connect(receiver, dispatch_uid="test-received")
    yield events
    event_appended.disconnect(dispatch_uid="test-received")


def test_append_and_load_in_version_order():
    append_event("order-1", "order.placed", {"total": 10}, stream_type="order")
    append_event("order-1", "order.paid", {"amount": 10}, stream_type="order")
    append_event("order-2", "order.placed", {"total": 3}, stream_type="order")

    events = load_stream("order-1")

    assert [(e.version, e.type) for e in events] == [(1, "order.placed"), (2, "order.paid")]
    assert events[0].position < events[1].position
    assert events[0].tenant_id == "default"
    assert events[0].stream_type == "order"
    assert isinstance(events[0].event_id, uuid.UUID)
    assert stream_version("order-1") == 2
    assert stream_version("nothing-here") == 0


def test_batch_append_is_contiguous_and_sends_a_signal_per_event(received):
    saved = append_events(
        "cart-1",
        [NewEvent("cart.opened"), NewEvent("item.added", {"sku": "a"}), NewEvent("item.added")],
        expected_version=0,
    )

    assert [e.version for e in saved] == [1, 2, 3]
    assert [e.position for e in received] == [e.position for e in saved]
    assert all(e.position is not None for e in received)


def test_stale_expected_version_is_refused_and_writes_nothing():
    append_event("acc-1", "account.opened", expected_version=0)

    with pytest.raises(VersionConflict) as info:
        append_event("acc-1", "account.closed", expected_version=0)

    assert info.value.expected_version == 0
    assert info.value.actual_version == 1
    assert [e.type for e in load_stream("acc-1")] == ["account.opened"]


def test_an_expected_version_beyond_the_head_is_refused_and_leaves_no_gap():
    append_event("acc-4", "account.opened")

    with pytest.raises(VersionConflict) as info:
        append_event("acc-4", "account.credited", expected_version=3)

    assert (info.value.expected_version, info.value.actual_version) == (3, 1)
    assert [e.version for e in load_stream("acc-4")] == [1]


def test_the_first_attempt_reads_the_head_inside_its_insert_where_the_database_can():
    append_event("acc-5", "account.opened")
    with CaptureQueriesContext(connection) as queries:
        saved = append_events("acc-5", [NewEvent("account.credited"), NewEvent("account.closed")])

    sent = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(("SAVE", "REL"))]
    reads = [q for q in sent if q.startswith("SELECT")]
    assert len(reads) == (0 if db.reads_head_in_insert() else 1), sent
    assert [(e.version, e.type) for e in saved] == [(2, "account.credited"), (3, "account.closed")]
    assert [e.position for e in saved] == [e.position for e in load_stream("acc-5")][1:]
    assert saved[0].position < saved[1].position


@pytest.mark.parametrize("count", [FUSED_APPEND_MAX, FUSED_APPEND_MAX + 1, 501, 1000])
def test_a_large_append_is_taken_whole_on_every_database(count):
    """SQLite refuses a compound SELECT of more than 500 terms: an append of
    more events than the fused INSERT takes reads the head first instead."""
    append_event("big-1", "batch.opened")

    saved = append_events("big-1", [NewEvent("batch.item", {"i": i}) for i in range(count)])

    assert [e.version for e in saved] == list(range(2, count + 2))
    stream = load_stream("big-1")
    assert [e.version for e in stream] == list(range(1, count + 2))
    assert [e.payload["i"] for e in stream[1:]] == list(range(count))
    assert [e.position for e in stream] == sorted(e.position for e in stream)


def test_expected_version_matching_the_head_appends():
    append_event("acc-2", "account.opened")
    append_event("acc-2", "account.credited", {"cents": 5}, expected_version=1)
    assert stream_version("acc-2") == 2


def test_a_conflict_inside_a_transaction_does_not_poison_it():
    append_event("acc-3", "account.opened")
    with transaction.atomic():
        with pytest.raises(VersionConflict):
            append_event("acc-3", "account.opened", expected_version=0)
        # The caller's transaction goes on (PostgreSQL would refuse any query
        # after an unhandled error without the store's savepoint).
        append_event("acc-3", "account.credited", expected_version=1)
    assert stream_version("acc-3") == 2


def test_an_append_rolls_back_with_its_transaction(received):
    with pytest.raises(RuntimeError), transaction.atomic():
        append_event("gone-1", "thing.happened")
        raise RuntimeError("the caller fails after appending")
    assert load_stream("gone-1") == []


def test_payloads_are_normalised_to_what_the_log_reads_back():
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    event = append_event(
        "n-1", "thing.happened", {"at": when, "price": Decimal("1.50"), "id": uuid.UUID(int=1)}
    )
    stored = Event.objects.get(position=event.position)
    assert event.payload == stored.payload
    assert stored.payload == {
        "at": "2026-01-02T03:04:05Z",
        "price": "1.50",
        "id": "00000000-0000-0000-0000-000000000001",
    }


def test_streams_and_logs_are_scoped_by_tenant():
    append_event("shared-name", "thing.happened", tenant="acme")
    append_event("other", "thing.happened", tenant="globex")

    assert [e.tenant_id for e in load_stream("shared-name", tenant="acme")] == ["acme"]
    assert load_stream("shared-name", tenant="globex") == []
    assert [e.stream_id for e in read_log(tenant="globex")] == ["other"]
    assert {e.tenant_id for e in read_log(all_tenants=True)} == {"acme", "globex"}


def test_read_log_from_a_position_by_type():
    first = EventFactory.create(type="a.happened")
    EventFactory.create(type="b.happened")
    third = EventFactory.create(type="a.happened")

    assert [e.type for e in read_log(after=first.position)] == ["b.happened", "a.happened"]
    assert [e.position for e in read_log(after=first.position, types=["a.happened"])] == [
        third.position
    ]
    assert len(list(read_log(limit=2))) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"payload": {"x": object()}}, "not JSON-serialisable"),
        ({"payload": {"x": math.nan}}, "not JSON-serialisable"),
        ({"payload": ["not", "a", "mapping"]}, "must be a mapping"),
        ({"type": ""}, "non-empty string"),
        ({"type": "   "}, "must not be blank"),
        ({"expected_version": -1}, "must not be negative"),
        ({"expected_version": True}, "must be an integer"),
        ({"type": "kumiflow.workflow.run-started"}, "reserved prefix"),
        ({"tenant": ""}, "tenant must be"),
        ({"stream_id": ""}, "stream_id must be"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message_and_writes_nothing(kwargs, message):
    args = {"stream_id": "bad-1", "type": "thing.happened", "payload": {}} | kwargs
    stream_id, type_, payload = args.pop("stream_id"), args.pop("type"), args.pop("payload")

    with pytest.raises(InvalidEvent, match=message):
        append_event(stream_id, type_, payload, **args)

    assert Event.objects.count() == 0


def test_a_batch_with_one_bad_event_writes_none_of_them():
    with pytest.raises(InvalidEvent):
        append_events("batch-1", [NewEvent("ok.event"), NewEvent("bad.event", {"x": {1, 2}})])
    assert Event.objects.count() == 0


def test_another_tenant_appends_to_its_own_stream_of_the_same_id():
    """Streams are per tenant (tests/test_eventstore_tenants.py has the rest)."""
    append_event("invoice-9", "invoice.issued", tenant="acme")

    paid = append_event("invoice-9", "invoice.paid", tenant="globex")

    assert paid.version == 1
    assert sorted(Event.objects.values_list("tenant_id", "version")) == [
        ("acme", 1),
        ("globex", 1),
    ]


def test_events_cannot_be_changed_or_deleted():
    event = EventFactory.create()

    event.type = "rewritten"
    with pytest.raises(ImmutableEvent):
        event.save()
    with pytest.raises(ImmutableEvent):
        event.delete()
    with pytest.raises(ImmutableEvent):
        Event.objects.filter(position=event.position).update(type="rewritten")
    with pytest.raises(ImmutableEvent):
        Event.objects.all().delete()
    with pytest.raises(ImmutableEvent):
        Event.objects.create(
            tenant_id="default", stream_id="x", version=1, type="t", created_at=event.created_at
        )
    with pytest.raises(ImmutableEvent):
        Event.objects.bulk_create([Event(tenant_id="default", stream_id="x", version=1, type="t")])

    assert Event.objects.get().type == "thing.happened"


def test_erase_stream_deletes_exactly_one_stream_of_one_tenant():
    append_event("person-1", "person.registered", {"name": "Ada"}, tenant="acme")
    append_event("person-1", "person.moved", {"city": "Bonn"}, tenant="acme")
    append_event("person-2", "person.registered", {"name": "Bob"}, tenant="acme")

    assert erase_stream("person-1", tenant="acme") == 2

    assert load_stream("person-1", tenant="acme") == []
    assert len(load_stream("person-2", tenant="acme")) == 1
