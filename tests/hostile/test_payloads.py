"""Hostile values where they enter: event payloads, stream ids, step results, keys.

Each row is refused with a clear error (InvalidEvent, a ValueError) before
anything is written, on every database; a value that passes is stored on
every database. Before the hardening, several of these were stored as
something else (a falsy list as ``{}``), raised raw database errors, or
were accepted and then failed every later write of their run.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import IntegrityError, connection, connections

from kumiflow_django import (
    InvalidEvent,
    NewEvent,
    VersionConflict,
    append_event,
    append_events,
    define_workflow,
    load_stream,
    on_event,
    start_workflow,
)
from kumiflow_django import steps as s
from kumiflow_django.models import Event, WorkflowRun
from kumiflow_django.store.values import MAX_DEPTH
from tests.helpers import only_run

pytestmark = pytest.mark.django_db


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        pytest.param([], "must be a mapping", id="empty-list"),
        pytest.param(0, "must be a mapping", id="zero"),
        pytest.param("", "must be a mapping", id="empty-string"),
        pytest.param(["a"], "must be a mapping", id="list"),
        pytest.param({"text": "a\x00b"}, "NUL", id="nul-in-value"),
        pytest.param({"a\x00b": 1}, "NUL", id="nul-in-key"),
        pytest.param({"text": "\ud800"}, "surrogate", id="lone-surrogate"),
        pytest.param({"k\udfff": 1}, "surrogate", id="lone-surrogate-key"),
        pytest.param(nested(MAX_DEPTH + 1), "nested too deeply", id="one-level-too-deep"),
        pytest.param(nested(100_000), "nested too deeply", id="100000-deep"),
        pytest.param({"x": float("nan")}, "not JSON", id="nan"),
        pytest.param({"x": float("inf")}, "not JSON", id="infinity"),
        pytest.param({"x": {1, 2}}, "not JSON", id="set"),
        pytest.param({"x": b"bytes"}, "not JSON", id="bytes"),
    ],
)
def test_hostile_payloads_are_refused_and_nothing_is_written(payload, message):
    with pytest.raises(InvalidEvent, match=message):
        append_event("hostile-1", "thing.happened", payload)
    with pytest.raises(InvalidEvent, match=message):
        append_event("hostile-1", "thing.happened", {}, metadata=payload)
    assert not Event.objects.exists()


def test_a_payload_over_the_size_limit_is_refused_before_the_database_sees_it(settings):
    settings.KUMIFLOW_MAX_VALUE_BYTES = 1000
    with pytest.raises(InvalidEvent, match="KUMIFLOW_MAX_VALUE_BYTES"):
        append_event("big-1", "thing.happened", {"blob": "x" * 1000})
    assert not Event.objects.exists()


def test_a_20_megabyte_payload_gets_a_clear_error_not_a_database_error():
    with pytest.raises(InvalidEvent, match="more than the limit"):
        append_event("big-2", "thing.happened", {"blob": "x" * 20_000_000})


def test_what_passes_the_checks_is_stored_by_every_database():
    """The limits are the database's, checked first: the largest and deepest
    value that passes is stored (MariaDB refuses JSON nested 32 deep)."""
    deepest = nested(MAX_DEPTH)
    largest = {"blob": "é" * 500_000}  # 1,000,012 bytes of UTF-8 JSON: under 1 MiB
    tricky = {"text": "\\u0000 is not a NUL", "emoji": "🙂", "tab": "\t", "quote": '"'}

    for i, payload in enumerate([deepest, largest, tricky]):
        append_event(f"ok-{i}", "thing.happened", payload)

    assert [e.payload for e in Event.objects.order_by("position")] == [deepest, largest, tricky]


@pytest.mark.parametrize(
    "stream_id",
    [
        pytest.param(True, id="bool"),
        pytest.param(1.5, id="float"),
        pytest.param(b"abc", id="bytes"),
        pytest.param(None, id="none"),
        pytest.param("", id="empty"),
        pytest.param("x" * 101, id="too-long"),
        pytest.param("a\x00b", id="nul"),
        pytest.param("line\nbreak", id="newline"),
        pytest.param("\ud800", id="surrogate"),
        pytest.param(["a"], id="list"),
    ],
)
def test_hostile_stream_ids_are_refused(stream_id):
    with pytest.raises(InvalidEvent, match="stream_id"):
        append_event(stream_id, "thing.happened")
    assert not Event.objects.exists()


def test_stream_ids_may_be_strings_integers_or_uuids():
    key = uuid.uuid4()
    append_event(key, "thing.happened")
    append_event(42, "thing.happened")
    assert load_stream(str(key))[0].stream_id == str(key)
    assert load_stream("42")[0].stream_id == "42"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"schema_version": True}, "schema_version", id="schema-version-bool"),
        pytest.param({"schema_version": 0}, "schema_version", id="schema-version-zero"),
        pytest.param({"schema_version": 40_000}, "schema_version", id="schema-version-huge"),
        pytest.param({"type": "t" * 201}, "longer than 200", id="type-too-long"),
        pytest.param({"type": "order\x00placed"}, "control character", id="type-nul"),
        pytest.param({"type": 5}, "must be a string", id="type-int"),
        pytest.param({"tenant": "t" * 65}, "longer than 64", id="tenant-too-long"),
        pytest.param({"tenant": 5}, "must be a string", id="tenant-int"),
        pytest.param({"stream_type": "s" * 101}, "longer than 100", id="stream-type-long"),
        pytest.param({"created_by": "c" * 151}, "longer than 150", id="created-by-long"),
        pytest.param({"expected_version": 1.0}, "integer", id="expected-version-float"),
    ],
)
def test_hostile_arguments_of_append_event(kwargs, message):
    args = {"type": "thing.happened"} | kwargs
    event_type = args.pop("type")
    with pytest.raises(InvalidEvent, match=message):
        append_event("args-1", event_type, {}, **args)
    assert not Event.objects.exists()


def test_swapped_arguments_are_refused_when_the_stream_id_is_a_trigger_type(registry):
    define_workflow("onboarding", trigger=on_event("user.signed-up"), steps=[s.return_(1)])

    with pytest.raises(InvalidEvent, match="swapped"):
        append_event("user.signed-up", "u1", {"user_id": "u1"})  # type first: the old mistake

    assert not Event.objects.exists()
    append_event("u1", "user.signed-up", {"user_id": "u1"})
    assert only_run().status == "completed"


@pytest.mark.parametrize(
    ("key", "message"),
    [
        pytest.param("", "non-empty", id="empty"),
        pytest.param(5, "must be a string", id="int"),
        pytest.param("k" * 201, "longer than 200", id="too-long"),
        pytest.param("a\x00b", "control character", id="nul"),
    ],
)
def test_hostile_idempotency_keys_of_start_workflow(registry, key, message):
    define_workflow("keyed", steps=[s.return_(1)])
    with pytest.raises(InvalidEvent, match=message):
        start_workflow("keyed", idempotency_key=key)
    assert not WorkflowRun.objects.exists()


@pytest.mark.parametrize(
    "payload", [pytest.param([], id="list"), pytest.param("x", id="str"), pytest.param(0, id="0")]
)
def test_start_workflow_refuses_a_payload_that_is_not_a_mapping(registry, payload):
    define_workflow("manual", steps=[s.return_(1)])
    with pytest.raises(InvalidEvent, match="mapping"):
        start_workflow("manual", payload=payload)


@pytest.mark.parametrize(
    ("result", "message"),
    [
        pytest.param("a\x00b", "NUL", id="nul"),
        pytest.param("\udc80", "surrogate", id="surrogate"),
        pytest.param(nested(MAX_DEPTH + 1), "nested too deeply", id="too-deep"),
        pytest.param({"x": object()}, "not JSON", id="object"),
    ],
)
def test_an_unstorable_step_result_fails_the_run_clearly_and_the_event_commits(
    registry, result, message
):
    define_workflow(
        "results",
        trigger=on_event("go"),
        steps=[s.compute("bad", lambda ctx: result), s.wait("PT1H")],
    )

    append_event("src-1", "go", {"n": 1})

    run = only_run()
    assert run.status == "failed" and run.reason == "step_failed"
    assert message in run.last_error and "compute 'bad'" in run.last_error
    assert Event.objects.filter(stream_id="src-1").count() == 1


def test_a_state_over_its_limit_fails_the_run_with_its_own_reason(registry, settings):
    settings.KUMIFLOW_MAX_STATE_BYTES = 2000
    define_workflow(
        "hoarder",
        trigger=on_event("go"),
        steps=[
            s.compute("a", lambda ctx: "x" * 900),
            s.compute("b", lambda ctx: "y" * 900),
            s.compute("c", lambda ctx: "z" * 900),
            s.wait("PT1H"),
        ],
    )
    append_event("src-2", "go")
    run = only_run()
    assert (run.status, run.reason) == ("failed", "state_too_large")
    assert "KUMIFLOW_MAX_STATE_BYTES" in run.last_error


# -- the version guard tells a clash from other refusals ---------------------------


def test_another_integrity_error_during_an_append_is_not_a_version_conflict(monkeypatch):
    """On MariaDB every IntegrityError of an append used to become a
    VersionConflict "at version unknown": callers that retry on conflict
    looped forever. Here the database refuses the insert for another reason
    (a real unique constraint of another table, raised by the real driver)."""
    from kumiflow_django.store import log as eventstore
    from testproject.shop.models import Tally

    Tally.objects.create(key="taken")

    def refuse(rows, *args, **kwargs):
        Tally.objects.create(key="taken")

    # the first attempt's INSERT reads the head itself where the database can
    monkeypatch.setattr(eventstore, "insert", refuse)
    monkeypatch.setattr(eventstore, "_insert_at_head", refuse)
    with pytest.raises(IntegrityError):
        append_event("other-1", "thing.happened")


@pytest.mark.django_db(transaction=True)
def test_appends_without_an_expected_version_all_succeed_under_contention():
    """8 threads append 25 events each to one stream, with no expected version:
    every append succeeds and the stream has no gap. Before, most of them
    failed with a VersionConflict naming a version the caller never passed."""
    threads, per_thread = 8, 25
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            barrier.wait()
            for i in range(per_thread):
                append_event("hot-1", "counter.bumped", {"thread": n, "i": i})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    workers = [threading.Thread(target=writer, args=(n,)) for n in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(120)

    assert errors == []
    versions = [e.version for e in load_stream("hot-1")]
    assert versions == list(range(1, threads * per_thread + 1))


def test_an_expected_version_still_conflicts():
    append_events("acc-9", [NewEvent("opened")], expected_version=0)
    with pytest.raises(VersionConflict) as info:
        append_event("acc-9", "closed", expected_version=0)
    assert (info.value.expected_version, info.value.actual_version) == (0, 1)
    assert connection.vendor in {"sqlite", "postgresql", "mysql"}
