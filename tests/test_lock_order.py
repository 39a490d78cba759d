"""One lock order: a cancel meets the recording of its task's result, or the
end of the child its parent waits for, without a deadlock; the locks each
path takes follow the order of docs/architecture.md ("Lock order"); a public
operation that keeps losing lock conflicts answers a clear conflict (409).

The races are ordered with handshakes: the second transaction is started
only once the first holds its first lock, and the first goes on only once
the database says the second waits for a lock. No sleeps.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import OperationalError, connection

from kumiflow_django import (
    Limit,
    OperationConflict,
    append_event,
    cancel_run,
    define_workflow,
    on_event,
    start_workflow,
    wake_run,
)
from kumiflow_django import steps as s
from kumiflow_django.engine.resuming import resume_run
from kumiflow_django.http.tokens import API_PERMISSIONS, create_token
from kumiflow_django.models import Event, RunStatus, StepTask, TaskStatus, WorkflowRun
from kumiflow_django.projections import lock_order
from kumiflow_django.store import db
from kumiflow_django.store import names as ev
from kumiflow_django.tasks import attempts
from testproject.shop.tasks import double
from tests.http.conftest import API, TokenClient
from tests.races import in_thread, wait_until_blocked_or_done

RUN_TABLE = WorkflowRun._meta.db_table
TASK_TABLE = StepTask._meta.db_table


def locking(sql: str, table: str) -> bool:
    """Whether ``sql`` is a ``SELECT … FOR UPDATE`` of ``table``."""
    return "FOR UPDATE" in sql and re.search(rf"FROM [`\"]?{table}[`\"]?", sql) is not None


@contextmanager
def paused_after(table: str, holding: threading.Event, go: threading.Event) -> Iterator[None]:
    """In the thread that enters it: after its first locking read of ``table``,
    set ``holding`` and wait for ``go``."""

    def hook(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not holding.is_set() and locking(sql, table):
            holding.set()
            assert go.wait(30), "the test never let the first transaction go on"
        return result

    with connection.execute_wrapper(hook):
        yield


def race(
    first: Callable[[threading.Event, threading.Event], object],
    second: Callable[[], object],
) -> tuple[list[BaseException], list[BaseException]]:
    """``first`` holds its first lock (``holding``) and waits for ``go``;
    ``second`` then runs until it waits for a lock; then ``first`` goes on."""
    holding, go = threading.Event(), threading.Event()
    one, first_errors = in_thread(lambda: first(holding, go))
    assert holding.wait(30), "the first transaction never took its lock"
    two, second_errors = in_thread(second)
    assert wait_until_blocked_or_done(two) == "blocked"
    go.set()
    one.join(60)
    two.join(60)
    assert not one.is_alive() and not two.is_alive()
    return first_errors, second_errors


def types(run_id: uuid.UUID | str) -> list[str]:
    return list(
        Event.objects.filter(stream_id=str(run_id))
        .order_by("version")
        .values_list("type", flat=True)
    )


# -- cancel_run meets attempts.record ----------------------------------------------------


@pytest.fixture
def tasked(registry):
    """A run whose task is running (claimed), and which waits after the task."""
    define_workflow(
        "lock-task",
        steps=[s.task("doubled", double, args=[21]), s.wait("PT1H"), s.return_("done")],
    )
    run = start_workflow("lock-task")
    task = StepTask.objects.get(run_id=run.pk)
    claimed = attempts.claim(task.id, worker="test")
    assert claimed is not None and run.status == RunStatus.WAITING_EVENT
    return run, claimed


def record_holding(claimed: attempts.Attempt) -> Callable[[threading.Event, threading.Event], None]:
    def first(holding: threading.Event, go: threading.Event) -> None:
        with paused_after(TASK_TABLE, holding, go):
            attempts.record(claimed, attempts.Outcome(ok=True, result=42))

    return first


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_cancel_meets_the_recording_of_its_tasks_result_without_a_deadlock(tasked):
    """The recorder holds the task (and, now, the run first); the cancel comes
    and waits. Before, the cancel held the run and waited for the task while
    the recorder, waking the run, waited for the run: ``deadlock detected``."""
    run, claimed = tasked
    cancelled: list[WorkflowRun] = []
    record_errors, cancel_errors = race(
        record_holding(claimed),
        lambda: cancelled.append(cancel_run(run.pk, reason="enough")),
    )
    assert (record_errors, cancel_errors) == ([], [])
    task = StepTask.objects.get(pk=claimed.task_id)
    after = WorkflowRun.objects.get(pk=run.pk)
    # the result was recorded, the run took it and waits; then the cancel applied
    assert (task.status, task.result) == (TaskStatus.COMPLETED, 42)
    assert after.status == RunStatus.CANCELLED and cancelled[0].version == after.version
    assert types(run.pk)[-2:] == [ev.STEP_WAITING, ev.RUN_CANCELLED]


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_the_http_cancel_meeting_a_task_result_answers_200_never_500(tasked):
    run, claimed = tasked
    _, secret = create_token("lock-test", permissions=API_PERMISSIONS)
    answers: list[int] = []

    def cancel() -> None:
        response = TokenClient(secret).post_json(f"{API}runs/{run.pk}/cancel/", {"reason": "r"})
        answers.append(response.status_code)

    record_errors, cancel_errors = race(record_holding(claimed), cancel)
    assert (record_errors, cancel_errors, answers) == ([], [], [200])
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.CANCELLED


@pytest.fixture
def mailed(registry):
    """A run waiting for the delivery of its mail, which was sent (not recorded yet)."""
    from kumiflow_django.outbox import delivery
    from kumiflow_django.projections.dispatches import Dispatch

    define_workflow(
        "lock-mail",
        steps=[s.mail_send("a@example.com", "hi", "body", await_delivery=True), s.wait("PT1H")],
    )
    run = start_workflow("lock-mail")
    dispatch = Dispatch.objects.get(run_id=run.pk)
    claimed = delivery._claim(dispatch.id, dispatch.version)
    assert claimed is not None and run.status == RunStatus.WAITING_EVENT
    outcome, payload = delivery._attempt(claimed)
    assert outcome == ev.DISPATCHED
    return run, claimed, payload


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_cancel_meets_the_recording_of_an_awaited_delivery_without_a_deadlock(mailed):
    """As with a task: the delivered mail wakes the run, so its outcome is
    recorded with the run locked first."""
    from kumiflow_django.outbox import delivery
    from kumiflow_django.projections.dispatches import Dispatch, DispatchStatus

    run, claimed, payload = mailed

    def first(holding: threading.Event, go: threading.Event) -> None:
        with paused_after(Dispatch._meta.db_table, holding, go):
            assert delivery._record(claimed, ev.DISPATCHED, payload)

    record_errors, cancel_errors = race(first, lambda: cancel_run(run.pk, reason="enough"))
    assert (record_errors, cancel_errors) == ([], [])
    assert Dispatch.objects.get(pk=claimed.pk).status == DispatchStatus.DELIVERED
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.CANCELLED
    assert types(run.pk)[-2:] == [ev.STEP_WAITING, ev.RUN_CANCELLED]


# -- cancel of a parent meets the end of its child ---------------------------------------


@pytest.fixture
def family(registry):
    """A parent waiting for its child; the child is due (its timer was ended early)."""
    define_workflow("lock-kid", steps=[s.wait("PT1H"), s.return_("kid done")])
    define_workflow(
        "lock-parent", steps=[s.child("kid", "lock-kid"), s.return_(lambda ctx: ctx.steps["kid"])]
    )
    parent = start_workflow("lock-parent")
    child = WorkflowRun.objects.get(parent_id=parent.pk)
    assert (parent.status, child.status) == (RunStatus.WAITING, RunStatus.WAITING)
    wake_run(child.pk)
    return parent, child


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_parent_cancelled_while_its_child_ends_is_cancelled_and_the_child_completes(family):
    """The child's last segment takes its first lock (now: its parent's); the
    cancel of the parent comes and waits. Before, the child's segment held the
    child and the cancel the parent, each waiting for the other: on PostgreSQL
    the cancel lost the deadlock and the parent stayed waiting."""
    parent, child = family

    def child_ends(holding: threading.Event, go: threading.Event) -> None:
        with paused_after(RUN_TABLE, holding, go):
            resume_run(child.pk)

    child_errors, cancel_errors = race(child_ends, lambda: cancel_run(parent.pk, reason="stop"))
    assert (child_errors, cancel_errors) == ([], [])
    parent_after = WorkflowRun.objects.get(pk=parent.pk)
    child_after = WorkflowRun.objects.get(pk=child.pk)
    assert (child_after.status, child_after.result) == (RunStatus.COMPLETED, "kid done")
    assert parent_after.status == RunStatus.CANCELLED
    # nothing lost: the parent heard of its child's end, then was cancelled
    assert types(parent.pk)[-2:] == [ev.CHILD_SETTLED, ev.RUN_CANCELLED]


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_child_due_while_its_parent_is_being_cancelled_is_cancelled_with_it(family):
    """The other order: the cancel holds the parent first; the child's segment
    waits (now: for the parent; before: it held the child and waited for the
    parent at its end, while the cancel waited for the child)."""
    parent, child = family

    def cancel(holding: threading.Event, go: threading.Event) -> None:
        with paused_after(RUN_TABLE, holding, go):
            cancel_run(parent.pk, reason="stop")

    cancel_errors, child_errors = race(cancel, lambda: resume_run(child.pk))
    assert (cancel_errors, child_errors) == ([], [])
    assert WorkflowRun.objects.get(pk=parent.pk).status == RunStatus.CANCELLED
    assert WorkflowRun.objects.get(pk=child.pk).status == RunStatus.CANCELLED
    assert types(child.pk)[-1] == ev.RUN_CANCELLED


# -- the locks each path takes -----------------------------------------------------------


def _kind(sql: str) -> str | None:
    for kind, table in KINDS.items():
        if locking(sql, table):
            return kind
    return None


def _locked_kinds() -> dict[str, str]:
    from kumiflow_django.flow.models import FlowKey, RateBucket
    from kumiflow_django.projections.dispatches import Dispatch

    return {
        "run": RUN_TABLE,
        "task": TASK_TABLE,
        "dispatch": Dispatch._meta.db_table,
        "flow key": FlowKey._meta.db_table,
        "rate bucket": RateBucket._meta.db_table,
    }


KINDS = _locked_kinds()
#: The order of docs/architecture.md, "Lock order" (runs among themselves: by depth).
RANK = {"run": 0, "task": 1, "dispatch": 2, "flow key": 3, "rate bucket": 4}


@contextmanager
def recorded_locks() -> Iterator[list[tuple[str, list[Any]]]]:
    """Every ``SELECT … FOR UPDATE`` this thread runs, as (kind, parameters)."""
    taken: list[tuple[str, list[Any]]] = []

    def hook(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        kind = _kind(sql)
        if kind is not None:
            taken.append((kind, [str(p) for p in params or ()]))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(hook):
        yield taken


def run_locks(taken: list[tuple[str, list[Any]]]) -> list[str]:
    """The run ids each run lock named, in order (ids as the database was sent them)."""
    ids = {str(r.pk).replace("-", ""): str(r.pk) for r in WorkflowRun.objects.all()}
    ids |= {str(r.pk): str(r.pk) for r in WorkflowRun.objects.all()}
    return [ids[p] for kind, params in taken if kind == "run" for p in params if p in ids]


def assert_in_lock_order(taken: list[tuple[str, list[Any]]]) -> None:
    """Runs are locked by depth in their trees (an ancestor never after a
    descendant); every row a run owns after the run that owns it; flow keys
    and rate buckets after the rows they count."""
    assert taken, "no lock was recorded"
    held: set[tuple[str, str]] = set()
    fresh = []  # a row locked again (already held) never waits: left out
    for kind, params in taken:
        rows = {(kind, p) for p in params}
        if not rows <= held:
            fresh.append((kind, params))
        held |= rows
    taken = fresh
    depths = dict(WorkflowRun.objects.values_list("pk", "depth"))
    seen = [depths[uuid.UUID(pk)] for pk in run_locks(taken)]
    assert seen == sorted(seen), f"runs locked out of depth order: {seen}"
    first_owned = next((i for i, (kind, _) in enumerate(taken) if kind != "run"), len(taken))
    owned = [RANK[kind] for kind, _ in taken[first_owned:]]
    assert owned == sorted(owned), f"locks out of order: {[k for k, _ in taken]}"
    assert all(kind != "run" for kind, _ in taken[first_owned:]), (
        f"a run locked after the rows runs own: {[k for k, _ in taken]}"
    )


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_record_locks_the_run_then_its_task(tasked):
    run, claimed = tasked
    with recorded_locks() as taken:
        attempts.record(claimed, attempts.Outcome(ok=True, result=42))
    assert [kind for kind, _ in taken][:2] == ["run", "task"]
    assert run_locks(taken)[0] == str(run.pk)
    assert_in_lock_order(taken)


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_the_end_of_a_child_locks_its_parent_first(family):
    parent, child = family
    with recorded_locks() as taken:
        resume_run(child.pk)
    assert run_locks(taken)[:2] == [str(parent.pk), str(child.pk)]
    assert_in_lock_order(taken)
    assert WorkflowRun.objects.get(pk=child.pk).status == RunStatus.COMPLETED


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_the_resume_loop_locks_a_due_childs_parent_first_from_its_lease(family, monkeypatch):
    """The loop's lease reads where the child is in the lock order and its
    resume locks by that reading: the waiting parent still comes first."""
    from kumiflow_django.workers.resume import ResumeLoop

    parent, child = family
    taken: list[tuple[str, list[Any]]] = []
    real = ResumeLoop._resume_claimed

    def recorded(self: ResumeLoop, claimed: list[Any]) -> int:
        assert [c.placed for c in claimed] == [lock_order.Placed(1, parent.pk, True)]
        with recorded_locks() as segment_locks:
            resumed = real(self, claimed)
        taken.extend(segment_locks)
        return resumed

    monkeypatch.setattr(ResumeLoop, "_resume_claimed", recorded)
    assert ResumeLoop(threads=1).run_once() == 1
    assert run_locks(taken)[:2] == [str(parent.pk), str(child.pk)]
    assert_in_lock_order(taken)
    assert WorkflowRun.objects.get(pk=child.pk).status == RunStatus.COMPLETED


def test_a_placed_lock_is_not_asked_with_a_tenant():
    """``placed=`` is read without the tenant's filter: both would drop one."""
    with pytest.raises(TypeError):
        lock_order.lock_run(uuid.uuid4(), tenant="t", placed=lock_order.Placed(0, None, False))


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_cancel_locks_the_tree_by_depth_then_the_tasks(registry):
    """A parent with a task open and a child, itself with a task open and a
    grandchild: runs first, level by level, then the tasks."""
    define_workflow("lock-leaf", steps=[s.wait("PT1H")])
    define_workflow(
        "lock-mid", steps=[s.child("leaf", "lock-leaf", wait=False), s.task("t", double, args=[1])]
    )
    define_workflow(
        "lock-top",
        steps=[
            s.child("mid", "lock-mid", wait=False),
            s.child("mid2", "lock-mid", wait=False),
            s.task("t", double, args=[2]),
        ],
    )
    top = start_workflow("lock-top")
    assert WorkflowRun.objects.filter(root_id=top.pk).count() == 4
    with recorded_locks() as taken:
        cancel_run(top.pk, reason="all of it")
    assert_in_lock_order(taken)
    assert len(set(run_locks(taken))) == 5
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {RunStatus.CANCELLED}
    assert set(StepTask.objects.values_list("status", flat=True)) == {TaskStatus.CANCELLED}


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_limited_run_that_ends_locks_its_tasks_before_its_flow_key(registry):
    """A run under a concurrency limit, with a task open and a run parked
    behind its key, is cancelled: its end cancels the task (locked) before it
    frees its key's slot (locked), as a recorder of the task's result would
    come: the task, then the run, never the key first."""
    define_workflow(
        "lock-limited",
        trigger=on_event("lock.go"),
        concurrency=Limit(key=lambda event: event.payload["k"], max=1),
        steps=[s.task("t", double, args=[1]), s.wait("PT1H")],
    )
    append_event("lock-a", "lock.go", {"k": "same"})
    append_event("lock-b", "lock.go", {"k": "same"})
    first = WorkflowRun.objects.get(status=RunStatus.WAITING_EVENT)
    assert WorkflowRun.objects.filter(status=RunStatus.QUEUED).count() == 1
    with recorded_locks() as taken:
        cancel_run(first.pk, reason="enough")
    kinds = [kind for kind, _ in taken]
    assert "task" in kinds and "flow key" in kinds, kinds
    key_at = kinds.index("flow key")
    assert kinds.index("task") < key_at, kinds
    assert_in_lock_order(taken[: key_at + 1])
    # After the key only the parked run it wakes, the one exception of
    # flow/gates.py: whoever holds a parked run never takes its key.
    assert set(kinds[key_at + 1 :]) == {"run"}, kinds
    assert StepTask.objects.get(run_id=first.pk).status == TaskStatus.CANCELLED
    queued = WorkflowRun.objects.get(status=RunStatus.QUEUED)
    assert queued.wake_at is not None  # its slot freed: woken


