"""Parallel branches: join all, any and N, with branches that wait for timers,
events and tasks in every order; the parallel for_each and its limit."""

from __future__ import annotations

import pytest
from django.db.models import F
from django.test import override_settings

from kumiflow_django import append_event, cancel_run, define_workflow, start_workflow, wake_run
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus, RunWait, StepTask, TaskStatus, WorkflowRun
from kumiflow_django.store import names as ev
from kumiflow_django.testing import run_until_idle
from tests.helpers import types

pytestmark = pytest.mark.django_db


def payment_for(ctx):
    return ctx.event.payload["order"]


def checkout(join="all"):
    return define_workflow(
        "checkout",
        steps=[
            s.parallel(
                "done",
                {
                    "stock": [s.wait("PT1H"), s.compute("reserved", lambda ctx: "stock reserved")],
                    "payment": [
                        s.wait_for_event(
                            "payment.authorised", match={"payload.order": payment_for}, name="paid"
                        ),
                        s.compute("charge", lambda ctx: ctx.steps["paid"]["payload"]["amount"]),
                    ],
                    "carrier": [
                        s.wait_for_event(
                            "carrier.booked", match={"payload.order": payment_for}, name="booked"
                        ),
                    ],
                },
                join=join,
            ),
            s.return_(lambda ctx: ctx.steps["done"]),
        ],
    )


def pay(order, amount=1250):
    append_event(f"payment-{order}", "payment.authorised", {"order": order, "amount": amount})


def book(order):
    append_event(f"carrier-{order}", "carrier.booked", {"order": order})


def reload(run):
    return WorkflowRun.objects.get(pk=run.pk)


@pytest.mark.parametrize("order", ["timer first", "events first", "mixed"])
def test_join_all_waits_for_every_branch_whatever_the_order(registry, clock, order):
    checkout()
    run = start_workflow("checkout", payload={"order": 7})
    assert run.status == RunStatus.WAITING and run.branch_waits == 2
    assert set(RunWait.objects.filter(run_id=run.id).values_list("event_type", flat=True)) == {
        "payment.authorised",
        "carrier.booked",
    }
    if order == "timer first":
        clock.advance(hours=1)
        run_until_idle()
        assert reload(run).status == RunStatus.WAITING
        pay(7)
        assert reload(run).branch_waits == 1
        book(7)
    elif order == "events first":
        book(7)
        pay(7)
        assert reload(run).status == RunStatus.WAITING
        assert not RunWait.objects.filter(run_id=run.id).exists()
        clock.advance(hours=1)
        run_until_idle()
    else:
        pay(7)
        clock.advance(hours=1)
        run_until_idle()
        assert reload(run).status == RunStatus.WAITING
        book(7)
    run = reload(run)
    assert run.status == RunStatus.COMPLETED
    assert run.result["stock"] == "stock reserved"
    assert run.result["payment"] == 1250
    assert run.result["carrier"]["payload"] == {"order": 7}
    assert not RunWait.objects.filter(run_id=run.id).exists()


def test_an_event_of_another_order_wakes_no_branch(registry, clock):
    checkout()
    run = start_workflow("checkout", payload={"order": 7})
    pay(8)
    book(8)
    assert reload(run).branch_waits == 2


def test_join_any_goes_on_with_the_first_branch_and_cancels_the_others(registry, clock):
    checkout(join="any")
    run = start_workflow("checkout", payload={"order": 7})
    book(7)
    run = reload(run)
    assert run.status == RunStatus.COMPLETED
    assert list(run.result) == ["carrier"]
    assert not RunWait.objects.filter(run_id=run.id).exists()
    pay(7)  # a late event changes nothing
    clock.advance(hours=1)
    run_until_idle()
    assert reload(run).version == run.version


def test_join_n_goes_on_when_n_branches_are_done(registry, clock):
    checkout(join=2)
    run = start_workflow("checkout", payload={"order": 7})
    clock.advance(hours=1)
    run_until_idle()
    assert reload(run).status == RunStatus.WAITING
    pay(7)
    run = reload(run)
    assert run.status == RunStatus.COMPLETED
    assert set(run.result) == {"stock", "payment"}


def test_join_any_cancels_the_task_of_a_branch_that_lost(registry, clock):
    from testproject.shop.tasks import double

    define_workflow(
        "race",
        steps=[
            s.parallel(
                "first",
                {
                    "slow": [s.task("doubled", double, args=[4])],
                    "fast": [s.compute("now", lambda ctx: "fast")],
                },
                join="any",
            ),
            s.return_(lambda ctx: ctx.steps["first"]),
        ],
    )
    run = start_workflow("race")
    assert reload(run).result == {"fast": "fast"}
    task = StepTask.objects.get(run_id=run.id)
    assert task.status == TaskStatus.CANCELLED
    run_until_idle()
    assert StepTask.objects.get(run_id=run.id).attempt == 0  # never ran


