"""The lease of a task's attempt decides, not whether a sweep ran: a result
recorded after its timeout or heartbeat timeout (on the engine's clock) is
ignored and the attempt given up by the task's retry policy, by the recording
itself, by ``run_until_idle`` and by a heartbeat that comes too late."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from kumiflow_django import current_task, define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus, StepTask, TaskStatus
from kumiflow_django.store import clock as engine_clock
from kumiflow_django.store import names as ev
from kumiflow_django.store.models import Event
from kumiflow_django.tasks import attempts
from kumiflow_django.testing import VirtualClock, run_until_idle
from tests.tasks.helpers import fresh_key, run_of, task_of, wait_until

pytestmark = pytest.mark.django_db

#: Two attempts, the second 0.1 s after the first failed.
TWO_ATTEMPTS = {"attempts": 2, "base": 0.1, "jitter": 0.0}


def task_events(task: StepTask) -> list[str]:
    return list(
        Event.objects.filter(stream_id=str(task.id))
        .order_by("version")
        .values_list("type", flat=True)
    )


def _probe(name: str, fn, **options) -> None:
    define_workflow(
        name,
        steps=[
            s.task("result", fn, args=lambda ctx: ctx.event.payload.get("args"), **options),
            s.return_(lambda ctx: ctx.steps["result"]),
        ],
    )


def returns(value: str) -> str:
    return value


def test_a_result_recorded_after_the_timeout_with_no_sweep_is_ignored_and_retried(registry, clock):
    _probe("probe", returns, timeout=1, retry=TWO_ATTEMPTS)
    run = start_workflow("probe", payload={"args": ["on time"]})
    claimed = attempts.claim(task_of(run).id, worker="test")
    assert claimed is not None

    clock.advance(seconds=2)  # past the 1 s timeout; no sweep runs
    recorded = attempts.record(claimed, attempts.Outcome(ok=True, result="late"))

    assert recorded is not None
    assert (recorded.status, recorded.attempt, recorded.result) == (TaskStatus.PENDING, 1, None)
    assert "timed out after 1 s" in recorded.last_error
    assert task_events(recorded)[-3:] == [
        ev.TASK_ATTEMPT_STARTED,
        ev.TASK_ATTEMPT_FAILED,
        ev.TASK_RESULT_IGNORED,
    ]
    assert run_of(run).status == RunStatus.WAITING_EVENT

    clock.advance(seconds=1)  # the retry policy's second attempt is due
    run_until_idle()
    assert (run_of(run).status, run_of(run).result) == (RunStatus.COMPLETED, "on time")
    assert task_of(run).attempt == 2


def test_a_late_result_with_no_attempt_left_fails_the_task_by_its_policy(registry, clock):
    _probe("probe", returns, timeout=1, retry={"attempts": 1})
    run = start_workflow("probe", payload={"args": ["on time"]})
    claimed = attempts.claim(task_of(run).id, worker="test")
    assert claimed is not None

    clock.advance(seconds=1.5)
    recorded = attempts.record(claimed, attempts.Outcome(ok=True, result="late"))

    assert recorded is not None and recorded.status == TaskStatus.FAILED
    assert task_events(recorded)[-2:] == [ev.TASK_FAILED, ev.TASK_RESULT_IGNORED]
    run_until_idle()
    assert run_of(run).status == RunStatus.FAILED
    assert "timed out after 1 s" in run_of(run).last_error


def test_a_result_at_the_last_instant_of_the_lease_is_accepted(registry, clock):
    _probe("probe", returns, timeout=1)
    run = start_workflow("probe", payload={"args": ["on time"]})
    claimed = attempts.claim(task_of(run).id, worker="test")
    assert claimed is not None

    clock.advance(seconds=1)  # the lease holds up to and including its end
    recorded = attempts.record(claimed, attempts.Outcome(ok=True, result="in time"))
    assert recorded is not None and recorded.status == TaskStatus.COMPLETED
    assert recorded.result == "in time"


def test_a_result_recorded_after_the_heartbeat_timeout_with_no_sweep_is_ignored(registry, clock):
    _probe("probe", returns, timeout=60, heartbeat_timeout=2, retry=TWO_ATTEMPTS)
    run = start_workflow("probe", payload={"args": ["on time"]})
    claimed = attempts.claim(task_of(run).id, worker="test")
    assert claimed is not None
    clock.advance(seconds=1.5)
    assert claimed.context.heartbeat() is True  # the lease: until now + 2 s

    clock.advance(seconds=2.5)  # silent for longer than the heartbeat timeout
    recorded = attempts.record(claimed, attempts.Outcome(ok=True, result="late"))

    assert recorded is not None
    assert (recorded.status, recorded.attempt) == (TaskStatus.PENDING, 1)
    assert "no heartbeat for 2 s" in recorded.last_error
    assert task_events(recorded)[-2:] == [ev.TASK_ATTEMPT_FAILED, ev.TASK_RESULT_IGNORED]


def test_a_heartbeat_after_the_lease_ran_out_does_not_bring_it_back(registry, clock):
    _probe("probe", returns, timeout=60, heartbeat_timeout=2, retry=TWO_ATTEMPTS)
    run = start_workflow("probe", payload={"args": ["on time"]})
    claimed = attempts.claim(task_of(run).id, worker="test")
    assert claimed is not None

    clock.advance(seconds=3)  # the lease ran out at 2 s; no sweep ran
    assert claimed.context.cancelled is True
    assert claimed.context.heartbeat() is False
    recorded = attempts.record(claimed, attempts.Outcome(ok=True, result="late"))
    assert recorded is not None and recorded.status == TaskStatus.PENDING
    assert "no heartbeat for 2 s" in recorded.last_error


def overruns(value: str) -> str:
    """Attempt 1 takes 5 s of the virtual clock (its timeout is 1 s), then returns."""
    if current_task().attempt == 1:
        virtual = engine_clock.get_clock()
        assert isinstance(virtual, VirtualClock)
        virtual.advance(seconds=5)
        return "late"
    return value


def test_under_run_until_idle_a_timed_out_attempts_result_does_not_win(registry, clock):
    _probe("probe", overruns, timeout=1, retry=TWO_ATTEMPTS)
    run = start_workflow("probe", payload={"args": ["on time"]})

    run_until_idle()  # attempt 1 runs here and outlives its timeout
    task = task_of(run)
    assert (task.status, task.attempt, task.result) == (TaskStatus.PENDING, 1, None)
    assert "timed out after 1 s" in task.last_error
    assert run_of(run).status == RunStatus.WAITING_EVENT

    clock.advance(seconds=1)
    run_until_idle()
    assert (run_of(run).status, run_of(run).result) == (RunStatus.COMPLETED, "on time")


#: In-process handshakes of :func:`hangs_first` by key.
_HANDSHAKES: dict[tuple[str, str], threading.Event] = {}


def _handshake(what: str, key: str) -> threading.Event:
    return _HANDSHAKES.setdefault((what, key), threading.Event())


def hangs_first(key: str) -> str:
    """Attempt 1 blocks until released (or 60 s), then returns; later ones return at once."""
    if current_task().attempt == 1:
        _handshake("started", key).set()
        _handshake("release", key).wait(60)
        _handshake("returned", key).set()
        return "late"
    return "on time"


@pytest.mark.django_db(transaction=True)
def test_run_until_idle_gives_up_an_attempt_whose_lease_runs_out_while_it_waits(registry, clock):
    """The attempt runs on a thread of the pool (no test transaction): while
    ``run_until_idle`` waits for it, the virtual clock passes its timeout."""
    _probe("probe", hangs_first, timeout=120, retry=TWO_ATTEMPTS)
    key = fresh_key()
    run = start_workflow("probe", payload={"args": [key]})

    def time_passes() -> None:
        if _handshake("started", key).wait(60):
            clock.advance(timedelta(seconds=121))

    helper = threading.Thread(target=time_passes)
    helper.start()
    try:
        run_until_idle()
        # It returned while attempt 1 still hangs: its lease ran out, it was given up.
        assert not _handshake("returned", key).is_set()
        task = task_of(run)
        assert (task.status, task.attempt) == (TaskStatus.PENDING, 1)
        assert "timed out after 120 s" in task.last_error
    finally:
        _handshake("release", key).set()
        helper.join()
    wait_until(
        lambda: ev.TASK_RESULT_IGNORED in task_events(task_of(run)),
        what="attempt 1's late result to be recorded as ignored",
    )
    assert task_of(run).result is None

    clock.advance(seconds=1)
    run_until_idle()
    assert (run_of(run).status, run_of(run).result) == (RunStatus.COMPLETED, "on time")
