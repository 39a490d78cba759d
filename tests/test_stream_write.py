"""One write of several streams' changes: what it stores, and what it refuses.

On PostgreSQL the events, the new rows and the changed rows are one
statement (``sql.write_together``); elsewhere one statement each. These
tests hold on every database: the events take their positions in their
order, a row that moved on is refused as :class:`StaleRow`, a version
already taken as a version clash, and a refused write leaves nothing.
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from kumiflow_django.models import Event
from kumiflow_django.projections import pauses
from kumiflow_django.projections.pauses import PausedScope
from kumiflow_django.projections.stream import Change, StaleRow, write
from kumiflow_django.store import clock
from kumiflow_django.store import names as ev
from kumiflow_django.store.db import is_version_clash

pytestmark = pytest.mark.django_db(transaction=True)


def paused(name: str) -> Change[PausedScope]:
    """A new pause scope's stream, its first event added."""
    change = Change(
        pauses.PAUSES, pauses.stream_id("workflow", name), "default", None, now=clock.now()
    )
    change.add(ev.SCOPE_PAUSED, {"kind": "workflow", "name": name, "reason": "r", "by": "t"})
    return change


def resumed(scope: PausedScope) -> Change[PausedScope]:
    """An existing scope's stream, resumed and paused again (two events)."""
    change = Change(pauses.PAUSES, scope.id, "default", scope, now=clock.now())
    change.add(ev.SCOPE_RESUMED, {"by": "t"})
    change.add(ev.SCOPE_PAUSED, {"kind": scope.kind, "name": scope.name, "reason": "s", "by": "t"})
    return change


def stored(stream_id: str) -> list[tuple[int, int, str]]:
    return list(
        Event.objects.filter(stream_id=stream_id)
        .order_by("version")
        .values_list("position", "version", "type")
    )


def test_new_and_changed_rows_and_their_events_are_written_together():
    with transaction.atomic():
        first = paused("a")
        write([first])
    scope = PausedScope.objects.get(pk=first.saved.pk)
    changes = [paused("b"), resumed(scope), paused("c")]
    with transaction.atomic():
        write(changes)
    events = [event for change in changes for event in change.events]
    # Every event has the position the log gave it, in the order they were added.
    positions = [event.position for event in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    for event in events:
        assert (event.position, event.version, event.type) in stored(event.stream_id)
    assert stored(scope.id) == [
        (first.events[0].position, 1, ev.SCOPE_PAUSED),
        (changes[1].events[0].position, 2, ev.SCOPE_RESUMED),
        (changes[1].events[1].position, 3, ev.SCOPE_PAUSED),
    ]
    rows = {row.pk: row for row in PausedScope.objects.all()}
    assert rows[scope.pk].version == 3 and rows[scope.pk].reason == "s"
    assert {rows[c.saved.pk].version for c in (changes[0], changes[2])} == {1}


def test_a_row_that_moved_on_is_refused_and_nothing_of_the_write_is_kept():
    with transaction.atomic():
        first = paused("a")
        write([first])
    stale = PausedScope.objects.get(pk=first.saved.pk)
    # The row moved on without the log (its next versions are free there).
    PausedScope.objects.filter(pk=stale.pk).update(version=5)
    before = Event.objects.count()
    other = paused("b")
    with pytest.raises(StaleRow, match="no longer at version 1"), transaction.atomic():
        write([other, resumed(stale)])
    assert Event.objects.count() == before
    assert not PausedScope.objects.filter(pk=other.saved.pk).exists()
    assert PausedScope.objects.get(pk=stale.pk).version == 5


def test_a_version_already_taken_is_a_version_clash_and_writes_no_row():
    with transaction.atomic():
        first = paused("a")
        write([first])
    scope = PausedScope.objects.get(pk=first.saved.pk)
    late = resumed(scope)
    with transaction.atomic():  # another writer took version 2 of the stream
        write([resumed(PausedScope.objects.get(pk=scope.pk))])
    other = paused("b")
    with pytest.raises(IntegrityError) as refused, transaction.atomic():
        write([other, late])
    assert is_version_clash(refused.value)
    assert not PausedScope.objects.filter(pk=other.saved.pk).exists()
    assert not Event.objects.filter(stream_id=other.stream_id).exists()


def _statements_of(changes):
    """The writes ``write(changes)`` sent, in its own transaction."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        write(changes)
    starts = ("INSERT", "UPDATE", "WITH")
    return [q["sql"] for q in captured.captured_queries if q["sql"].startswith(starts)]


def _params(changes) -> int:
    """The parameters a fused write of ``changes`` counts (``fits_one_statement``)."""
    scope_fields = len(PausedScope._meta.concrete_fields)
    count = 0
    for change in changes:
        count += len(change.events) * len(Event._meta.concrete_fields)
        count += scope_fields if change.new else scope_fields + 2  # the row, or its key and version
    return count


@pytest.mark.parametrize("room", [0, -1])
def test_a_write_too_large_for_one_statement_is_sent_statement_by_statement(monkeypatch, room):
    from kumiflow_django.store import db, sql

    with transaction.atomic():
        first = paused("a")
        write([first])
    scope = PausedScope.objects.get(pk=first.saved.pk)
    changes = [paused("b"), resumed(scope)]
    # Room for exactly the whole write, or one parameter short of it: the
    # changed row's key and version count, not only the inserted rows.
    monkeypatch.setattr(sql, "MAX_PARAMS", _params(changes) + room)
    writes = _statements_of(changes)
    if db.writes_in_one_statement() and room == 0:
        assert len(writes) == 1 and writes[0].startswith("WITH")
    else:  # one INSERT of the events, one of the new row, one UPDATE
        assert len(writes) == 3 and not any(w.startswith("WITH") for w in writes)
    assert stored(scope.id)[-2:] == [
        (changes[1].events[0].position, 2, ev.SCOPE_RESUMED),
        (changes[1].events[1].position, 3, ev.SCOPE_PAUSED),
    ]
    assert PausedScope.objects.get(pk=scope.pk).version == 3
    assert PausedScope.objects.filter(pk=changes[0].saved.pk).exists()


@pytest.mark.parametrize("stale_first", [True, False])
def test_of_two_changed_rows_the_one_that_moved_on_is_named(stale_first):
    with transaction.atomic():
        made = [paused("a"), paused("b")]
        write(made)
    fresh, stale = (PausedScope.objects.get(pk=c.saved.pk) for c in made)
    PausedScope.objects.filter(pk=stale.pk).update(version=7)
    changes = [resumed(stale), resumed(fresh)] if stale_first else [resumed(fresh), resumed(stale)]
    with pytest.raises(StaleRow) as refused, transaction.atomic():
        write(changes)
    assert str(refused.value).startswith(f"pausedscope {stale.pk} ")
    assert PausedScope.objects.get(pk=fresh.pk).version == 1
    # And both written when neither moved on: each row gets its own events.
    PausedScope.objects.filter(pk=stale.pk).update(version=1)
    changes = [resumed(PausedScope.objects.get(pk=c.saved.pk)) for c in made]
    with transaction.atomic():
        write(changes)
    assert {PausedScope.objects.get(pk=c.saved.pk).version for c in made} == {3}
