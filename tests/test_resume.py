"""Durable waits and the resume loop: the reference's resume rows (B22-B26), the
whole onboarding workflow, and regression tests for the reference's defects."""

from __future__ import annotations

import datetime as dt

import pytest
from django.core.management import call_command
from django.db import connection

from kumiflow_django import append_event, define_workflow, erase_stream, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.engine import unserved
from kumiflow_django.engine.resuming import resume_run
from kumiflow_django.models import Event, RunStatus, WorkflowRun
from kumiflow_django.testing import run_until_idle
from kumiflow_django.workers.resume import ResumeLoop, due_runs
from testproject.shop.models import Customer
from tests.helpers import dispatches, only_run, run_events, types

pytestmark = pytest.mark.django_db


def resume_all() -> int:
    return ResumeLoop(batch_size=100).run_once()


def test_nothing_to_do_B22(registry, clock):
    before = Event.objects.count()
    assert resume_all() == 0
    assert Event.objects.count() == before


def test_resume_a_suspended_wait_B23(registry, clock):
    define_workflow("w", trigger=on_event("demo.fired"), steps=[s.wait("PT1H"), s.return_(None)])
    append_event("src", "demo.fired")
    run = only_run()

    clock.advance(minutes=59)
    assert resume_all() == 0, "not due yet"
    clock.advance(minutes=1)
    assert resume_all() == 1

    resumed, completed = run_events(run)[2:]
    assert (resumed.type, resumed.payload) == (
        "kumiflow.workflow.step.resumed",
        {"cursor": [0], "by": "timer", "attempt": 1},
    )
    assert completed.type == "kumiflow.workflow.run-completed"
    assert completed.stream_id == str(run.id) and completed.stream_type == "workflow-run"


def test_a_changed_definition_fails_the_run_before_anything_runs_B24(registry, clock):
    define_workflow("drift", trigger=on_event("go"), steps=[s.wait("PT1M"), s.return_(1)])
    append_event("g", "go")
    run = only_run()
    registry.unregister("drift")
    # A change at the run's position (a compatible one carries the run on:
    # tests/test_deploys.py).
    define_workflow("drift", trigger=on_event("go"), steps=[s.wait("PT2M"), s.return_(2)])

    clock.advance(minutes=1)
    assert resume_all() == 1
    run.refresh_from_db()
    assert types(run) == ["run-started", "step.waiting", "run-failed"]
    assert run.reason == "workflow_definition_changed"
    assert "differs from the one registered here" in run.last_error
    assert "step 0 (the step the run is suspended in, wait): its arguments changed" in (
        run.last_error
    )
    assert "Cancel the run" not in run.last_error


def test_a_run_continues_on_its_own_version_while_that_is_registered(registry, clock):
    define_workflow(
        "orders", version=1, trigger=on_event("go"), steps=[s.wait("PT1M"), s.return_("v1")]
    )
    append_event("g", "go")
    define_workflow(
        "orders", version=2, trigger=on_event("go"), steps=[s.wait("PT1M"), s.return_("v2")]
    )
    append_event("g2", "go")

    clock.advance(minutes=1)
    run_until_idle()
    assert sorted(WorkflowRun.objects.values_list("workflow_version", "result")) == [
        ("1", "v1"),
        ("2", "v2"),
    ]


def test_a_run_of_a_workflow_no_worker_has_waits_then_fails_naming_it(registry, clock):
    """A rolling deploy that adds a workflow: its runs wait for a worker that has
    it, for KUMIFLOW_UNKNOWN_DEFINITION_GRACE, then fail with the reason."""
    define_workflow("gone", trigger=on_event("go"), steps=[s.wait("PT1M")])
    append_event("g", "go")
    registry.unregister("gone")
    clock.advance(minutes=1)
    assert resume_all() == 0
    assert only_run().status == RunStatus.WAITING
    clock.advance(seconds=3600)
    assert unserved.fail_overdue() == 1
    run = only_run()
    assert (run.status, run.reason) == (RunStatus.FAILED, "workflow_definition_not_served")
    assert '"gone"' in run.last_error


