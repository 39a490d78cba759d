"""Hostile ``wait_for_event`` match paths and values.

A match path is data: after ``payload.``/``metadata.`` each part between dots
is a literal key of a JSON object, even when it reads like an ORM lookup
(``a__b``, ``in``, ``x__gt``, ``isnull``) or an array index (``0``). Every row
runs both ways an awaited event reaches its run:

- **look-back**: the event is appended while the run still sleeps before the
  wait, and the wait finds it in the log (SQL narrows, Python decides);
- **live**: the run waits first, and appending the event wakes it (through
  the correlation key).

A decoy event with another value at the same path comes first, so a row
passes only when the right event is picked. Run it on SQLite, PostgreSQL and
MariaDB (``DATABASE_URL``).
"""

from __future__ import annotations

from typing import Any

import pytest

from kumiflow_django import append_event, define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.definition.matching import _narrow, correlation_key, same_value
from kumiflow_django.models import Event, RunStatus, WorkflowRun
from kumiflow_django.store import db
from kumiflow_django.store.errors import WorkflowDefinitionError
from kumiflow_django.workers.resume import ResumeLoop

pytestmark = pytest.mark.django_db

# (path, whether the look-back narrows by it in SQL): a key that Django's key
# transforms would read as an array index, or whose JSON text has escapes
# (SQLite and MariaDB compare the escaped text), is left to Python alone.
HOSTILE_PATHS = [
    ("payload.a__b", True),  # the ORM would read a nested key a -> b
    ("payload.in", True),  # ... the __in lookup
    ("payload.x__gt", True),  # ... key x with the __gt lookup
    ("payload.__typename", True),  # ... an empty key, then typename
    ("payload.pk", True),
    ("payload.contains", True),  # the JSON contains lookup (refused by SQLite)
    ("payload.isnull", True),
    ("payload.exact", True),
    ("payload.has_key", True),
    ("payload.0", False),  # a key transform reads it as an array index
    ("payload.-1", False),  # ... a negative index (refused by MariaDB)
    ("payload.a.b__c", True),
    ("payload.größe", False),
    ("payload.ключ", False),
    ("payload.😀", False),
    ("payload.'", True),
    ('payload.say "hi"', False),  # SQLite ends a quoted path label at the quote
    ("payload.back\\slash", False),
    ("payload.a key with spaces", True),
    ("payload.$", True),
    ("payload.[0]", True),
    ("payload.*", True),
    ("payload." + "k" * 500, True),
    ("metadata.a__b", True),
]
PATHS = [pytest.param(path, id=path[:30]) for path, _ in HOSTILE_PATHS]


def nested(path: str, value: Any) -> dict[str, Any]:
    """The payload (or metadata) that holds ``value`` at ``path``."""
    *keys, last = path.split(".")[1:]
    data: dict[str, Any] = {last: value}
    for key in reversed(keys):
        data = {key: data}
    return data


def send(path: str, value: Any, stream_id: str) -> dict[str, Any]:
    """Append the awaited event type with ``value`` at ``path``; return its payload."""
    body = nested(path, value)
    if path.startswith("metadata."):
        append_event(stream_id, "thing.happened", {"id": stream_id}, metadata=body)
        return {"id": stream_id}
    append_event(stream_id, "thing.happened", body)
    return body


@pytest.fixture
def waiting_on(registry, clock):
    """Define a manual workflow that sleeps a minute, then waits for
    ``thing.happened`` whose ``path`` equals the start payload's ``want``."""

    def define(path: str) -> None:
        define_workflow(
            "hostile-match",
            steps=[
                s.wait("PT1M"),
                s.wait_for_event(
                    "thing.happened",
                    match={path: lambda ctx: ctx.event.payload["want"]},
                    name="thing",
                ),
                s.return_(lambda ctx: ctx.steps["thing"]["payload"]),
            ],
        )

    return define


