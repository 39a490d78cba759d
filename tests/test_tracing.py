"""OpenTelemetry traces, recorded with the SDK's in-memory exporter.

A run continues the trace of the code that started it: the trigger event
stores its trace context in its metadata, the run's first segment is a child
of it; later segments link to it (the request is long over when a timer
fires). Steps, deliveries, cron fires and task attempts have spans of their
own; webhooks carry ``traceparent``.
"""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from kumiflow_django import append_event, define_workflow, on_cron, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.cron.schedules import fire_schedule, sync_schedules
from kumiflow_django.models import Dispatch, Event, WorkflowRun
from kumiflow_django.observability import otel
from kumiflow_django.store import telemetry
from kumiflow_django.testing import run_until_idle
from tests.receiver import Receiver, Reply

pytestmark = pytest.mark.django_db


class Traces:
    """The spans the package made, and a tracer for the test's own "request"."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name.startswith(prefix)]

    def one(self, prefix: str) -> ReadableSpan:
        [found] = self.named(prefix)
        return found


@pytest.fixture
def traces():
    found = Traces()
    with telemetry.isolated():
        otel.install(tracer_provider=found.provider)
        yield found
    found.provider.shutdown()


def traceparent(span: trace.Span | ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def parent_ids(span: ReadableSpan) -> tuple[int, int] | None:
    return None if span.parent is None else (span.parent.trace_id, span.parent.span_id)


def linked(span: ReadableSpan) -> list[tuple[int, int]]:
    return [(link.context.trace_id, link.context.span_id) for link in span.links]


def attributes(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def signup(**kwargs):
    return define_workflow(
        "signup",
        trigger=on_event("user.signed-up"),
        version="2",
        steps=[s.compute("greet", lambda ctx: "hi"), s.compute("count", lambda ctx: 1)],
        **kwargs,
    )


def test_a_run_started_in_a_traced_request_continues_its_trace(registry, traces):
    signup()
    with traces.tracer.start_as_current_span("POST /signup") as request:
        event = append_event("u1", "user.signed-up", {"email": "a@example.com"}, tenant="acme")
    run = WorkflowRun.objects.get()

    # The trigger event stores the request's context; so does the run's start.
    assert event.metadata == {"traceparent": traceparent(request)}
    started = Event.objects.get(stream_id=str(run.id), version=1)
    assert started.metadata == {"traceparent": traceparent(request)}

    segment = traces.one("kumiflow.segment")
    assert segment.name == "kumiflow.segment signup"
    assert parent_ids(segment) == ids(traces.one("POST /signup"))
    assert attributes(segment) == {
        "kumiflow.run_id": str(run.id),
        "kumiflow.workflow": "signup",
        "kumiflow.version": "2",
        "kumiflow.tenant": "acme",
        "kumiflow.outcome": "completed",
    }
    steps = traces.named("kumiflow.step")
    assert [span.name for span in steps] == ["kumiflow.step greet", "kumiflow.step count"]
    for index, step in enumerate(steps):
        assert parent_ids(step) == ids(segment)
        assert attributes(step) == {
            "kumiflow.run_id": str(run.id),
            "kumiflow.workflow": "signup",
            "kumiflow.version": "2",
            "kumiflow.tenant": "acme",
            "kumiflow.step_path": str(index),
            "kumiflow.step_kind": "compute",
            "kumiflow.step_name": ["greet", "count"][index],
            "kumiflow.outcome": "ok",
        }


def test_without_an_active_trace_nothing_is_stored_and_the_segment_is_a_root(registry, traces):
    signup()
    event = append_event("u1", "user.signed-up", {})
    assert event.metadata == {}
    assert Event.objects.get(type="kumiflow.workflow.run-started").metadata == {}
    assert traces.one("kumiflow.segment").parent is None


def test_without_the_integration_an_active_trace_is_not_stored(registry):
    signup()
    provider = TracerProvider()
    with telemetry.isolated():
        telemetry.set_tracer(None)
        with provider.get_tracer("tests").start_as_current_span("POST /signup"):
            event = append_event("u1", "user.signed-up", {})
    assert event.metadata == {}


def test_a_trace_context_given_in_the_metadata_is_kept_and_continued(registry, traces):
    signup()
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with traces.tracer.start_as_current_span("consumer"):
        event = append_event("u1", "user.signed-up", {}, metadata={"traceparent": given})
    assert event.metadata == {"traceparent": given}
    segment = traces.one("kumiflow.segment")
    assert parent_ids(segment) == (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331)


def test_a_resume_days_later_is_a_trace_of_its_own_linked_to_the_origin(registry, traces, clock):
    define_workflow(
        "trial",
        trigger=on_event("trial.started"),
        steps=[s.compute("open", lambda ctx: 1), s.wait("P3D"), s.compute("close", lambda ctx: 2)],
    )
    with traces.tracer.start_as_current_span("POST /trial"):
        append_event("t1", "trial.started", {})
    request = traces.one("POST /trial")
    first = traces.one("kumiflow.segment")
    assert attributes(first)["kumiflow.outcome"] == "suspended"
    wait = [span for span in traces.named("kumiflow.step") if span.name == "kumiflow.step wait"]
    assert attributes(wait[0])["kumiflow.outcome"] == "suspended"

    traces.exporter.clear()
    clock.advance(days=3)
    assert run_until_idle().resumed == 1

    later = traces.one("kumiflow.segment")
    assert later.parent is None  # a root: the request ended three days ago
    assert linked(later) == [ids(request)]
    assert attributes(later)["kumiflow.wake"] == "timer"
    assert attributes(later)["kumiflow.outcome"] == "completed"
    [close] = traces.named("kumiflow.step close")
    assert parent_ids(close) == ids(later)
    assert attributes(close)["kumiflow.step_path"] == "2"


def awaiting():
    return define_workflow(
        "order",
        trigger=on_event("order.placed"),
        steps=[
            s.wait_for_event(
                "order.paid",
                match={"payload.order": lambda ctx: ctx.event.payload["order"]},
                timeout="P7D",
                name="paid",
            ),
            s.compute("ship", lambda ctx: 1),
        ],
    )


def test_an_event_appended_in_a_request_wakes_its_run_inside_that_request(registry, traces):
    awaiting()
    with traces.tracer.start_as_current_span("POST /orders"):
        append_event("o1", "order.placed", {"order": 1})
    with traces.tracer.start_as_current_span("POST /payments"):
        append_event("o1", "order.paid", {"order": 1})
    placed, paid = traces.one("POST /orders"), traces.one("POST /payments")
    first, woken = traces.named("kumiflow.segment")
    assert parent_ids(first) == ids(placed)
    assert parent_ids(woken) == ids(paid)  # inline: the request that woke it
    assert linked(woken) == [ids(placed)]  # and the run's origin
    assert attributes(woken)["kumiflow.wake"] == "event"


def test_a_worker_that_resumes_a_woken_run_links_the_origin_and_the_waking_event(
    registry, traces, settings
):
    settings.KUMIFLOW_EVENT_WAKE = "worker"
    awaiting()
    with traces.tracer.start_as_current_span("POST /orders"):
        append_event("o1", "order.placed", {"order": 1})
    with traces.tracer.start_as_current_span("POST /payments"):
        append_event("o1", "order.paid", {"order": 1})
    assert run_until_idle().resumed == 1
    placed, paid = traces.one("POST /orders"), traces.one("POST /payments")
    _, woken = traces.named("kumiflow.segment")
    assert woken.parent is None
    assert linked(woken) == [ids(placed), ids(paid)]


def test_a_deferred_start_run_by_a_worker_is_a_child_of_the_origin(registry, traces):
    signup(start_mode="deferred")
    with traces.tracer.start_as_current_span("POST /signup"):
        append_event("u1", "user.signed-up", {})
    request = traces.one("POST /signup")
    recorded = traces.one("kumiflow.segment")
    assert attributes(recorded)["kumiflow.outcome"] == "deferred"
    traces.exporter.clear()

    assert run_until_idle().resumed == 1
    first = traces.one("kumiflow.segment")
    assert parent_ids(first) == ids(request)
    assert first.links == ()
    assert attributes(first)["kumiflow.wake"] == "start"


def test_a_failing_step_marks_its_span_and_the_segment_failed(registry, traces):
    def boom(ctx):
        raise ValueError("no such plan")

    define_workflow("billing", steps=[s.compute("ok", lambda ctx: 1), s.compute("charge", boom)])
    start_workflow("billing")

    charge = traces.one("kumiflow.step charge")
    assert charge.status.status_code == StatusCode.ERROR
    assert attributes(charge)["kumiflow.outcome"] == "failed"
    [exception] = charge.events
    assert exception.name == "exception"
    assert dict(exception.attributes or {})["exception.message"] == "no such plan"
    segment = traces.one("kumiflow.segment")
    assert segment.status.status_code == StatusCode.ERROR
    assert attributes(segment)["kumiflow.outcome"] == "failed"
    assert "step_failed" in (segment.status.description or "")


def test_nested_steps_have_nested_spans(registry, traces):
    define_workflow(
        "nested",
        steps=[
            s.branch(lambda ctx: True, then=[s.compute("inner", lambda ctx: 1)]),
        ],
    )
    start_workflow("nested")
    outer, inner = traces.one("kumiflow.step branch"), traces.one("kumiflow.step inner")
    assert parent_ids(inner) == ids(outer)
    assert attributes(inner)["kumiflow.step_path"] == "0.then.0"


def test_a_run_started_by_a_step_lends_no_attributes_to_later_steps(registry, traces):
    """A step that starts another run inline: that run's steps run in the
    middle of the first run's, and each step span names its own run."""
    define_workflow("inner", steps=[s.compute("deep", lambda ctx: 1)], version="7")
    define_workflow(
        "outer",
        steps=[
            s.compute("before", lambda ctx: 1),
            s.compute("spawn", lambda ctx: str(start_workflow("inner", tenant="acme").id)),
            s.compute("after", lambda ctx: 1),
        ],
        version="3",
    )
    start_workflow("outer", tenant="acme")
    outer = WorkflowRun.objects.get(workflow="outer")
    inner = WorkflowRun.objects.get(workflow="inner")
    expected = {
        "kumiflow.step before": (outer, "3"),
        "kumiflow.step spawn": (outer, "3"),
        "kumiflow.step deep": (inner, "7"),
        "kumiflow.step after": (outer, "3"),
    }
    for span in traces.named("kumiflow.step"):
        run, version = expected[span.name]
        assert attributes(span)["kumiflow.run_id"] == str(run.id), span.name
        assert attributes(span)["kumiflow.workflow"] == run.workflow, span.name
        assert attributes(span)["kumiflow.version"] == version, span.name
        assert attributes(span)["kumiflow.tenant"] == "acme", span.name
    # in the order they ended: the inner run's step inside the outer's "spawn"
    assert [span.name for span in traces.named("kumiflow.step")] == [
        "kumiflow.step before",
        "kumiflow.step deep",
        "kumiflow.step spawn",
        "kumiflow.step after",
    ]


