"""restart_run and restart_plan: a finished run restarted from one of its steps, as a new run."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from kumiflow_django import (
    InvalidRunState,
    UnknownWorkflow,
    arestart_run,
    cancel_run,
    define_workflow,
    restart_plan,
    restart_run,
    retry_run,
    start_workflow,
)
from kumiflow_django import steps as s
from kumiflow_django.engine.operations import refuse_retry
from kumiflow_django.engine.restart import refuse_restart
from kumiflow_django.models import Dispatch, Event, RunStatus, StepTask
from kumiflow_django.testing import run_until_idle
from testproject.shop import tasks as shop_tasks
from tests.helpers import types

pytestmark = pytest.mark.django_db


def _flaky(calls: dict[str, int], broken: dict[str, bool]) -> None:
    define_workflow(
        "flaky",
        steps=[
            s.compute("a", lambda ctx: _count(calls, "a", 20)),
            s.wait("PT1H"),
            s.compute("b", lambda ctx: _b(calls, broken)),
            s.return_(lambda ctx: ctx.steps["a"] + ctx.steps["b"]),
        ],
    )


def _count(calls: dict[str, int], name: str, value: object) -> object:
    calls[name] += 1
    return value


def _note(ran: list[str], name: str, value: object) -> object:
    ran.append(name)
    return value


def _b(calls: dict[str, int], broken: dict[str, bool]) -> int:
    calls["b"] += 1
    if broken["yes"]:
        raise RuntimeError("the partner API is down")
    return 1


def test_a_failed_run_restarts_from_the_step_its_failed_segment_began_at(registry, clock):
    calls, broken = {"a": 0, "b": 0}, {"yes": True}
    _flaky(calls, broken)
    old = start_workflow("flaky", payload={"order": 7})
    clock.advance(hours=2)
    run_until_idle()
    old.refresh_from_db()
    assert old.status == RunStatus.FAILED

    plan = restart_plan(old.id, "1")
    assert plan.refusal is None
    assert [c.path for c in plan.choices] == ["0", "1"]
    assert plan.carried == ["a"]
    assert [a.path for a in plan.again] == ["1", "2", "3"]
    # The failed segment was rolled back: its steps did not happen.
    assert "rolled back" in (restart_plan(old.id, "2").refusal or "")

    broken["yes"] = False
    new = restart_run(old.id, from_step="1", reason="partner fixed", by="ops")
    assert new.id != old.id
    assert new.status == RunStatus.WAITING  # the wait at step 1 runs anew, not resumed
    clock.advance(hours=2)
    run_until_idle()
    new.refresh_from_db()
    old.refresh_from_db()
    assert (new.status, new.result) == (RunStatus.COMPLETED, 21)
    assert calls["a"] == 1  # nothing before step 1 ran again
    assert old.status == RunStatus.FAILED  # the old run's end stays true
    assert types(old)[-1] == "run-restarted"
    first = Event.objects.get(stream_id=str(new.id), version=1)
    assert first.payload["restart"]["run"] == str(old.id)
    assert first.payload["restart"]["step"] == "1"
    assert first.payload["restart"]["by"] == "ops"
    marker = Event.objects.filter(stream_id=str(old.id)).order_by("-version").first()
    assert marker is not None
    assert (marker.payload["run"], marker.created_by) == (str(new.id), "ops")


def test_a_restart_has_a_key_of_its_own_and_the_old_key_keeps_the_old_run(registry, clock):
    define_workflow("once", steps=[s.return_(lambda ctx: ctx.event.payload["n"])])
    old = start_workflow("once", payload={"n": 3}, idempotency_key="order-3")
    first = restart_run(old.id, from_step="0", reason="again")
    second = restart_run(old.id, from_step="0")
    assert (first.idempotency_key, second.idempotency_key) == (
        "order-3#restart-1",
        "order-3#restart-2",
    )
    assert first.result == second.result == 3
    assert start_workflow("once", payload={"n": 3}, idempotency_key="order-3").id == old.id


def test_the_plan_lists_each_side_effect_that_happens_again_with_its_key(registry, clock, settings):
    settings.KUMIFLOW_ALLOW_PRIVATE_WEBHOOK_URLS = True
    define_workflow(
        "notify",
        steps=[
            s.compute("order", lambda ctx: {"id": 9}),
            s.webhook_send("https://crm.example.com/hook", body={"o": 9}, name="hook"),
            s.task("invoice", shop_tasks.double, args=lambda ctx: {"n": 2}),
            s.return_(lambda ctx: ctx.steps["invoice"]),
        ],
    )
    old = start_workflow("notify")
    run_until_idle(dispatch=False)
    old.refresh_from_db()
    assert old.status == RunStatus.COMPLETED
    plan = restart_plan(old.id, "1")
    assert [(r.path, r.what, r.key) for r in plan.repeats] == [
        ("1", "webhook", "new"),
        ("2", "task", "new"),
    ]
    assert plan.carried == ["order"]
    new = restart_run(old.id, from_step="1")
    run_until_idle(dispatch=False)
    new.refresh_from_db()
    assert (new.status, new.result) == (RunStatus.COMPLETED, 4)
    # New rows (new ids: new idempotency keys); the old run's stay its own.
    assert Dispatch.objects.filter(run_id=new.id).count() == 1
    assert Dispatch.objects.filter(run_id=old.id).count() == 1
    assert StepTask.objects.filter(run_id=new.id).get().id != (
        StepTask.objects.filter(run_id=old.id).get().id
    )


def test_a_compensated_run_is_not_retried_but_started_again(registry, clock):
    undone = []
    define_workflow(
        "order",
        steps=[
            s.compute(
                "charge",
                lambda ctx: "charged",
                compensate=[s.compute("refund", lambda ctx: undone.append(1))],
            ),
            s.wait("PT1H"),
            s.compute("ship", lambda ctx: 1 / 0),
        ],
    )
    old = start_workflow("order")
    clock.advance(hours=2)
    run_until_idle()
    old.refresh_from_db()
    assert (old.status, old.compensation, undone) == (RunStatus.FAILED, "compensated", [1])
    assert "compensated" in (refuse_retry(old) or "")
    with pytest.raises(InvalidRunState, match="compensated"):
        retry_run(old.id)
    assert [c.path for c in restart_plan(old.id).choices] == ["0"]
    assert "compensated" in (refuse_restart(old, "1") or "")
    assert refuse_restart(old, "0") is None
    new = restart_run(old.id, from_step="0", reason="start again")
    assert new.status == RunStatus.WAITING
    assert new.state["steps"] == {"charge": "charged"}  # it ran anew


def test_a_restart_into_a_branch_runs_the_rest_of_that_branch_only(registry, clock):
    ran: list[str] = []
    define_workflow(
        "branchy",
        steps=[
            s.compute("a", lambda ctx: _note(ran, "a", True)),
            s.branch(
                lambda ctx: ctx.steps["a"],
                then=[s.wait("PT1H"), s.compute("b", lambda ctx: _note(ran, "b", 2))],
                else_=[s.compute("c", lambda ctx: _note(ran, "c", 3))],
            ),
            s.return_(lambda ctx: ctx.steps["b"]),
        ],
    )
    old = start_workflow("branchy")
    clock.advance(hours=2)
    run_until_idle()
    ran.clear()
    plan = restart_plan(old.id, "1.then.1")
    assert plan.refusal is None
    new = restart_run(old.id, from_step="1.then.1")
    assert (new.status, new.result, ran) == (RunStatus.COMPLETED, 2, ["b"])


def test_a_step_inside_a_loop_is_not_a_restart_point(registry, clock):
    define_workflow(
        "loop",
        steps=[
            s.for_each(lambda ctx: [1, 2], "i", [s.compute("x", lambda ctx: ctx.scope["i"])]),
            s.return_(1),
        ],
    )
    old = start_workflow("loop")
    assert "inside the for_each step at 0" in (refuse_restart(old, "0.do.0") or "")
    assert "no step" in (refuse_restart(old, "7") or "")
    define_workflow("sleepy", steps=[s.wait("P1D")])
    waiting = start_workflow("sleepy")
    assert "only failed, cancelled or completed" in (refuse_restart(waiting, "0") or "")
    with pytest.raises(InvalidRunState, match="only failed, cancelled or completed"):
        restart_run(waiting.id, from_step="0")


def test_a_deferred_workflow_restarts_on_the_worker_at_its_step(registry, clock):
    calls = {"a": 0}
    define_workflow(
        "later",
        start_mode="deferred",
        steps=[
            s.compute("a", lambda ctx: _count(calls, "a", 5)),
            s.compute("b", lambda ctx: ctx.steps["a"] * 2),
            s.return_(lambda ctx: ctx.steps["b"]),
        ],
    )
    old = start_workflow("later")
    run_until_idle()
    new = restart_run(old.id, from_step="1")
    assert new.status == RunStatus.PENDING
    run_until_idle()
    new.refresh_from_db()
    assert (new.status, new.result, calls["a"]) == (RunStatus.COMPLETED, 10, 1)


def test_the_runs_own_definition_or_the_current_one(registry, clock):
    define_workflow("crm", steps=[s.compute("a", lambda ctx: 1), s.return_("v1")])
    old = start_workflow("crm")
    registry.unregister("crm")
    define_workflow("crm", steps=[s.compute("a", lambda ctx: 1), s.return_("v2")])
    plan = restart_plan(old.id, "1")
    assert "no longer registered" in (plan.refusal or "")
    with pytest.raises(UnknownWorkflow):
        restart_run(old.id, from_step="1")
    current = restart_plan(old.id, "1", definition="current")
    assert current.refusal is None and current.definition_changed
    assert "the definition changed since the run started" in current.notes
    assert restart_run(old.id, from_step="1", definition="current").result == "v2"


def test_the_async_twin(registry, clock):
    define_workflow("once", steps=[s.return_(1)])
    old = start_workflow("once")
    new = async_to_sync(arestart_run)(old.id, from_step="0", by="ann", reason="x")
    assert new.result == 1


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_two_restarts_of_one_run_at_once_make_two_runs_with_keys_of_their_own(registry):
    """The first holds the old run's row; the second waits for it, then counts
    the first restart: two runs, #restart-1 and #restart-2, no unique clash."""
    import threading

    from django.db import transaction

    from tests.races import in_thread, wait_until_blocked_or_done

    define_workflow("once", steps=[s.return_(lambda ctx: ctx.event.payload["n"])])
    old = start_workflow("once", payload={"n": 1}, idempotency_key="k")
    holding, release = threading.Event(), threading.Event()

    def first() -> None:
        with transaction.atomic():
            restart_run(old.id, from_step="0", by="ann")
            holding.set()
            release.wait(30)

    one, one_errors = in_thread(first)
    assert holding.wait(30)
    two, two_errors = in_thread(lambda: restart_run(old.id, from_step="0", by="bob"))
    assert wait_until_blocked_or_done(two) == "blocked"
    release.set()
    one.join(30)
    two.join(30)
    assert (one_errors, two_errors) == ([], [])
    from kumiflow_django.models import WorkflowRun

    keys = sorted(
        str(k)
        for k in WorkflowRun.objects.exclude(pk=old.pk).values_list("idempotency_key", flat=True)
    )
    assert keys == ["k#restart-1", "k#restart-2"]
    assert types(old).count("run-restarted") == 2


