"""Concurrent writers at one expected version: exactly one wins, the log has no gap."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from kumiflow_django import VersionConflict, append_event, event_appended, load_stream

pytestmark = pytest.mark.django_db(transaction=True)


def _race(stream_id: str, expected: int, hold_first: float) -> list[str]:
    """Two threads append at ``expected``; the first to insert holds its transaction open."""
    barrier = threading.Barrier(2)
    outcomes: list[str] = []
    lock = threading.Lock()
    held = threading.local()

    def slow_commit(sender, event, **kwargs):
        # Keep the winner's transaction open after its insert, so the loser's
        # insert meets an uncommitted row (the unique-constraint path).
        if event.stream_id == stream_id and not getattr(held, "done", False):
            held.done = True
            time.sleep(hold_first)

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

    event_appended.connect(slow_commit, dispatch_uid="race-hold")
    try:
        threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        event_appended.disconnect(dispatch_uid="race-hold")
    return sorted(outcomes)


@pytest.mark.parametrize("hold", [0.0, 0.2])
def test_two_concurrent_writers_one_success_one_conflict(hold):
    append_event("seat-1", "seat.created", expected_version=0)

    for round_ in range(1, 6):
        assert _race("seat-1", expected=round_, hold_first=hold) == ["conflict", "ok"]

    versions = [e.version for e in load_stream("seat-1")]
    assert versions == list(range(1, 7)), "no gap and no duplicate version"


def test_concurrent_creation_of_a_new_stream():
    assert _race("fresh-1", expected=0, hold_first=0.2) == ["conflict", "ok"]
    assert [e.version for e in load_stream("fresh-1")] == [1]
    assert connection.vendor in {"sqlite", "postgresql", "mysql"}