def test_tasks_in_branches_run_and_join(registry, clock):
    from testproject.shop.tasks import double

    define_workflow(
        "fan",
        steps=[
            s.parallel(
                "doubled",
                {
                    "a": [s.task("a2", double, args=[1])],
                    "b": [s.task("b2", double, args=[2])],
                    "c": [s.wait("PT5M"), s.task("c2", double, args=[3])],
                },
            ),
            s.return_(lambda ctx: ctx.steps["doubled"]),
        ],
    )
    run = start_workflow("fan")
    run_until_idle()
    assert reload(run).status == RunStatus.WAITING
    clock.advance(minutes=5)
    run_until_idle()
    assert reload(run).result == {"a": 2, "b": 4, "c": 6}


def test_a_failed_branch_fails_the_step_and_cancels_the_others(registry, clock):
    from testproject.shop.tasks import double

    define_workflow(
        "broken",
        steps=[
            s.parallel(
                "p",
                {
                    "waits": [s.task("later", double, args=[1], queue="elsewhere")],
                    "fails": [s.wait("PT1M"), s.compute("x", lambda ctx: 1 / 0)],
                },
            )
        ],
    )
    run = start_workflow("broken")
    clock.advance(minutes=1)
    run_until_idle(tasks=False)
    run = reload(run)
    assert (run.status, run.reason) == (RunStatus.FAILED, ev.STEP_FAILED)
    assert "ZeroDivisionError at step 0.fails.1" in run.last_error
    assert StepTask.objects.get(run_id=run.id).status == TaskStatus.CANCELLED
    assert not RunWait.objects.filter(run_id=run.id).exists()


def test_a_branch_catches_its_failure_with_retry(registry, clock):
    attempts = []

    def flaky(ctx):
        attempts.append(ctx.attempt)
        if ctx.attempt < 2:
            raise ConnectionError("not yet")
        return "ok"

    define_workflow(
        "careful",
        steps=[
            s.parallel(
                "p",
                {
                    "a": [s.retry([s.compute("tried", flaky)], attempts=3, base="PT1S")],
                    "b": [s.compute("b", lambda ctx: "b")],
                },
            ),
            s.return_(lambda ctx: ctx.steps["p"]),
        ],
    )
    run = start_workflow("careful")
    assert reload(run).status == RunStatus.WAITING
    clock.advance(seconds=2)
    run_until_idle()
    assert reload(run).result == {"a": None, "b": "b"}  # retry keeps no result of its own
    assert attempts == [1, 2]


def test_two_branches_wait_for_the_same_type_each_with_its_own_key(registry, clock):
    define_workflow(
        "pair",
        steps=[
            s.parallel(
                "both",
                {
                    "x": [s.wait_for_event("signal", match={"payload.k": "x"}, name="sx")],
                    "y": [
                        s.wait("PT1M"),
                        s.wait_for_event("signal", match={"payload.k": "y"}, name="sy"),
                    ],
                },
            ),
            s.return_(lambda ctx: sorted(ctx.steps["both"])),
        ],
    )
    run = start_workflow("pair")
    append_event("s", "signal", {"k": "y"})  # before branch y waits for it: looked back
    append_event("s", "signal", {"k": "x"})
    assert reload(run).status == RunStatus.WAITING
    clock.advance(minutes=1)
    run_until_idle()
    assert reload(run).result == ["x", "y"]


@override_settings(KUMIFLOW_EVENT_WAKE="worker")
def test_branches_wake_through_the_resume_loop_in_worker_mode(registry, clock):
    checkout()
    run = start_workflow("checkout", payload={"order": 7})
    pay(7)
    # Matched, due for the resume loop: the other branch's wait is still indexed.
    assert RunWait.objects.filter(run_id=run.id, event_type="carrier.booked").exists()
    book(7)
    assert reload(run).status == RunStatus.WAITING
    run_until_idle()
    assert reload(run).branch_waits == 0  # both events taken; the timer remains
    clock.advance(hours=1)
    run_until_idle()
    assert reload(run).status == RunStatus.COMPLETED


def test_an_operator_wake_ends_every_branch_wait(registry, clock):
    define_workflow(
        "sleepy",
        steps=[
            s.parallel(
                "p",
                {
                    "t": [s.wait("P1D")],
                    "e": [s.wait_for_event("never", match={"payload.x": 1}, timeout="P2D")],
                },
            ),
            s.return_(lambda ctx: ctx.steps["p"]["e"]["timed_out"]),
        ],
    )
    run = start_workflow("sleepy")
    wake_run(run.pk)
    run_until_idle()
    assert reload(run).result is True


def test_cancelling_a_run_in_branches_drops_its_waits(registry, clock):
    checkout()
    run = start_workflow("checkout", payload={"order": 7})
    cancel_run(run.pk)
    assert not RunWait.objects.filter(run_id=run.id).exists()
    pay(7)
    assert reload(run).status == RunStatus.CANCELLED