# -- what a lost lock conflict answers -----------------------------------------------------


class _Cause(Exception):
    def __init__(self, sqlstate: str | None = None, number: int | None = None) -> None:
        super().__init__(number, "deadlock")
        self.sqlstate = sqlstate
        if number is None:
            self.args = ("deadlock detected",)


def deadlock() -> OperationalError:
    error = OperationalError("deadlock detected")
    error.__cause__ = _Cause(sqlstate="40P01")
    return error


def test_a_lock_conflict_is_told_from_other_errors():
    assert db.is_lock_conflict(deadlock())
    mysql = OperationalError(1213, "Deadlock found")
    mysql.__cause__ = _Cause(number=1213)
    assert db.is_lock_conflict(mysql)
    assert db.is_lock_conflict(OperationalError("database is locked"))
    gone = OperationalError("server closed the connection")
    gone.__cause__ = _Cause(sqlstate="08006")
    assert not db.is_lock_conflict(gone) and db.is_transient(gone)
    assert not db.is_lock_conflict(ValueError("deadlock"))


def test_retrying_runs_an_operation_again_after_a_lost_conflict(monkeypatch):
    monkeypatch.setattr(db, "CONFLICT_BACKOFF", 0.0)
    calls: list[int] = []

    @db.retrying
    def flaky(n: int) -> int:
        calls.append(n)
        if len(calls) < 3:
            raise deadlock()
        return n * 2

    assert flaky(21) == 42 and calls == [21, 21, 21]


