"""Starting runs from saved domain events and by hand (B3, B6-B10, idempotency,
failures that keep the domain write)."""

from __future__ import annotations

import pytest
from django.db import transaction

from kumiflow_django import (
    InvalidEvent,
    UnknownWorkflow,
    append_event,
    define_workflow,
    load_stream,
    on_event,
    start_workflow,
)
from kumiflow_django import steps as s
from kumiflow_django.models import Dispatch, Event, RunStatus, WorkflowRun
from testproject.shop.models import Customer
from tests.helpers import dispatches, only_run, run_events, types

pytestmark = pytest.mark.django_db


def test_a_return_only_workflow_writes_started_then_completed_B6(registry):
    wf = define_workflow("demo", trigger=on_event("demo.fired"), steps=[s.return_({"ok": 1})])

    trigger = append_event("src-1", "demo.fired", {"signal": "abc"})

    run = only_run()
    assert run.status == RunStatus.COMPLETED
    assert run.result == {"ok": 1}
    assert types(run) == ["run-started", "run-completed"]
    started = run_events(run)[0]
    assert started.payload["fingerprint"] == wf.fingerprint == run.fingerprint
    assert started.payload["trigger"] == {
        "type": "demo.fired",
        "position": trigger.position,
        "event_id": str(trigger.event_id),
        "stream_id": "src-1",
        "version": 1,
    }
    assert "payload" not in started.payload["trigger"], "a reference, never a copy"


def test_a_wait_suspends_with_the_fingerprint_B7(registry, clock):
    wf = define_workflow(
        "sleepy", trigger=on_event("demo.fired"), steps=[s.wait("PT1H"), s.return_(None)]
    )
    append_event("src-1", "demo.fired")

    run = only_run()
    assert types(run) == ["run-started", "step.waiting"]
    assert run.status == RunStatus.WAITING
    assert run.fingerprint == wf.fingerprint
    assert run.wake_at == clock.now() + __import__("datetime").timedelta(hours=1)


def test_idempotency_key_is_recorded_B8(registry):
    define_workflow("keyed", trigger=on_event("demo.fired"), idempotency_key="id:abc", steps=[])
    append_event("src-1", "demo.fired")
    run = only_run()
    assert run.idempotency_key == "id:abc"
    assert run_events(run)[0].payload["idempotency_key"] == "id:abc"


def test_webhook_delivery_requests_exactly_one_dispatch_B3():
    append_event(
        "batch-7",
        "data.processed",
        {"webhook_url": "https://hooks.example.com/in", "data": {"id": 7}},
    )
    run = only_run("webhook-delivery")
    assert run.status == RunStatus.COMPLETED
    [dispatch] = dispatches(run)
    assert dispatch.kind == "webhook"
    assert dispatch.request["url"] == "https://hooks.example.com/in"
    assert dispatch.request["body"] == {"id": 7}
    assert dispatch.request["method"] == "POST"
    requested = load_stream(str(dispatch.id))
    assert [e.type for e in requested] == ["kumiflow.step.dispatch-requested"]


@pytest.mark.parametrize(
    ("user_id", "subject"), [("active-42", "Engagement tips"), ("cold-1", "Getting started")]
)
def test_onboarding_start_suspends_after_the_welcome_mail_B9_B10(user_id, subject):
    append_event(f"user-{user_id}", "user.signed-up", {"user_id": user_id, "email": "u@x.io"})

    run = only_run("user-onboarding")
    assert types(run) == ["run-started", "step.waiting"]
    assert run.cursor == [1]
    assert run.idempotency_key == f"onboarding:{user_id}"
    [welcome] = dispatches(run)
    assert welcome.request["subject"] == "Welcome!"
    assert welcome.request["to"] == ["u@x.io"]
    for event in run_events(run):
        assert "email" not in str(event.payload), "the run stream holds no trigger payload"


def test_a_second_start_with_the_same_key_returns_the_first_run_and_runs_nothing(registry):
    calls = []
    define_workflow(
        "once",
        trigger=on_event("order.placed"),
        idempotency_key=lambda e: f"order:{e.payload['order']}",
        steps=[s.compute("n", lambda ctx: calls.append(1) or len(calls))],  # type: ignore[func-returns-value]
    )
    append_event("order-1", "order.placed", {"order": 1})
    append_event("order-1b", "order.placed", {"order": 1})
    append_event("order-2", "order.placed", {"order": 2})

    assert WorkflowRun.objects.count() == 2
    assert calls == [1, 1]
    first = WorkflowRun.objects.get(idempotency_key="order:1")
    assert start_workflow("once", idempotency_key="order:1").id == first.id
    assert calls == [1, 1]


def test_a_filter_decides_whether_a_run_starts(registry):
    define_workflow(
        "big-orders",
        trigger=on_event("order.placed", filter=lambda e: e.payload["total"] > 100),
        steps=[],
    )
    append_event("o-1", "order.placed", {"total": 50})
    assert not WorkflowRun.objects.exists()
    append_event("o-2", "order.placed", {"total": 500})
    assert WorkflowRun.objects.count() == 1


