"""Starting a straight-through workflow costs at most 4 round trips beyond the
trigger event's own append (and the process reads its paused scopes at most
once a second, whatever the number of starts)."""

from __future__ import annotations

import re
import time

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from kumiflow_django import append_event, define_workflow, on_event
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus, WorkflowRun

# Transactions commit, as in production: a definition snapshot is remembered
# after its first commit (kumiflow_django.definition.snapshots), not stored
# again by each start.
pytestmark = pytest.mark.django_db(transaction=True)

N = 1000


SCOPE_READS = {"n": 0, "seconds": 0.0}


def append_each(event_type: str) -> int:
    """Append N events, one per transaction; return the queries they took,
    but the reads of the paused scopes (counted in SCOPE_READS)."""
    total = 0
    began = time.monotonic()
    for chunk in range(0, N, 100):  # Django keeps at most 9000 queries in its log
        connection.queries_log.clear()
        with CaptureQueriesContext(connection) as queries:
            for i in range(chunk, chunk + 100):
                with transaction.atomic():
                    append_event(f"{event_type}-{i}", event_type, {"n": i})
        scopes = sum("kumiflow_pausedscope" in q["sql"] for q in queries.captured_queries)
        SCOPE_READS["n"] += scopes
        total += len(queries) - scopes
    SCOPE_READS["seconds"] += time.monotonic() - began
    return total


@override_settings(KUMIFLOW_SSE_LISTEN=False)  # the live streams' NOTIFY is their own cost
def test_1000_five_step_workflows_take_at_most_4_round_trips_each(registry):
    define_workflow(
        "five-steps",
        trigger=on_event("order.placed"),
        steps=[s.compute(f"c{i}", lambda ctx: ctx.event.payload["n"] + 1) for i in range(5)],
    )
    with transaction.atomic():  # the first start stores the definition's snapshot, once
        append_event("warm-up", "order.placed", {"n": 0})
    baseline = append_each("order.ignored")
    with_workflows = append_each("order.placed")

    assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == N + 1
    per_workflow = (with_workflows - baseline) / N
    assert per_workflow <= 4, f"{per_workflow} round trips per workflow"
    # the paused scopes: one read per START_CACHE_SECONDS at most, not one per start
    assert SCOPE_READS["n"] <= SCOPE_READS["seconds"] + 2, SCOPE_READS


def _statements(fn) -> list[str]:
    connection.queries_log.clear()
    with CaptureQueriesContext(connection) as queries:
        fn()
    return [q["sql"] for q in queries.captured_queries]


@override_settings(KUMIFLOW_SSE_LISTEN=False)
def test_an_event_that_wakes_a_waiting_run_costs_what_it_did(registry):
    """W3's event-wake segment: the signal's append finds the waiting run, locks
    it, checks its wait, and the run completes, in the appending transaction.
    The figures are those of the awaited_* columns on the run row; storing every
    wait as a ``RunWait`` row must not add a statement to it."""
    define_workflow(
        "signalled",
        trigger=on_event("w.start"),
        steps=[
            s.wait_for_event(
                "w.signal",
                match={"payload.key": lambda ctx: ctx.event.payload["key"]},
                timeout="PT10M",
                name="signal",
            ),
            s.compute("done", lambda ctx: 1),
        ],
    )
    for key in (0, 1):  # the first start and wake store the definition's snapshot
        with transaction.atomic():
            append_event(f"start-{key}", "w.start", {"key": key})
    with transaction.atomic():
        append_event("signal-0", "w.signal", {"key": 0})

    def suspend() -> None:
        with transaction.atomic():
            append_event("start-2", "w.start", {"key": 2})

    def wake() -> None:
        with transaction.atomic():
            append_event("signal-2", "w.signal", {"key": 2})

    suspending = _statements(suspend)
    waking = _statements(wake)
    assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == 2
    # Measured with the awaited_* columns (before the waits were rows): a
    # suspension took 11 statements on SQLite and 14 on PostgreSQL and MariaDB
    # (now one more: the wait's row), the wake-up 15 and 17 (the same now).
    one_writer = connection.vendor == "sqlite"
    assert len(suspending) <= (12 if one_writer else 15), suspending
    # One more since pausing: the wake-up asks, under the run's lock, whether
    # its workflow or tenant is paused (one indexed read of PausedScope, exact,
    # not the start's one-second cache). To fold into the look-up: issue 27.
    assert len(waking) <= (16 if one_writer else 18), waking
    # The look-up of the waits reads their runs in the same statement.
    joined = [q for q in waking if re.search(r"FROM [`\"]?kumiflow_runwait[`\"]? INNER JOIN", q)]
    assert joined, waking