def test_retrying_gives_up_with_a_conflict_and_lets_other_errors_through(monkeypatch):
    monkeypatch.setattr(db, "CONFLICT_BACKOFF", 0.0)
    calls: list[int] = []

    @db.retrying
    def always() -> None:
        calls.append(1)
        raise deadlock()

    with pytest.raises(OperationConflict) as raised:
        always()
    assert len(calls) == db.CONFLICT_ATTEMPTS
    assert isinstance(raised.value.__cause__, OperationalError)

    @db.retrying
    def broken() -> None:
        calls.append(2)
        raise OperationalError("no such table")

    with pytest.raises(OperationalError):
        broken()
    assert calls.count(2) == 1


@pytest.mark.django_db
def test_in_the_callers_transaction_a_conflict_is_not_run_again(monkeypatch):
    """Only the caller can run its transaction again (MariaDB rolled it back)."""
    calls: list[int] = []

    @db.retrying
    def inner() -> None:
        calls.append(1)
        raise deadlock()

    with pytest.raises(OperationConflict, match="in the caller"), db.atomic():
        inner()
    assert calls == [1]


@pytest.mark.django_db
def test_the_http_api_answers_a_lost_conflict_with_409(registry, monkeypatch):
    define_workflow("lock-waits", steps=[s.wait("PT1H")])
    run = start_workflow("lock-waits")
    monkeypatch.setattr(db, "CONFLICT_BACKOFF", 0.0)
    from kumiflow_django.engine import operations

    def lose(*args: Any, **kwargs: Any) -> None:
        raise deadlock()

    monkeypatch.setattr(operations, "_lock", lose)
    _, secret = create_token("lock-409", permissions=API_PERMISSIONS)
    response = TokenClient(secret).post_json(f"{API}runs/{run.pk}/cancel/", {"reason": "r"})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "conflict"
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.WAITING