@pytest.fixture
def webhooks(settings):
    settings.KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]


def test_a_webhook_carries_the_traceparent_of_its_delivery(registry, traces, webhooks, clock):
    with Receiver(Reply(200)) as receiver:
        define_workflow("hook", steps=[s.webhook_send(receiver.url, body={"n": 1})])
        with traces.tracer.start_as_current_span("POST /hook"):
            start_workflow("hook", tenant="acme")
        assert run_until_idle().dispatched == 1

    segment, delivery = traces.one("kumiflow.segment"), traces.one("kumiflow.delivery")
    assert parent_ids(segment) == ids(traces.one("POST /hook"))  # start_workflow's caller
    dispatch = Dispatch.objects.get()
    assert delivery.name == "kumiflow.delivery webhook"
    assert parent_ids(delivery) == ids(segment)  # the segment that asked for it
    assert attributes(delivery) == {
        "kumiflow.dispatch_id": str(dispatch.id),
        "kumiflow.kind": "webhook",
        "kumiflow.attempt": 1,
        "kumiflow.run_id": str(dispatch.run_id),
        "kumiflow.tenant": "acme",
        "kumiflow.step_path": "0",
        "kumiflow.outcome": "delivered",
        "kumiflow.status_code": 200,
    }
    [request] = receiver.seen
    assert request.headers["traceparent"] == traceparent(delivery)