def test_a_lost_claim_is_a_silent_skip_and_a_stale_row_never_resumes_twice_B25(registry, clock):
    """The reference claimed at the stream's current version: a later poll that
    saw a stale row resumed the run again and re-ran its tail."""
    define_workflow(
        "counted",
        trigger=on_event("go"),
        steps=[
            s.wait("PT1M"),
            s.model.create(None, "shop.Customer", {"user_id": "once", "email": "o@x.io"}),
        ],
    )
    append_event("g", "go")
    clock.advance(minutes=1)
    stale = due_runs(clock.now(), 10)
    [(run_id, version, _, _)] = stale

    assert resume_run(run_id, expected_version=version) is not None
    events = Event.objects.count()
    # The same stale (id, version) again, as a second worker's poll would have it:
    assert resume_run(run_id, expected_version=version) is None
    assert resume_run(run_id) is None
    assert Event.objects.count() == events
    assert Customer.objects.count() == 1
    assert types(run_id) == ["run-started", "step.waiting", "step.resumed", "run-completed"]


def test_onboarding_runs_to_completion_engaged(clock, mailoutbox, settings):
    settings.KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = []
    append_event("user-a", "user.signed-up", {"user_id": "active-42", "email": "a@x.io"})
    run = only_run("user-onboarding")
    assert types(run) == ["run-started", "step.waiting"]

    clock.advance(days=1)
    resume_all()
    assert types(run, after=2) == ["step.resumed", "step.waiting"]
    run.refresh_from_db()
    assert run.cursor == [4]

    clock.advance(days=7)
    resume_all()
    assert types(run, after=4) == ["step.resumed", "run-completed"]
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.result == {"ok": True}
    assert [d.request.get("subject", d.kind) for d in dispatches(run)] == [
        "Welcome!",
        "Engagement tips",
        "webhook",
    ]
    webhook = dispatches(run)[-1]
    assert webhook.request["body"] == {"userId": "active-42", "stage": "day8"}
    assert webhook.request["secret"] == "crm"
    # Each request opened its own dispatch stream.
    for dispatch in dispatches(run):
        assert Event.objects.get(stream_id=str(dispatch.id), version=1).type == (
            "kumiflow.step.dispatch-requested"
        )


def test_onboarding_runs_to_completion_not_engaged(clock):
    append_event("user-c", "user.signed-up", {"user_id": "cold-1", "email": "c@x.io"})
    clock.advance(days=1)
    resume_all()
    clock.advance(days=7)
    resume_all()
    run = only_run("user-onboarding")
    assert types(run) == [
        "run-started",
        "step.waiting",
        "step.resumed",
        "step.waiting",
        "step.resumed",
        "run-completed",
    ]
    assert [d.request.get("subject") for d in dispatches(run)][:2] == [
        "Welcome!",
        "Getting started",
    ]


def test_a_wait_inside_a_branch_inside_for_each_resumes_at_exactly_that_place(registry, clock):
    seen = []
    define_workflow(
        "nested",
        trigger=on_event("go"),
        steps=[
            s.compute("before", lambda ctx: "kept"),
            s.for_each(
                lambda ctx: [1, 2, 3],
                "n",
                do=[
                    s.branch(
                        lambda ctx: ctx.scope["n"] == 2,
                        then=[
                            s.compute("pre", lambda ctx: seen.append(("pre", ctx.scope["n"]))),
                            s.wait("P1D"),
                            s.compute("post", lambda ctx: seen.append(("post", ctx.scope["n"]))),
                        ],
                    ),
                    s.compute("item", lambda ctx: seen.append(("item", ctx.scope["n"]))),
                ],
            ),
            s.return_(lambda ctx: ctx.steps["before"]),
        ],
    )
    append_event("g", "go")
    run = only_run()
    assert run.cursor == [1, "do", 0, "then", 1]
    assert seen == [("item", 1), ("pre", 2)]

    clock.advance(days=1)
    resume_all()
    run.refresh_from_db()
    assert seen == [("item", 1), ("pre", 2), ("post", 2), ("item", 2), ("item", 3)]
    assert run.result == "kept", "results from before the suspension survive it"


