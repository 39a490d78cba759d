"""Concurrent writers at one expected version: exactly one wins, the log has no gap.

With ``hold``, the first writer keeps its transaction open after its insert
until the second writer's insert waits on the uncommitted row (seen in the
server's own lock view): the unique constraint decides, not the timing.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from kumiflow_django import VersionConflict, append_event, event_appended, load_stream
from tests.races import wait_until_blocked_or_done

pytestmark = pytest.mark.django_db(transaction=True)


def _race(stream_id: str, expected: int | None, *, hold: bool) -> list[str]:
    """Two threads append at ``expected``; with ``hold`` the first to insert waits."""
    barrier = threading.Barrier(2)
    outcomes: list[str] = []
    lock = threading.Lock()
    inserted = threading.Event()
    release = threading.Event()
    first: list[threading.Thread] = []

    def hold_first(sender, event, **kwargs):
        if hold and event.stream_id == stream_id and not first:
            first.append(threading.current_thread())
            inserted.set()
            assert release.wait(30), "the test never released the first writer"

    def writer(name: str) -> None:
        try:
            barrier.wait()
            append_event(stream_id, "seat.booked", {"by": name}, expected_version=expected)
            result = "ok"
        except VersionConflict:
            result = "conflict"
        finally:
            connections.close_all()
        with lock:
            outcomes.append(result)

    event_appended.connect(hold_first, dispatch_uid="race-hold")
    try:
        threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        if hold:
            assert inserted.wait(30)
            [second] = [t for t in threads if t is not first[0]]
            wait_until_blocked_or_done(second)
            release.set()
        for t in threads:
            t.join(30)
    finally:
        event_appended.disconnect(dispatch_uid="race-hold")
    return sorted(outcomes)


@pytest.mark.parametrize("hold", [False, True], ids=["free", "held"])
def test_two_concurrent_writers_one_success_one_conflict(hold):
    if hold and connection.vendor == "sqlite":
        pytest.skip("SQLite lets one writer in at a time: there is no uncommitted row to meet")
    append_event("seat-1", "seat.created", expected_version=0)

    for round_ in range(1, 6):
        assert _race("seat-1", expected=round_, hold=hold) == ["conflict", "ok"]

    versions = [e.version for e in load_stream("seat-1")]
    assert versions == list(range(1, 7)), "no gap and no duplicate version"


@pytest.mark.server_db
def test_concurrent_creation_of_a_new_stream():
    assert _race("fresh-1", expected=0, hold=True) == ["conflict", "ok"]
    assert [e.version for e in load_stream("fresh-1")] == [1]


@pytest.mark.server_db
def test_a_writer_without_expected_version_that_meets_another_goes_after_it():
    """The first attempt reads the head inside its INSERT (where the database
    can); meeting the held writer's row, it reads the head again and lands
    after it: both succeed, one after the other, without a gap."""
    append_event("queue-1", "job.queued")
    assert _race("queue-1", expected=None, hold=True) == ["ok", "ok"]
    assert [e.version for e in load_stream("queue-1")] == [1, 2, 3]