def deliver(
    way: str, clock, send_events, want: Any = "wanted"
) -> tuple[WorkflowRun, dict[str, Any]]:
    """Start a run awaiting ``want``, append the events the ``way`` given; return
    the run and the payload of the event that should wake it."""
    run = start_workflow("hostile-match", payload={"want": want})
    assert run.status == RunStatus.WAITING
    if way == "look-back":
        sent = send_events()
        clock.advance(minutes=1)
        assert ResumeLoop().run_once() == 1
    else:
        clock.advance(minutes=1)
        assert ResumeLoop().run_once() == 1
        run.refresh_from_db()
        assert run.status == RunStatus.WAITING_EVENT
        sent = send_events()
    run.refresh_from_db()
    return run, sent


WAYS = ["look-back", "live"]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("path", PATHS)
def test_any_key_is_a_literal_key(waiting_on, clock, path, way):
    waiting_on(path)

    def send_events():
        send(path, "a decoy", "decoy-1")
        return send(path, "wanted", "real-1")

    run, sent = deliver(way, clock, send_events)
    assert (run.status, run.last_error) == (RunStatus.COMPLETED, "")
    assert run.result == sent


@pytest.mark.parametrize(
    ("path", "narrowed"), [pytest.param(*row, id=row[0][:30]) for row in HOSTILE_PATHS]
)
def test_the_sql_narrows_by_the_literal_key_and_never_drops_the_match(path, narrowed):
    send(path, "a decoy", "decoy-1")
    send(path, "wanted", "real-1")
    events = Event.objects.all()
    found = _narrow(events, 0, path, "wanted", db.json_compares_text(events.db))
    streams = sorted(found.values_list("stream_id", flat=True))
    assert streams == (["real-1"] if narrowed else ["decoy-1", "real-1"])


# (awaited value, the event's value, whether they match): JSON equality.
VALUES = [
    pytest.param(1, 1.0, True, id="1~1.0"),
    pytest.param(1.0, 1, True, id="1.0~1"),
    pytest.param(-0.0, 0, True, id="-0.0~0"),
    pytest.param(2.5, 2.5, True, id="2.5~2.5"),
    pytest.param(10**20, 1e20, True, id="big-int~float"),
    pytest.param(1, True, False, id="1!~true"),
    pytest.param(True, 1, False, id="true!~1"),
    pytest.param(0, False, False, id="0!~false"),
    pytest.param(False, 0, False, id="false!~0"),
    pytest.param(True, True, True, id="true~true"),
    pytest.param("1", 1, False, id="'1'!~1"),
    pytest.param(1, "1", False, id="1!~'1'"),
    pytest.param("true", True, False, id="'true'!~true"),
    pytest.param(None, None, True, id="null~null"),
    pytest.param("é", "é", True, id="é~é"),
    pytest.param({"a": 1, "b": [True]}, {"b": [True], "a": 1.0}, True, id="object"),
    pytest.param([1], [True], False, id="[1]!~[true]"),
]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(("awaited", "sent", "match"), VALUES)
def test_the_live_wake_and_the_look_back_agree_on_what_matches(
    waiting_on, clock, awaited, sent, match, way
):
    waiting_on("payload.value")
    assert same_value(awaited, sent) is match
    assert (
        correlation_key({"payload.value": awaited}) == correlation_key({"payload.value": sent})
    ) is match

    run, _ = deliver(way, clock, lambda: send("payload.value", sent, "the-event"), awaited)
    if match:
        assert (run.status, run.result) == (RunStatus.COMPLETED, {"value": sent})
    else:
        assert run.status == RunStatus.WAITING_EVENT


@pytest.mark.parametrize(
    "path",
    [
        "payload.",
        "payload..a",
        ".a",
        "payload",
        "payload.a\x00b",
        "payload.\ud800",
        "stream_id.a",
        "pk",
        "a__b",
    ],
    ids=repr,
)
def test_a_path_that_names_no_key_is_refused_at_definition_time(registry, path):
    with pytest.raises(WorkflowDefinitionError, match="match path"):
        define_workflow(
            "bad-path",
            steps=[s.wait_for_event("thing.happened", match={path: "x"})],
        )