def test_step_results_read_the_same_after_a_resume(registry, clock):
    define_workflow(
        "same",
        trigger=on_event("go"),
        steps=[
            s.compute("when", lambda ctx: dt.datetime(2026, 5, 1, tzinfo=dt.UTC)),
            s.compute("before", lambda ctx: dict(ctx.steps)),
            s.wait("PT5M"),
            s.return_(lambda ctx: ctx.steps["before"] == {"when": ctx.steps["when"]}),
        ],
    )
    append_event("g", "go")
    clock.advance(minutes=5)
    resume_all()
    assert only_run().result is True


def test_wait_until_an_instant_or_a_resolved_duration(registry, clock):
    target = clock.now() + dt.timedelta(hours=3)
    define_workflow(
        "until",
        trigger=on_event("go"),
        steps=[
            s.wait(target),
            s.wait(lambda ctx: ctx.event.payload["pause"]),
            s.wait((target + dt.timedelta(hours=1)).isoformat()),
            s.wait("2000-01-01T00:00:00Z"),  # in the past: no suspension
        ],
    )
    append_event("g", "go", {"pause": "PT30M"})
    run = only_run()
    assert run.wake_at == target
    clock.set(target)
    resume_all()
    run.refresh_from_db()
    assert run.wake_at == target + dt.timedelta(minutes=30)
    clock.advance(minutes=30)
    resume_all()
    run.refresh_from_db()
    assert run.wake_at == target + dt.timedelta(hours=1)
    clock.advance(minutes=30)
    resume_all()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED


def test_a_short_wait_suspends_however_slow_the_machine(registry, clock):
    """A duration counts from one reading of the clock: a wait of 1 ms on a
    machine that stalls between two readings still suspends (a 1 ms wait once
    ran straight through under load in the W9 benchmark)."""

    class Stalling:
        def now(self):
            return clock.advance(milliseconds=5)  # 5 ms pass between any two readings

    from kumiflow_django.store import clock as engine_clock

    define_workflow("short", steps=[s.wait("PT0.001S"), s.return_(1)])
    previous = engine_clock.set_clock(Stalling())
    try:
        run = start_workflow("short")
    finally:
        engine_clock.set_clock(previous)
    assert run.status == RunStatus.WAITING


class Flaky(Exception):
    pass


def test_retry_backs_off_and_succeeds(registry, clock):
    calls = []

    def sometimes(payload):
        calls.append(1)
        Customer.objects.create(user_id=f"attempt-{len(calls)}", email="a@x.io")
        if len(calls) < 3:
            raise Flaky(f"attempt {len(calls)}")
        return len(calls)

    define_workflow(
        "retrying",
        trigger=on_event("go"),
        steps=[
            s.retry(
                [s.call("result", sometimes)], attempts=3, backoff="exponential", base=10, on=Flaky
            ),
            s.return_(lambda ctx: ctx.steps["result"]),
        ],
    )
    append_event("g", "go")
    run = only_run()
    assert run.status == RunStatus.RETRY_SCHEDULED
    assert run.wake_at == clock.now() + dt.timedelta(seconds=10)
    assert run.last_error.startswith("Flaky at step 0.do.0 (call 'result'): attempt 1")
    clock.advance(seconds=10)
    resume_all()
    run.refresh_from_db()
    assert run.wake_at == clock.now() + dt.timedelta(seconds=20)
    assert run.attempt == 2
    clock.advance(seconds=20)
    resume_all()
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, 3)
    assert types(run) == [
        "run-started",
        "retry.scheduled",
        "step.resumed",
        "retry.scheduled",
        "step.resumed",
        "run-completed",
    ]
    assert list(Customer.objects.values_list("user_id", flat=True)) == ["attempt-3"], (
        "the writes of failed attempts are rolled back"
    )


def test_retry_gives_up_after_the_last_attempt_with_the_last_error(registry, clock):
    def always(payload):
        raise Flaky("still down")

    define_workflow(
        "hopeless",
        trigger=on_event("go"),
        steps=[s.retry([s.call("x", always)], attempts=2, backoff="linear", base=5, on=Flaky)],
    )
    append_event("g", "go")
    clock.advance(seconds=5)
    resume_all()
    run = only_run()
    assert run.status == RunStatus.FAILED
    assert run.last_error.startswith("Flaky at step 0.do.0 (call 'x'): still down")


def test_retry_does_not_catch_other_errors(registry):
    define_workflow(
        "picky",
        trigger=on_event("go"),
        steps=[s.retry([s.compute("x", lambda ctx: 1 / 0)], on=Flaky)],
    )
    append_event("g", "go")
    assert only_run().status == RunStatus.FAILED


