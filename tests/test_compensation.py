"""Compensation: steps undone in reverse order when a run fails after them,
durably, as steps of the run; on cancel when asked; what cannot have one."""

from __future__ import annotations

import os
import signal

import pytest

from kumiflow_django import cancel_run, define_workflow, retry_run, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import Compensation, RunStatus, WorkflowRun
from kumiflow_django.store import names as ev
from kumiflow_django.store.errors import InvalidRunState, WorkflowDefinitionError
from kumiflow_django.store.models import Event
from kumiflow_django.testing import run_until_idle
from tests.helpers import types
from tests.processes import output, spawn, stop, wait_for

pytestmark = pytest.mark.django_db


def reload(run):
    return WorkflowRun.objects.get(pk=run.pk)


def undo(what):
    """A compensation step that records itself in the log (a database effect)."""
    return s.append_event("undo-log", "undo.ran", payload={"undo": what})


def undone():
    return [
        e.payload["undo"] for e in Event.objects.filter(stream_id="undo-log").order_by("version")
    ]


def booking(fail_at_end=True):
    steps = [
        s.compute("flight", lambda ctx: "FL1", compensate=[undo("flight")]),
        s.wait("PT1M"),
        s.compute(
            "hotel",
            lambda ctx: "HO1",
            compensate=[undo("hotel, part 1"), s.wait("PT5M"), undo("hotel, part 2")],
        ),
        s.wait("PT1M"),
        s.compute("car", lambda ctx: "CA1", compensate=[undo("car")]),
    ]
    if fail_at_end:
        steps.append(s.compute("payment", lambda ctx: 1 / 0))
    else:
        steps += [s.wait("P1D"), s.return_("booked")]
    return define_workflow("trip", steps=steps)


def test_compensations_run_in_reverse_order_durably_then_the_run_fails(registry, clock):
    booking()
    run = start_workflow("trip")
    clock.advance(minutes=1)
    run_until_idle()
    clock.advance(minutes=1)
    run_until_idle()
    run = reload(run)
    # The car was booked in the failed segment: rolled back with it, not compensated.
    assert run.status == RunStatus.WAITING and run.compensation == Compensation.RUNNING
    assert undone() == ["hotel, part 1"]  # the hotel's compensation waits 5 minutes
    clock.advance(minutes=5)
    run_until_idle()
    run = reload(run)
    assert undone() == ["hotel, part 1", "hotel, part 2", "flight"]
    assert (run.status, run.compensation) == (RunStatus.FAILED, Compensation.COMPENSATED)
    assert run.reason == ev.STEP_FAILED
    assert "ZeroDivisionError" in run.last_error
    assert "compensation-started" in types(run)
    with pytest.raises(InvalidRunState, match="compensated"):
        retry_run(run.pk)


def missing_key(ctx):
    raise KeyError("x")


def test_a_failed_compensation_ends_the_run_with_compensation_failed(registry, clock):
    define_workflow(
        "fragile",
        steps=[
            s.compute("a", lambda ctx: 1, compensate=[undo("a")]),
            s.compute("b", lambda ctx: 2, compensate=[s.compute("oops", missing_key)]),
            s.wait("PT1M"),
            s.compute("boom", lambda ctx: 1 / 0),
        ],
    )
    run = start_workflow("fragile")
    clock.advance(minutes=1)
    run_until_idle()
    run = reload(run)
    assert (run.status, run.compensation) == (RunStatus.FAILED, Compensation.FAILED)
    assert "ZeroDivisionError" in run.last_error
    assert "Then a compensation failed: KeyError" in run.last_error
    assert undone() == []  # b's compensation failed first: a's never ran


def test_cancel_with_compensate_undoes_first_then_cancels(registry, clock):
    booking(fail_at_end=False)
    run = start_workflow("trip")
    for _ in range(2):
        clock.advance(minutes=1)
        run_until_idle()
    assert reload(run).cursor == [5]  # booked everything, waiting a day
    cancel_run(run.pk, reason="trip called off", compensate=True)
    run_until_idle()
    clock.advance(minutes=5)
    run_until_idle()
    run = reload(run)
    assert undone() == ["car", "hotel, part 1", "hotel, part 2", "flight"]
    assert (run.status, run.compensation) == (RunStatus.CANCELLED, Compensation.COMPENSATED)
    assert run.last_error == "trip called off"