def test_a_failed_delivery_attempt_marks_its_span(registry, traces, webhooks, clock):
    with Receiver(Reply(503)) as receiver:
        define_workflow("hook", steps=[s.webhook_send(receiver.url, body={})])
        start_workflow("hook")
        run_until_idle()
    delivery = traces.one("kumiflow.delivery")
    assert attributes(delivery)["kumiflow.outcome"] == "retry"
    assert delivery.status.status_code == StatusCode.ERROR
    assert "HTTP 503" in (delivery.status.description or "")


def test_a_webhook_that_sets_its_own_traceparent_is_refused_not_overridden(
    registry, traces, webhooks, clock
):
    with Receiver(Reply(200)) as receiver:
        define_workflow(
            "hook",
            steps=[
                s.webhook_send(
                    receiver.url, body={}, headers={"TraceParent": "00-abc", "X-Other": "1"}
                )
            ],
        )
        start_workflow("hook")
        run_until_idle()
    assert receiver.seen == []
    dispatch = Dispatch.objects.get()
    assert dispatch.status == "dead"
    assert dispatch.last_error == (
        "webhook headers must not set TraceParent: kumiflow-django sends the trace "
        "context of the delivery itself"
    )


def test_a_cron_fire_is_a_span_and_the_runs_it_starts_are_its_children(registry, traces, clock):
    import datetime as dt

    clock.set(dt.datetime(2026, 3, 1, 8, 59, tzinfo=dt.UTC))
    define_workflow("report", trigger=on_cron("0 9 * * *"), steps=[s.compute("x", lambda c: 1)])
    sync_schedules()
    clock.set(dt.datetime(2026, 3, 1, 9, 0, 1, tzinfo=dt.UTC))
    assert fire_schedule("report") == 1

    fire, segment = traces.one("kumiflow.cron"), traces.one("kumiflow.segment")
    assert fire.name == "kumiflow.cron report"
    assert fire.parent is None
    assert attributes(fire) == {
        "kumiflow.workflow": "report",
        "kumiflow.tenant": "default",
        "kumiflow.scheduled_for": "2026-03-01T09:00:00+00:00",
        "kumiflow.outcome": "fired",
        "kumiflow.runs": 1,
    }
    assert parent_ids(segment) == ids(fire)
    run = WorkflowRun.objects.get()
    started = Event.objects.get(stream_id=str(run.id), version=1)
    assert started.metadata == {"traceparent": traceparent(fire)}