def test_a_step_kind_of_the_project_is_said_to_repeat(registry, clock):
    from kumiflow_django import StepKind, register_step_kind
    from kumiflow_django.definition.step import Step, step_kinds

    class Ping(StepKind):
        kind = "tests.ping"

        def execute(self, step, ctx, path, resume):
            return "pong"

    with step_kinds.isolated():
        register_step_kind(Ping())
        define_workflow("pinger", steps=[s.compute("a", lambda ctx: 1), Step("tests.ping", "p")])
        old = start_workflow("pinger")
        plan = restart_plan(old.id, "1")
    assert [(r.what, r.key) for r in plan.repeats] == [("tests.ping step", "none")]


def test_a_cancelled_run_restarts_at_the_step_it_waited_at(registry, clock):
    define_workflow(
        "approval",
        steps=[
            s.compute("order", lambda ctx: "A-1"),
            s.wait_for_event("approved", name="ok"),
            s.return_(lambda ctx: [ctx.steps["order"], ctx.steps["ok"]["timed_out"]]),
        ],
    )
    old = start_workflow("approval")
    cancel_run(old.id, reason="the approver left")
    assert [c.path for c in restart_plan(old.id).choices] == ["0", "1"]
    new = restart_run(old.id, from_step="1")
    assert (new.status, new.state["steps"]) == (RunStatus.WAITING_EVENT, {"order": "A-1"})