def test_cancel_without_compensate_leaves_the_steps_as_they_are(registry, clock):
    booking(fail_at_end=False)
    run = start_workflow("trip")
    for _ in range(2):
        clock.advance(minutes=1)
        run_until_idle()
    cancel_run(run.pk)
    run_until_idle()
    assert undone() == []
    assert reload(run).compensation == ""


def test_a_compensation_sees_the_loop_item_and_the_step_results(registry, clock):
    define_workflow(
        "per-item",
        steps=[
            s.for_each(
                lambda ctx: ["x", "y"],
                "item",
                do=[
                    s.compute(
                        "reserved",
                        lambda ctx: f"r-{ctx.scope['item']}",
                        compensate=[
                            s.append_event(
                                "undo-log",
                                "undo.ran",
                                payload=lambda ctx: {"undo": ctx.scope["item"]},
                            )
                        ],
                    ),
                    s.wait("PT1M"),
                ],
            ),
            s.compute("boom", lambda ctx: 1 / 0),
        ],
    )
    run = start_workflow("per-item")
    for _ in range(2):
        clock.advance(minutes=1)
        run_until_idle()
    assert undone() == ["y", "x"]
    assert reload(run).compensation == Compensation.COMPENSATED


def test_steps_in_parallel_branches_are_compensated_too(registry, clock):
    define_workflow(
        "fanned",
        steps=[
            s.parallel(
                "both",
                {
                    "left": [s.compute("l", lambda ctx: 1, compensate=[undo("left")])],
                    "right": [
                        s.wait("PT1M"),
                        s.compute("r", lambda ctx: 2, compensate=[undo("right")]),
                    ],
                },
            ),
            s.wait("PT1M"),
            s.compute("boom", lambda ctx: 1 / 0),
        ],
    )
    run = start_workflow("fanned")
    for _ in range(2):
        clock.advance(minutes=1)
        run_until_idle()
    assert undone() == ["right", "left"]
    assert reload(run).compensation == Compensation.COMPENSATED


def test_a_failure_in_the_first_segment_has_nothing_to_compensate(registry, clock):
    define_workflow(
        "quick",
        steps=[
            s.compute("a", lambda ctx: 1, compensate=[undo("a")]),
            s.compute("b", lambda c: 1 / 0),
        ],
    )
    run = reload(start_workflow("quick"))
    assert (run.status, run.compensation) == (RunStatus.FAILED, "")
    assert undone() == []


def test_a_return_step_cannot_have_a_compensation(registry):
    with pytest.raises(WorkflowDefinitionError, match="a return step cannot have a compensation"):
        define_workflow("bad", steps=[s.return_(1).compensated_by([undo("x")])])


def test_an_empty_compensation_is_refused(registry):
    with pytest.raises(WorkflowDefinitionError, match="compensate needs at least one step"):
        define_workflow("bad", steps=[s.compute("a", lambda ctx: 1, compensate=[])])


@pytest.mark.django_db(transaction=True)
@pytest.mark.server_db
def test_compensation_survives_a_sigkill_and_undoes_each_step_exactly_once(tmp_path):
    from testproject.shop.models import Tally

    marker = tmp_path / "compensating"
    run = start_workflow("compensation-probe", payload={"id": "sk", "marker": str(marker)})
    env = {"KUMIFLOW_LEASE_SECONDS": "2"}
    first = spawn("kumiflow_worker", "--max-interval", "0.2", env=env)
    try:
        wait_for(marker.exists, 60, "the compensation of b to run")
    except AssertionError:
        stop([first])
        raise AssertionError(output(first)) from None
    os.kill(first.pid, signal.SIGKILL)  # in the middle of compensating b
    first.wait(30)
    assert reload(run).compensation == Compensation.RUNNING
    second = spawn("kumiflow_worker", "--max-interval", "0.2", env=env)
    try:
        wait_for(lambda: reload(run).status == RunStatus.FAILED, 60, "the run to end")
    finally:
        codes = stop([second])
    run = reload(run)
    assert (run.status, run.compensation) == (RunStatus.FAILED, Compensation.COMPENSATED), output(
        second
    )
    counts = dict(Tally.objects.filter(key__startswith="sk:").values_list("key", "count"))
    assert counts == {"sk:a": 1, "sk:b": 1, "sk:undo-b": 1, "sk:undo-a": 1}
    assert codes == [0]
