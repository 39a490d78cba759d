"""Starting a straight-through workflow costs at most 3 round trips beyond the
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
def test_1000_five_step_workflows_take_at_most_3_round_trips_each(registry):
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
    # its savepoint, its two INSERTs; its RELEASE is the append's (db.atomic)
    assert per_workflow <= 3, f"{per_workflow} round trips per workflow"
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
    # The run's workflow or tenant is asked whether it is paused under the
    # run's lock, in a statement of its own (read in the look-up instead, a
    # pause committed before the lock was not seen: tests/test_pause_races.py).
    assert len(waking) <= (14 if one_writer else 17), waking
    # The look-up of the waits reads their runs in the same statement.
    joined = [q for q in waking if re.search(r"FROM [`\"]?kumiflow_runwait[`\"]? INNER JOIN", q)]
    assert joined, waking


# --- the statements of one segment, by kind --------------------------------
#
# Each figure is every statement the segment's transaction sends (SAVEPOINT,
# RELEASE and, on SQLite, BEGIN IMMEDIATE and COMMIT included; on PostgreSQL
# and MariaDB the driver's BEGIN and COMMIT are counted too), measured after
# a first segment of the same kind (the definition's snapshot is stored by
# the first). A figure may only go down: lower it with the change that
# lowers it, and say so in docs/performance.md. On PostgreSQL a segment's
# events and its run's row are one statement (``sql.write_together``).

BUDGETS: dict[str, dict[str, int]] = {
    # Appending the trigger of a five-step workflow that runs to its end. The
    # trigger's INSERT reads the stream's head itself (MariaDB reads it first);
    # the segment's savepoint is released by the append's RELEASE.
    "straight-through": {"sqlite": 8, "postgresql": 7, "mysql": 9},  # 10/10/10, then PG 8, before
    # The resume loop's pass that claims a run whose timer is due and runs
    # its segment to the run's end (the claim, the lease, the segment). The
    # lease reads where the run is in the lock order: the resume does not.
    # On PostgreSQL the lease is one statement (18 before: a transaction of five).
    "timer": {"sqlite": 16, "postgresql": 13, "mysql": 16},  # 17/19/17, then PG 14, before
    # Appending the event a run waits for; the run completes inline.
    # The paused scope is read under the run's lock (a statement of its own:
    # a read in the look-up misses a pause committed before the lock). On the
    # servers the last is the look-up again after the commit (a run that
    # began waiting meanwhile is found). The head is read in the INSERT and
    # the segment's RELEASE is left to the append's (16/18/18, then PG 16, before).
    "event-wake": {"sqlite": 14, "postgresql": 15, "mysql": 17},
    # Recording a task's outcome; its run resumes and completes. The task's
    # run is placed in the lock order by the task's key, one statement, and
    # the segment's RELEASE is left to the recording's COMMIT (17/18/17, then
    # PG 16, before).
    "task": {"sqlite": 15, "postgresql": 14, "mysql": 15},
    # The resume loop's pass in which a child's timer ends it and its end
    # settles its waiting parent (the parent resumes in a later pass).
    "child": {"sqlite": 20, "postgresql": 17, "mysql": 20},  # 21/24/21, then PG 23 and 19, before
}


def _vendor_budget(kind: str, statements: list[str]) -> None:
    budget = BUDGETS[kind][connection.vendor]
    listed = "\n".join(f"{i + 1:>3} {q[:160]}" for i, q in enumerate(statements))
    assert len(statements) <= budget, f"{kind}: {len(statements)} > {budget}\n{listed}"


def _in_transaction(fn) -> list[str]:
    def run() -> None:
        with transaction.atomic():
            fn()

    return _statements(run)


def _returns_one(payload):
    return 1


@override_settings(KUMIFLOW_SSE_LISTEN=False)
@pytest.mark.parametrize("kind", list(BUDGETS))
def test_each_segment_kind_stays_within_its_statements(registry, clock, kind):
    from kumiflow_django import start_workflow
    from kumiflow_django.models import StepTask
    from kumiflow_django.tasks import attempts
    from kumiflow_django.workers.resume import ResumeLoop

    measured: list[str]
    if kind == "straight-through":
        define_workflow(
            "five-steps",
            trigger=on_event("b.straight"),
            steps=[s.compute(f"c{i}", lambda ctx: ctx.event.payload["n"] + 1) for i in range(5)],
        )
        for n in (0, 1):
            measured = _in_transaction(lambda n=n: append_event(f"s-{n}", "b.straight", {"n": n}))
        assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == 2
    elif kind == "timer":
        define_workflow("timed", steps=[s.wait("PT1M"), s.compute("after", lambda ctx: 1)])
        for _ in (0, 1):
            start_workflow("timed")
            clock.advance(minutes=2)
            measured = _statements(lambda: ResumeLoop(threads=1).run_once())
        assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == 2
    elif kind == "event-wake":
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
        for key in (0, 1):
            with transaction.atomic():
                append_event(f"start-{key}", "w.start", {"key": key})
            measured = _in_transaction(
                lambda key=key: append_event(f"signal-{key}", "w.signal", {"key": key})
            )
        assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == 2
    elif kind == "task":
        define_workflow(
            "tasked", steps=[s.task("t", _returns_one), s.compute("after", lambda ctx: 1)]
        )
        for _ in (0, 1):
            run = start_workflow("tasked")
            claimed = attempts.claim(StepTask.objects.get(run_id=run.pk).id, worker="test")
            assert claimed is not None
            measured = _statements(
                lambda claimed=claimed: attempts.record(
                    claimed, attempts.Outcome(ok=True, result=1)
                )
            )
        assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == 2
    else:
        define_workflow("kid", steps=[s.wait("PT1M"), s.return_(1)])
        define_workflow("parent", steps=[s.child("c", "kid"), s.compute("after", lambda ctx: 1)])
        for _ in (0, 1):
            parent = start_workflow("parent")
            clock.advance(minutes=2)
            measured = _statements(lambda: ResumeLoop(threads=1).run_once())
            assert WorkflowRun.objects.get(pk=parent.pk).status == RunStatus.WAITING
            ResumeLoop(threads=1).run_once()  # the parent takes its child's outcome
        assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == 4
    _vendor_budget(kind, measured)
