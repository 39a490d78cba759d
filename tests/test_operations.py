"""cancel_run, wake_run and retry_run: operating runs through public functions."""

from __future__ import annotations

import pytest

from kumiflow_django import (
    InvalidRunState,
    RunNotFound,
    append_event,
    cancel_run,
    define_workflow,
    on_event,
    retry_run,
    start_workflow,
    wake_run,
)
from kumiflow_django import steps as s
from kumiflow_django.models import Dispatch, RunStatus
from kumiflow_django.testing import run_until_idle
from tests.helpers import only_run, types

pytestmark = pytest.mark.django_db


def test_cancel_a_waiting_run_and_its_pending_dispatches(registry, clock):
    define_workflow(
        "slow", steps=[s.mail_send(to="a@x.io", subject="s", body="b"), s.wait("P1D"), s.return_(1)]
    )
    run = start_workflow("slow")
    cancel_run(run.id, reason="customer left")
    clock.advance(days=2)
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.last_error) == (RunStatus.CANCELLED, "customer left")
    assert types(run) == ["run-started", "step.waiting", "run-cancelled"]
    assert Dispatch.objects.get().status == "cancelled"
    with pytest.raises(InvalidRunState, match="only unfinished runs"):
        cancel_run(run.id)


def test_operations_name_a_missing_run():
    with pytest.raises(RunNotFound):
        wake_run("00000000-0000-0000-0000-000000000000")


def test_wake_ends_a_timer_early(registry, clock):
    define_workflow("slow", steps=[s.wait("P7D"), s.return_("woke")])
    run = start_workflow("slow")
    wake_run(run.id)
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, "woke")


def test_wake_times_out_a_wait_for_an_event_now(registry, clock):
    define_workflow(
        "patient",
        steps=[s.wait_for_event("reply", name="r"), s.return_(lambda ctx: ctx.steps["r"])],
    )
    run = start_workflow("patient")
    wake_run(run.id)
    run_until_idle()
    run.refresh_from_db()
    assert run.result == {"timed_out": True, "type": "reply", "payload": None}
    with pytest.raises(InvalidRunState, match="only waiting runs"):
        wake_run(run.id)


def test_retry_runs_the_failed_segment_again_and_nothing_before_it(registry, clock):
    calls = {"first": 0, "second": 0}
    broken = {"yes": True}

    def first(payload):
        calls["first"] += 1

    def second(payload):
        calls["second"] += 1
        if broken["yes"]:
            raise RuntimeError("the partner API is down")
        return "ok"

    define_workflow(
        "two-halves",
        trigger=on_event("go"),
        steps=[
            s.call(None, first),
            s.wait("PT1M"),
            s.call("out", second),
            s.return_(lambda ctx: ctx.steps["out"]),
        ],
    )
    append_event("g", "go")
    clock.advance(minutes=1)
    run_until_idle()
    run = only_run()
    assert run.status == RunStatus.FAILED
    broken["yes"] = False
    retry_run(run.id)
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.result, run.reason, run.last_error) == (
        RunStatus.COMPLETED,
        "ok",
        "",
        "",
    )
    assert calls == {"first": 1, "second": 2}
    assert types(run)[-4:] == ["run-failed", "run-retried", "step.resumed", "run-completed"]


def test_retry_after_a_failure_in_the_first_segment_starts_over(registry, clock):
    state = {"fail": True}

    def maybe(payload):
        if state["fail"]:
            raise ValueError("bad")

    define_workflow("first", steps=[s.call(None, maybe), s.return_("done")])
    run = start_workflow("first")
    assert run.status == RunStatus.FAILED
    state["fail"] = False
    retry_run(run.id)
    run_until_idle()
    run.refresh_from_db()
    assert run.result == "done"
    with pytest.raises(InvalidRunState, match="only failed runs"):
        retry_run(run.id)


def test_retry_redelivers_the_event_that_woke_the_failed_segment(registry, clock):
    state = {"fail": True}

    def check(payload):
        if state["fail"]:
            raise ValueError("not yet")
        return payload

    define_workflow(
        "paid",
        trigger=on_event("order.placed"),
        steps=[
            s.wait_for_event(
                "payment", match={"payload.order": lambda ctx: ctx.event.payload["order"]}, name="p"
            ),
            s.call("checked", check, lambda ctx: ctx.steps["p"]["payload"]),
            s.return_(lambda ctx: ctx.steps["checked"]),
        ],
    )
    append_event("o", "order.placed", {"order": 5})
    append_event("p", "payment", {"order": 5, "cents": 99})
    run = only_run()
    assert run.status == RunStatus.FAILED
    state["fail"] = False
    retry_run(run.id)
    run_until_idle()
    run.refresh_from_db()
    assert run.result == {"order": 5, "cents": 99}


def test_retry_on_the_current_definition_after_a_definition_change(registry, clock):
    define_workflow("evolving", trigger=on_event("go"), steps=[s.wait("PT1M"), s.return_("old")])
    append_event("g", "go")
    registry.unregister("evolving")
    define_workflow(
        "evolving",
        trigger=on_event("go"),
        on_change="fail",
        steps=[s.wait("PT1M"), s.return_("new")],
    )
    clock.advance(minutes=1)
    run_until_idle()
    run = only_run()
    assert run.reason == "workflow_definition_changed"

    retry_run(run.id)
    run_until_idle()
    run.refresh_from_db()
    assert run.reason == "workflow_definition_changed", "a plain retry fails the same way"

    retry_run(run.id, adopt_current_definition=True)
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, "new")


def test_the_kumiflow_run_command(registry, clock, capsys):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    define_workflow("slow", steps=[s.wait("P1D"), s.return_("woke")])
    run = start_workflow("slow")
    call_command("kumiflow_run", "wake", str(run.id))
    run_until_idle()
    run.refresh_from_db()
    assert run.result == "woke"
    assert f"{run.id}: wake done" in capsys.readouterr().out

    with pytest.raises(CommandError, match="2 of 2 run"):
        call_command("kumiflow_run", "cancel", str(run.id), "not-a-uuid", "--reason", "x")
    err = capsys.readouterr().err
    assert "is completed" in err and "'not-a-uuid' is not a run id" in err
