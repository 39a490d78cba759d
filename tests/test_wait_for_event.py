"""wait_for_event: matching, tenants, timeouts, look-back, and both wake modes."""

from __future__ import annotations

import datetime as dt

import pytest

from kumiflow_django import append_event, define_workflow, on_event
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus, RunWait, WorkflowRun
from kumiflow_django.workers.resume import ResumeLoop
from tests.helpers import only_run, run_events, types

pytestmark = pytest.mark.django_db


@pytest.fixture
def order_workflow(registry):
    return define_workflow(
        "order",
        trigger=on_event("order.placed"),
        steps=[
            s.wait_for_event(
                "payment.received",
                match={"payload.order_id": lambda ctx: ctx.event.payload["order_id"]},
                timeout="P3D",
                name="payment",
            ),
            s.return_(lambda ctx: ctx.steps["payment"]),
        ],
    )


def place(order_id, tenant=None):
    append_event(f"order-{order_id}", "order.placed", {"order_id": order_id}, tenant=tenant)
    return WorkflowRun.objects.filter(tenant_id=tenant or "default").latest("started_at")


def test_the_awaited_event_wakes_its_run_at_once_and_becomes_the_step_result(order_workflow, clock):
    run = place(42)
    assert run.status == RunStatus.WAITING_EVENT
    (wait,) = RunWait.objects.filter(run_id=run.id)
    assert (wait.branch, wait.event_type, wait.match) == (
        "",
        "payment.received",
        {"payload.order_id": 42},
    )
    assert run.wake_at == clock.now() + dt.timedelta(days=3)

    paid = append_event("pay-1", "payment.received", {"order_id": 42, "cents": 500})

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.result["timed_out"] is False
    assert run.result["payload"] == {"order_id": 42, "cents": 500}
    assert run.result["position"] == paid.position
    resumed = run_events(run)[2]
    assert resumed.payload["by"] == "event"
    assert resumed.payload["event"]["position"] == paid.position


def test_a_non_matching_event_is_ignored(order_workflow):
    run = place(42)
    append_event("pay-2", "payment.received", {"order_id": 43})
    append_event("pay-3", "payment.received", {"cents": 1})
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_EVENT
    assert types(run) == ["run-started", "step.waiting-for-event"]


def test_only_events_of_the_runs_own_tenant_match(order_workflow):
    run = place(42, tenant="acme")
    append_event("pay-x", "payment.received", {"order_id": 42}, tenant="globex")
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_EVENT
    append_event("pay-y", "payment.received", {"order_id": 42}, tenant="acme")
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED


def test_a_timeout_gives_a_timed_out_result_and_the_run_goes_on(order_workflow, clock):
    run = place(42)
    clock.advance(days=3)
    assert ResumeLoop().run_once() == 1
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.result == {"timed_out": True, "type": "payment.received", "payload": None}
    assert run_events(run)[2].payload["by"] == "timeout"


def test_an_event_appended_before_the_run_reached_the_wait_is_not_lost(registry, clock):
    define_workflow(
        "late-wait",
        trigger=on_event("order.placed"),
        steps=[
            s.wait("P1D"),
            s.wait_for_event(
                "order.confirmed",
                match={"stream_id": lambda ctx: ctx.event.stream_id},
                name="confirmation",
            ),
            s.return_(lambda ctx: ctx.steps["confirmation"]["payload"]),
        ],
    )
    append_event("order-7", "order.placed")
    append_event("order-7", "order.confirmed", {"by": "phone"})  # while the run sleeps
    append_event("order-8", "order.confirmed", {"by": "other order"})
    clock.advance(days=1)
    ResumeLoop().run_once()
    run = only_run()
    assert (run.status, run.result) == (RunStatus.COMPLETED, {"by": "phone"})


def test_an_event_from_before_the_run_started_does_not_count(registry):
    append_event("order-7", "order.confirmed", {"by": "old"})
    define_workflow(
        "strict",
        trigger=on_event("order.placed"),
        steps=[
            s.wait_for_event(
                "order.confirmed", match={"stream_id": lambda ctx: ctx.event.stream_id}
            )
        ],
    )
    append_event("order-7", "order.placed")
    assert only_run().status == RunStatus.WAITING_EVENT