def test_every_matching_workflow_starts(registry):
    define_workflow("a", trigger=on_event("thing.done"), steps=[])
    define_workflow("b", trigger=on_event("thing.done"), steps=[])
    define_workflow("c", trigger=on_event("other.thing"), steps=[])
    append_event("t-1", "thing.done")
    assert sorted(WorkflowRun.objects.values_list("workflow", flat=True)) == ["a", "b"]


def test_a_failing_step_fails_the_run_and_rolls_back_its_writes_but_not_the_domain_event(
    registry,
):
    define_workflow(
        "breaks",
        trigger=on_event("customer.created"),
        steps=[
            s.model.create("c", "shop.Customer", {"user_id": "from-workflow", "email": "a@b.c"}),
            s.branch(lambda ctx: True, then=[s.compute("boom", lambda ctx: 1 / 0)]),
        ],
    )
    with transaction.atomic():
        Customer.objects.create(user_id="domain", email="d@x.io")
        append_event("c-1", "customer.created")

    run = only_run()
    assert run.status == RunStatus.FAILED
    assert run.reason == "step_failed"
    assert run.last_error.startswith("ZeroDivisionError at step 1.then.0 (compute 'boom')")
    assert run.cursor == [1, "then", 0]
    assert types(run) == ["run-started", "run-failed"]
    assert list(Customer.objects.values_list("user_id", flat=True)) == ["domain"]
    assert Event.objects.filter(type="customer.created").count() == 1


@pytest.mark.parametrize(
    ("steps", "error"),
    [
        ([s.compute("x", lambda ctx: ctx.event.payload["missing"])], "KeyError at step 0"),
        ([s.compute("x", lambda ctx: object())], "TypeError at step 0 (compute 'x')"),
        ([s.for_each(lambda ctx: "abc", "c", do=[])], "TypeError at step 0 (for_each)"),
        ([s.return_(lambda ctx: {1, 2})], "TypeError at step return"),
        ([s.call("r", "no.such.handler")], "LookupError at step 0 (call 'r')"),
    ],
)
def test_bad_input_ends_the_run_failed_with_path_and_exception_class(registry, steps, error):
    define_workflow("fragile", trigger=on_event("go"), steps=steps)
    append_event("g-1", "go", {"n": 1})
    run = only_run()
    assert run.status == RunStatus.FAILED
    assert run.last_error.startswith(error)
    assert "Traceback" not in run.last_error


def test_a_raising_filter_or_key_fails_the_run_without_losing_the_event(registry):
    define_workflow(
        "keyless", trigger=on_event("go"), idempotency_key=lambda e: e.payload["k"], steps=[]
    )
    append_event("g-1", "go", {})
    run = only_run()
    assert run.status == RunStatus.FAILED
    assert "KeyError in the trigger" in run.last_error
    assert Event.objects.filter(type="go").count() == 1


def test_deferred_start_only_records_the_run(registry, clock):
    from kumiflow_django.testing import run_until_idle

    define_workflow(
        "later",
        trigger=on_event("go"),
        start_mode="deferred",
        steps=[s.compute("x", lambda ctx: 2), s.return_(lambda ctx: ctx.steps["x"])],
    )
    append_event("g-1", "go")
    run = only_run()
    assert run.status == RunStatus.PENDING
    assert types(run) == ["run-started"]

    run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.result == 2
    assert types(run) == ["run-started", "step.resumed", "run-completed"]


def test_start_workflow_by_hand(registry):
    define_workflow("manual", steps=[s.return_(lambda ctx: ctx.event.payload["n"] * 2)])
    run = start_workflow("manual", payload={"n": 21}, tenant="acme")
    assert run.result == 42
    assert run.tenant_id == "acme"
    assert run.input == {"n": 21}
    assert run_events(run)[0].tenant_id == "acme"


def test_start_workflow_bad_input(registry):
    define_workflow("manual", steps=[])
    with pytest.raises(UnknownWorkflow, match="nope"):
        start_workflow("nope")
    with pytest.raises(InvalidEvent, match="not JSON-serialisable"):
        start_workflow("manual", payload={"x": object()})
    assert not WorkflowRun.objects.exists()


def test_workflows_started_by_workflows_stop_at_the_depth_limit(registry, settings):
    settings.KUMIFLOW_MAX_START_DEPTH = 3
    define_workflow(
        "echo",
        trigger=on_event("ping"),
        steps=[s.append_event(lambda ctx: f"{ctx.event.stream_id}x", "ping")],
    )
    append_event("p", "ping")
    statuses = dict(WorkflowRun.objects.values_list("status", "reason").distinct())
    assert WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == 3
    assert statuses["failed"] == "start_depth_exceeded"


def test_run_events_are_reserved_for_the_engine():
    with pytest.raises(InvalidEvent, match="reserved"):
        append_event("x", "kumiflow.workflow.run-completed")
    assert not Dispatch.objects.exists()


def test_a_manual_start_uses_the_workflows_own_key(registry):
    define_workflow(
        "keyed-by-payload",
        idempotency_key=lambda event: f"export:{event.payload['month']}",
        steps=[],
    )
    first = start_workflow("keyed-by-payload", payload={"month": "2026-11"})
    assert first.idempotency_key == "export:2026-11"
    assert start_workflow("keyed-by-payload", payload={"month": "2026-11"}).id == first.id
    with pytest.raises(InvalidEvent, match="cannot be resolved from the payload: KeyError"):
        start_workflow("keyed-by-payload", payload={})