def test_a_retry_attempt_does_not_leak_into_a_later_retry(registry, clock):
    """In the reference, the resumed attempt number stayed on the context for the
    rest of the pass, so a later retry started at that attempt."""
    first_calls, attempts_seen = [], []

    def first(payload):
        first_calls.append(1)
        if len(first_calls) < 3:
            raise Flaky()

    def second(ctx_attempt):
        attempts_seen.append(ctx_attempt)

    define_workflow(
        "two-retries",
        trigger=on_event("go"),
        steps=[
            s.retry([s.call(None, first)], attempts=3, base=1, on=Flaky),
            s.retry([s.compute("a", lambda ctx: second(ctx.attempt))], attempts=3, on=Flaky),
        ],
    )
    append_event("g", "go")
    clock.advance(seconds=1)
    resume_all()
    clock.advance(seconds=2)
    resume_all()
    assert only_run().status == RunStatus.COMPLETED
    assert attempts_seen == [1]


def test_a_run_whose_state_was_hand_edited_fails_corrupt_state_and_the_loop_goes_on(
    registry, clock
):
    define_workflow("fine", trigger=on_event("go"), steps=[s.wait("PT1M"), s.return_("ok")])
    append_event("a", "go")
    append_event("b", "go")
    broken, fine = WorkflowRun.objects.order_by("started_at", "id")[:2]
    WorkflowRun.objects.filter(pk=broken.pk).update(state={"steps": "truncated"})
    clock.advance(minutes=1)
    assert resume_all() == 2
    broken.refresh_from_db()
    fine.refresh_from_db()
    assert (broken.status, broken.reason) == (RunStatus.FAILED, "corrupt_state")
    assert (fine.status, fine.result) == (RunStatus.COMPLETED, "ok")


def test_a_cursor_that_fits_no_step_is_corrupt_state(registry, clock):
    define_workflow("fine", trigger=on_event("go"), steps=[s.wait("PT1M")])
    append_event("a", "go")
    WorkflowRun.objects.update(cursor=[7, "then", 0])
    clock.advance(minutes=1)
    resume_all()
    assert only_run().reason == "corrupt_state"


def test_an_erased_trigger_event_fails_the_run_with_its_own_reason(registry, clock):
    define_workflow("w", trigger=on_event("person.registered"), steps=[s.wait("PT1M")])
    append_event("person-1", "person.registered", {"name": "Ada"})
    erase_stream("person-1")
    clock.advance(minutes=1)
    resume_all()
    assert only_run().reason == "trigger_event_unavailable"


def test_each_run_resumes_in_its_own_tenant(registry, clock):
    define_workflow(
        "tenanted",
        trigger=on_event("go"),
        steps=[
            s.wait("PT1M"),
            s.append_event(lambda ctx: f"done-{ctx.event.stream_id}", "done"),
        ],
    )
    append_event("a", "go", tenant="acme")
    append_event("b", "go", tenant="globex")
    clock.advance(minutes=1)
    resume_all()
    assert dict(Event.objects.filter(type="done").values_list("stream_id", "tenant_id")) == {
        "done-a": "acme",
        "done-b": "globex",
    }
    for run in WorkflowRun.objects.all():
        assert {e.tenant_id for e in run_events(run)} == {run.tenant_id}


def test_kumiflow_resume_once(registry, clock):
    define_workflow("cmd", trigger=on_event("go"), steps=[s.wait("PT1M")])
    append_event("a", "go")
    clock.advance(minutes=1)
    call_command("kumiflow_resume", "--once", verbosity=0)
    assert only_run().status == RunStatus.COMPLETED


def test_due_runs_are_found_through_the_wake_at_index(registry, clock):
    if connection.vendor != "sqlite":
        pytest.skip("the plan text is SQLite's; the benchmark measures the others")
    sql, params = (
        WorkflowRun.objects.due(clock.now())
        .order_by("wake_at")
        .values_list("id")[:10]
        .query.sql_with_params()
    )
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        plan = " ".join(str(row) for row in cursor.fetchall())
    assert "kumiflow_run_due_idx" in plan, plan