def test_the_task_attempt_hook_opens_a_span_under_the_requesting_context(registry, traces):
    with traces.tracer.start_as_current_span("segment") as requesting:
        requested = telemetry.carrier()
    assert requested == {"traceparent": traceparent(requesting)}

    with (
        pytest.raises(TimeoutError),
        telemetry.task_attempt(
            run_id="r1",
            workflow="agent",
            tenant="acme",
            step_path=[3],
            task="fetch",
            attempt=2,
            parent=requested,
        ),
    ):
        raise TimeoutError("slow")
    with telemetry.task_attempt(
        run_id="r1", workflow="agent", tenant="acme", step_path=[3], task="fetch", attempt=3
    ) as attempt:
        attempt.outcome = "late"

    failed, late = traces.named("kumiflow.task")
    assert failed.name == "kumiflow.task fetch"
    assert parent_ids(failed) == ids(traces.one("segment"))
    assert failed.status.status_code == StatusCode.ERROR
    assert attributes(failed) == {
        "kumiflow.run_id": "r1",
        "kumiflow.workflow": "agent",
        "kumiflow.tenant": "acme",
        "kumiflow.step_path": "3",
        "kumiflow.task": "fetch",
        "kumiflow.attempt": 2,
        "kumiflow.outcome": "failed",
    }
    assert attributes(late)["kumiflow.outcome"] == "late"
    assert late.status.status_code == StatusCode.UNSET