def test_two_long_keys_that_share_a_prefix_restart_as_two_runs(registry, clock):
    """A key at the column's limit is shortened to fit ``#restart-<n>``; two keys
    that differ only in their last characters must not shorten to one key (the
    second restart would be swallowed by the first one's run)."""
    from kumiflow_django.engine.starting import MAX_KEY_LENGTH

    define_workflow("once", steps=[s.return_(lambda ctx: ctx.event.payload["n"])])
    stem = "order-" + "x" * (MAX_KEY_LENGTH - 8)
    a = start_workflow("once", payload={"n": 1}, idempotency_key=stem + "-a")
    b = start_workflow("once", payload={"n": 2}, idempotency_key=stem + "-b")
    assert len(a.idempotency_key or "") == MAX_KEY_LENGTH

    from_a = restart_run(a.id, from_step="0")
    from_b = restart_run(b.id, from_step="0")

    assert from_b.id != from_a.id
    assert from_b.result == 2
    assert len(from_b.idempotency_key or "") <= MAX_KEY_LENGTH
    assert from_a.idempotency_key != from_b.idempotency_key
    assert restart_plan(b.id, "0").idempotency_key not in (
        from_a.idempotency_key,
        from_b.idempotency_key,
    )


def test_a_key_taken_by_a_start_of_its_own_is_not_the_restart(registry, clock):
    """A run started with the key a restart would derive (``k#restart-1``) is not
    the restart: the restart is a new run with the next free key, and the old
    run's ``run-restarted`` names that run."""
    define_workflow("once", steps=[s.return_(lambda ctx: ctx.event.payload["n"])])
    old = start_workflow("once", payload={"n": 1}, idempotency_key="k")
    squatter = start_workflow("once", payload={"n": 99}, idempotency_key="k#restart-1")

    assert restart_plan(old.id, "0").idempotency_key == "k#restart-2"
    new = restart_run(old.id, from_step="0")

    assert new.id != squatter.id
    assert (new.idempotency_key, new.result) == ("k#restart-2", 1)
    restarted = "kumiflow.workflow.run-restarted"
    marker = Event.objects.get(stream_id=str(old.id), type=restarted).payload
    assert marker["run"] == str(new.id)