def test_repeated_waits_each_consume_their_own_event(registry):
    define_workflow(
        "chat",
        trigger=on_event("chat.opened"),
        steps=[
            s.for_each(
                lambda ctx: [1, 2],
                "turn",
                do=[
                    s.wait_for_event(
                        "chat.message",
                        match={"payload.chat": lambda ctx: ctx.event.stream_id},
                        name="msg",
                    ),
                    s.append_event(
                        lambda ctx: "log",
                        "chat.logged",
                        payload=lambda ctx: {"text": ctx.steps["msg"]["payload"]["text"]},
                    ),
                ],
            ),
        ],
    )
    append_event("c1", "chat.opened")
    append_event("m1", "chat.message", {"chat": "c1", "text": "hello"})
    run = only_run()
    assert run.status == RunStatus.WAITING_EVENT, "the second turn waits for a new message"
    append_event("m2", "chat.message", {"chat": "c1", "text": "bye"})
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    from kumiflow_django import load_stream

    assert [e.payload["text"] for e in load_stream("log")] == ["hello", "bye"]


def test_worker_wake_mode_leaves_the_resume_to_the_loop(order_workflow, settings):
    settings.KUMIFLOW_EVENT_WAKE = "worker"
    run = place(42)
    paid = append_event("pay-1", "payment.received", {"order_id": 42})
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_EVENT
    assert run.matched_position == paid.position
    assert types(run)[-1] == "event-matched"
    assert ResumeLoop().run_once() == 1
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.result["position"] == paid.position


def test_a_match_on_several_fields(registry):
    define_workflow(
        "pair",
        trigger=on_event("go"),
        steps=[
            s.wait_for_event(
                "reply",
                match={"payload.a": 1, "metadata.channel": lambda ctx: "mail"},
            )
        ],
    )
    append_event("g", "go")
    append_event("r1", "reply", {"a": 1}, metadata={"channel": "sms"})
    assert only_run().status == RunStatus.WAITING_EVENT
    append_event("r2", "reply", {"a": 1}, metadata={"channel": "mail"})
    assert only_run().status == RunStatus.COMPLETED


def _as_seen(event):
    return {
        "position": event.position,
        "event_id": str(event.event_id),
        "tenant_id": event.tenant_id,
        "stream_type": event.stream_type,
        "stream_id": event.stream_id,
        "version": event.version,
        "type": event.type,
        "payload": event.payload,
        "metadata": event.metadata,
        "created_at": event.created_at.isoformat(),
        "created_by": event.created_by,
    }


@pytest.mark.parametrize("tenant", ["default", "acme"])
def test_each_run_an_event_wakes_reads_its_own_trigger_after_the_wake(registry, tenant):
    """A run woken by an event reads its own trigger event, every column of
    it, each run its own (two runs woken by one event, in one tenant)."""
    from kumiflow_django.models import Event

    define_workflow(
        "grouped",
        trigger=on_event("order.placed"),
        steps=[
            s.wait_for_event(
                "group.closed", match={"payload.group": lambda ctx: ctx.event.payload["group"]}
            ),
            s.return_(lambda ctx: _as_seen(ctx.event)),
        ],
    )
    placed = [
        append_event(
            f"order-{n}",
            "order.placed",
            {"group": "g", "n": n, "items": [n, {"deep": n}]},
            metadata={"channel": f"web-{n}"},
            tenant=tenant,
        )
        for n in (1, 2)
    ]
    append_event("g", "group.closed", {"group": "g"}, tenant=tenant)
    runs = {r.trigger_position: r for r in WorkflowRun.objects.filter(tenant_id=tenant)}
    for event in placed:
        run = runs[event.position]
        assert run.status == RunStatus.COMPLETED
        assert run.result == _as_seen(Event.objects.get(position=event.position))


def test_a_run_whose_trigger_was_erased_fails_when_its_event_wakes_it(order_workflow):
    from kumiflow_django import erase_stream

    run = place(42)
    assert erase_stream("order-42") == 1
    append_event("pay-1", "payment.received", {"order_id": 42})
    run.refresh_from_db()
    assert (run.status, run.reason) == (RunStatus.FAILED, "trigger_event_unavailable")
    assert not RunWait.objects.filter(run_id=run.id).exists()
