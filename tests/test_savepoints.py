"""A run's segment leaves its savepoint's RELEASE to the append (or the start)
it is directly in (``db.atomic``): one statement less, and nothing else
changes. A failing segment still rolls back its own part only (its writes,
its on-commit hooks); a child's segment, and the segments past the bound,
release their own."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from kumiflow_django import (
    NewEvent,
    append_event,
    append_events,
    define_workflow,
    load_stream,
    on_event,
    start_workflow,
)
from kumiflow_django import steps as s
from kumiflow_django.models import Event, RunStatus, WorkflowRun
from kumiflow_django.store import db

# Commits for real: on-commit hooks run (or not) as in production.
pytestmark = pytest.mark.django_db(transaction=True)

HOOKS: list[str] = []


@pytest.fixture(autouse=True)
def _hooks():
    HOOKS.clear()
    yield
    HOOKS.clear()


def _side_effect(ctx) -> int:
    """A step's own writes: an event on a stream of its own and an on-commit hook."""
    n = int(ctx.event.payload["n"])
    append_event(f"side-{n}", "side.written", {"n": n})
    transaction.on_commit(lambda: HOOKS.append(f"hook-{n}"))
    return n


def _fails(ctx) -> int:
    raise ValueError("the second step fails")


def _kinds(statements: list[str]) -> tuple[int, int]:
    saved = sum(q.startswith("SAVEPOINT") for q in statements)
    released = sum(q.startswith("RELEASE") for q in statements)
    return saved, released


def _captured(fn) -> list[str]:
    connection.queries_log.clear()
    with CaptureQueriesContext(connection) as queries:
        fn()
    return [q["sql"] for q in queries.captured_queries]


@pytest.mark.parametrize("caller", [True, False], ids=["in-caller", "own-transaction"])
def test_a_failing_segment_rolls_back_its_own_part_only(registry, caller):
    define_workflow(
        "fails-late",
        trigger=on_event("late.fired"),
        steps=[s.compute("writes", _side_effect), s.compute("fails", _fails)],
    )
    if caller:
        with transaction.atomic():
            append_event("late-1", "late.fired", {"n": 1})
            append_event("late-2", "after.fired", {})  # the caller's transaction goes on
    else:
        append_event("late-1", "late.fired", {"n": 1})

    assert [e.type for e in load_stream("late-1")] == ["late.fired"]
    assert load_stream("side-1") == [], "the failed segment's write is rolled back"
    assert HOOKS == [], "and so is its on-commit hook"
    run = WorkflowRun.objects.get()
    assert (run.status, run.reason) == (RunStatus.FAILED, "step_failed")
    if caller:
        assert [e.type for e in load_stream("late-2")] == ["after.fired"]


def test_a_succeeding_segment_leaves_its_release_to_the_append(registry):
    define_workflow(
        "writes", trigger=on_event("ok.fired"), steps=[s.compute("writes", _side_effect)]
    )
    with transaction.atomic():  # the first start stores the definition's snapshot
        append_event("ok-0", "ok.fired", {"n": 0})

    def append() -> None:
        with transaction.atomic():
            append_event("ok-1", "ok.fired", {"n": 1})

    statements = _captured(append)
    # the append's, the segment's and the step's own append's: the segment's
    # RELEASE is left to the append's, the step's append releases its own
    assert _kinds(statements) == (3, 2), statements
    assert [e.type for e in load_stream("side-1")] == ["side.written"]
    assert HOOKS == ["hook-0", "hook-1"]
    assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == 2


def test_start_workflow_takes_its_runs_release(registry):
    define_workflow("by-hand", steps=[s.compute("c", lambda ctx: 1)])
    start_workflow("by-hand")

    def start() -> None:
        with transaction.atomic():
            start_workflow("by-hand")

    assert _kinds(_captured(start)) == (2, 1)
    assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == 2


def test_a_segment_left_open_is_rolled_back_with_its_caller(registry):
    """A segment whose RELEASE was left to the append is undone, hooks and all,
    when the caller rolls the append back afterwards."""
    define_workflow(
        "undone", trigger=on_event("undone.fired"), steps=[s.compute("writes", _side_effect)]
    )
    with transaction.atomic():
        try:
            with transaction.atomic():
                append_event("undone-1", "undone.fired", {"n": 1})
                assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == 1
                raise LookupError("the caller changes its mind")
        except LookupError:
            pass
        append_event("kept-1", "kept.fired", {})

    assert not Event.objects.filter(stream_id__in=["undone-1", "side-1"]).exists()
    assert WorkflowRun.objects.count() == 0
    assert HOOKS == []
    assert [e.type for e in load_stream("kept-1")] == ["kept.fired"]


def test_a_childs_segment_releases_its_own(registry, clock):
    define_workflow("kid", steps=[s.compute("k", lambda ctx: 1)])
    define_workflow("parent", trigger=on_event("parent.fired"), steps=[s.child("c", "kid")])
    with transaction.atomic():
        append_event("parent-0", "parent.fired")

    def append() -> None:
        with transaction.atomic():
            append_event("parent-1", "parent.fired")

    statements = _captured(append)
    # the append's, the parent's and the child's (inside the parent's segment)
    assert _kinds(statements) == (3, 2), statements
    assert WorkflowRun.objects.filter(workflow="kid", status=RunStatus.COMPLETED).count() == 2


def test_at_most_a_bounded_number_of_savepoints_are_left_to_one_append(registry):
    """Each savepoint left open nests the next inside it: one append that
    starts many runs leaves at most MAX_LEFT_TO_ENCLOSING of them open."""
    define_workflow("many", trigger=on_event("many.fired"), steps=[s.compute("c", lambda ctx: 1)])
    append_event("many-0", "many.fired")
    count = db.MAX_LEFT_TO_ENCLOSING + 3

    def append() -> None:
        with transaction.atomic():
            append_events("many-1", [NewEvent("many.fired") for _ in range(count)])

    saved, released = _kinds(_captured(append))
    assert saved == count + 1, "the append's and one per run"
    assert saved - released == db.MAX_LEFT_TO_ENCLOSING
    assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == count + 1