def test_a_restarted_run_restarted_again_keeps_what_the_first_restart_carried(registry, clock):
    """Run 1 computes ``a``, waits, then fails at ``b``; restarted at the wait
    (run 2 carries ``a``), it fails at ``b`` again; restarted at the wait again
    (run 3), it still has ``a``: the results carried into run 2 are its own."""
    calls, broken = {"a": 0, "b": 0}, {"yes": True}
    _flaky(calls, broken)
    first = start_workflow("flaky", payload={"order": 7})
    clock.advance(hours=2)
    run_until_idle()
    second = restart_run(first.id, from_step="1", reason="partner fixed?")
    clock.advance(hours=2)
    run_until_idle()
    second.refresh_from_db()
    assert second.status == RunStatus.FAILED

    plan = restart_plan(second.id, "1")
    assert plan.refusal is None, plan.refusal
    assert plan.carried == ["a"]
    broken["yes"] = False
    third = restart_run(second.id, from_step="1", reason="partner fixed")
    clock.advance(hours=2)
    run_until_idle()
    third.refresh_from_db()
    assert (third.status, third.result) == (RunStatus.COMPLETED, 21)
    assert calls["a"] == 1  # never ran again
    assert third.idempotency_key is None


def test_a_run_whose_trigger_event_was_erased_is_refused_by_the_pre_flight_too(registry, clock):
    """The trigger is read again by a restart: erased (personal data), the run
    cannot restart, and the pre-flight (which the console's button asks) says
    so, rather than offering a restart that then fails."""
    from kumiflow_django import append_event, erase_stream, on_event

    def boom(ctx):
        raise RuntimeError("down")

    define_workflow("onboard", trigger=on_event("person.joined"), steps=[s.compute("x", boom)])
    append_event("person-1", "person.joined", {"name": "Ann"})
    run_until_idle()
    from kumiflow_django.models import WorkflowRun

    old = WorkflowRun.objects.get(workflow="onboard")
    assert old.status == RunStatus.FAILED and old.trigger_position is not None
    assert restart_plan(old.id, "0").refusal is None
    erase_stream("person-1")

    assert "no longer in the log" in (restart_plan(old.id, "0").refusal or "")
    assert "no longer in the log" in (refuse_restart(old, "0") or "")
    with pytest.raises(InvalidRunState, match="no longer in the log"):
        restart_run(old.id, from_step="0")


def test_a_child_run_restarts_as_a_run_of_its_own_and_its_parent_keeps_its_end(registry, clock):
    broken = {"yes": True}

    def kid(ctx):
        if broken["yes"]:
            raise RuntimeError("kid down")
        return ctx.event.payload["n"] * 2

    define_workflow("kid", steps=[s.compute("k", kid), s.return_(lambda ctx: ctx.steps["k"])])
    define_workflow(
        "parent",
        steps=[s.child("c", "kid", input={"n": 4}), s.return_(lambda ctx: ctx.steps["c"])],
    )
    parent = start_workflow("parent")
    run_until_idle()
    parent.refresh_from_db()
    from kumiflow_django.models import WorkflowRun

    child = WorkflowRun.objects.get(workflow="kid")
    assert (parent.status, child.status) == (RunStatus.FAILED, RunStatus.FAILED)

    plan = restart_plan(child.id, "0")
    assert plan.refusal is None
    assert any("child of run" in note for note in plan.notes)
    broken["yes"] = False
    new = restart_run(child.id, from_step="0", reason="kid fixed")
    run_until_idle()
    new.refresh_from_db()
    parent.refresh_from_db()
    assert (new.status, new.result, new.parent_id) == (RunStatus.COMPLETED, 8, None)
    assert parent.status == RunStatus.FAILED  # its end stays: nobody told it otherwise