def test_nested_parallel_steps(registry, clock):
    define_workflow(
        "nested",
        steps=[
            s.parallel(
                "outer",
                {
                    "left": [
                        s.parallel(
                            "inner",
                            {
                                "l1": [s.wait("PT1M"), s.compute("l1v", lambda ctx: 1)],
                                "l2": [s.wait_for_event("go", match={"payload.n": 2}, name="g")],
                            },
                        )
                    ],
                    "right": [s.wait("PT2M"), s.compute("rv", lambda ctx: "r")],
                },
            ),
            s.return_(lambda ctx: ctx.steps["outer"]),
        ],
    )
    run = start_workflow("nested")
    assert reload(run).branch_waits == 1
    append_event("g", "go", {"n": 2})
    clock.advance(minutes=2)
    run_until_idle()
    result = reload(run).result
    assert result["right"] == "r"
    assert result["left"]["l1"] == 1 and result["left"]["l2"]["payload"] == {"n": 2}


def test_the_parallel_for_each_keeps_at_most_its_limit_in_flight_and_its_order(registry, clock):
    from testproject.shop.models import Tally

    def enter(ctx):
        now = Tally.objects.get_or_create(key="inflight")[0]
        now.count += 1
        now.save()
        peak = Tally.objects.get_or_create(key="peak")[0]
        peak.count = max(peak.count, now.count)
        peak.save()
        return ctx.scope["n"]

    def leave(ctx):
        Tally.objects.filter(key="inflight").update(count=F("count") - 1)
        return ctx.scope["n"] * 2

    define_workflow(
        "bulk",
        steps=[
            s.for_each(
                lambda ctx: list(range(1000)),
                "n",
                do=[
                    s.compute("entered", enter),
                    s.wait(lambda ctx: f"PT{1 + ctx.scope['n'] % 3}M"),
                    s.compute("out", leave),
                ],
                parallel=True,
                max_concurrency=10,
                name="doubled",
            ),
            s.return_(lambda ctx: ctx.steps["doubled"]),
        ],
    )
    run = start_workflow("bulk")
    assert len(reload(run).state["parallel"]["0"]["inflight"]) == 10
    for _ in range(400):
        if reload(run).status == RunStatus.COMPLETED:
            break
        clock.advance(minutes=1)
        run_until_idle()
    run = reload(run)
    assert run.status == RunStatus.COMPLETED
    assert run.result == [n * 2 for n in range(1000)]
    assert Tally.objects.get(key="peak").count == 10
    assert Tally.objects.get(key="inflight").count == 0


def test_the_branches_picture_in_the_run_events(registry, clock):
    checkout()
    run = start_workflow("checkout", payload={"order": 7})
    assert types(run) == ["run-started", "step.waiting-branches"]


@pytest.mark.parametrize(
    "build, why",
    [
        (lambda: s.parallel("p", {}), "needs at least one branch"),
        (lambda: s.parallel("p", {"not a name": [s.wait("PT1M")]}), "must be an identifier"),
        (lambda: s.parallel("p", {"a": []}), "branch 'a' has no steps"),
        (lambda: s.parallel("", {"a": [s.wait("PT1M")]}), "needs a name"),
        (lambda: s.parallel("p", {"a": [s.wait("PT1M")]}, join=2), "more than the 1 branches"),
        (lambda: s.parallel("p", {"a": [s.wait("PT1M")]}, join=0), "join must be"),
        (lambda: s.parallel("p", {"a": [s.wait("PT1M")]}, join="most"), "join must be"),
        (
            lambda: s.parallel(
                "p", {"a": [s.compute("x", lambda c: 1)], "b": [s.compute("x", lambda c: 2)]}
            ),
            "two steps store their result as 'x'",
        ),
        (
            lambda: s.for_each(lambda c: [1], "i", do=[s.wait("PT1M")], parallel=True),
            "needs a name",
        ),
        (
            lambda: s.for_each(
                lambda c: [1], "i", do=[s.wait("PT1M")], parallel=True, max_concurrency=0, name="n"
            ),
            "max_concurrency must be a number of at least 1",
        ),
        (
            lambda: s.for_each(lambda c: [1], "i", do=[s.wait("PT1M")], max_concurrency=3),
            "max_concurrency needs parallel=True",
        ),
        (
            lambda: s.parallel("p", {"a": [s.return_(1)]}),
            "return is only allowed at the top level",
        ),
    ],
)
def test_bad_parallel_steps_are_refused_at_definition(registry, build, why):
    from kumiflow_django.store.errors import WorkflowDefinitionError

    with pytest.raises(WorkflowDefinitionError, match=why):
        define_workflow("bad", steps=[build()])


def test_a_branch_named_like_a_reserved_label_is_refused():
    with pytest.raises(ValueError, match="cannot name a branch"):
        s.parallel("p", {"compensate": [s.wait("PT1M")]})
