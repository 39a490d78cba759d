"""Pause and resume: a run, a workflow, a tenant; on_exhausted="pause"; fail_run."""

from __future__ import annotations

import pytest

from kumiflow_django import (
    InvalidPauseState,
    InvalidRunState,
    append_event,
    cancel_run,
    define_workflow,
    fail_run,
    on_event,
    pause_run,
    pause_tenant,
    pause_workflow,
    resume_run,
    resume_tenant,
    resume_workflow,
    start_workflow,
    wake_run,
)
from kumiflow_django import steps as s
from kumiflow_django.models import PausedScope, RunStatus, WorkflowRun
from kumiflow_django.store.models import Event
from kumiflow_django.testing import run_until_idle
from tests.helpers import only_run, types

pytestmark = pytest.mark.django_db


def _timer_workflow():
    define_workflow("slow", steps=[s.wait("PT1H"), s.return_("done")])


def test_a_paused_run_is_not_claimed_and_its_timer_fires_on_resume(registry, clock):
    _timer_workflow()
    run = start_workflow("slow")
    paused = pause_run(run.id, reason="partner outage", by="ops@example.com")
    assert (paused.paused, paused.status) == (True, RunStatus.WAITING)
    clock.advance(hours=2)
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.paused) == (RunStatus.WAITING, True)  # its timer came: not claimed
    resume_run(run.id, reason="partner back", by="ops@example.com")
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.result, run.paused) == (RunStatus.COMPLETED, "done", False)
    assert types(run) == [
        "run-started",
        "step.waiting",
        "run-paused",
        "run-resumed",
        "step.resumed",
        "run-completed",
    ]
    pause, resume = Event.objects.filter(
        type__in=["kumiflow.workflow.run-paused", "kumiflow.workflow.run-resumed"]
    ).order_by("version")
    assert (pause.payload, pause.created_by) == (
        {"by": "ops@example.com", "reason": "partner outage"},
        "ops@example.com",
    )
    assert resume.payload["reason"] == "partner back"


def test_pause_and_resume_refuse_what_does_not_apply(registry, clock):
    _timer_workflow()
    run = start_workflow("slow")
    with pytest.raises(InvalidRunState, match="not paused"):
        resume_run(run.id)
    pause_run(run.id)
    with pytest.raises(InvalidRunState, match="paused already"):
        pause_run(run.id)
    with pytest.raises(InvalidRunState, match="resume it first"):
        wake_run(run.id)
    cancel_run(run.id, reason="not needed")  # a paused run can be cancelled
    run.refresh_from_db()
    assert (run.status, run.paused) == (RunStatus.CANCELLED, False)
    with pytest.raises(InvalidRunState, match="only unfinished runs are paused"):
        pause_run(run.id)


def test_an_event_that_arrives_during_the_pause_is_recorded_and_taken_on_resume(registry, clock):
    define_workflow(
        "paid",
        trigger=on_event("order.placed"),
        steps=[
            s.wait_for_event(
                "payment.received",
                match={"payload.order": lambda ctx: ctx.event.payload["order"]},
                name="pay",
            ),
            s.return_(lambda ctx: ctx.steps["pay"]["payload"]["amount"]),
        ],
    )
    append_event("o-1", "order.placed", {"order": "o-1"})
    run = only_run()
    pause_run(run.id, reason="fraud check")
    append_event("p-1", "payment.received", {"order": "o-1", "amount": 12})
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.paused) == (RunStatus.WAITING_EVENT, True)
    assert run.matched_position is not None  # recorded: its wait is satisfied
    resume_run(run.id, reason="checked")
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, 12)
    assert types(run)[-5:] == [
        "run-paused",
        "event-matched",
        "run-resumed",
        "step.resumed",
        "run-completed",
    ]


@pytest.mark.parametrize("scope", ["workflow", "tenant"])
def test_an_awaited_event_of_a_paused_scope_is_recorded_not_run_inline(registry, clock, scope):
    """The appender's look-up reads whether the run's workflow or tenant is
    paused in its own statement: the event is recorded on the run, which
    stays waiting until the scope is resumed, in another tenant too."""
    define_workflow(
        "paid",
        trigger=on_event("order.placed"),
        steps=[
            s.wait_for_event(
                "payment.received",
                match={"payload.order": lambda ctx: ctx.event.payload["order"]},
                name="pay",
            ),
            s.return_(lambda ctx: ctx.steps["pay"]["payload"]["amount"]),
        ],
    )
    for tenant in ("acme", "globex"):
        append_event("o-1", "order.placed", {"order": "o-1"}, tenant=tenant)
    if scope == "workflow":
        pause_workflow("paid")
    else:
        pause_tenant("acme")
    for tenant in ("acme", "globex"):
        append_event("p-1", "payment.received", {"order": "o-1", "amount": 12}, tenant=tenant)
    held = WorkflowRun.objects.get(tenant_id="acme")
    other = WorkflowRun.objects.get(tenant_id="globex")
    assert (held.status, held.paused) == (RunStatus.WAITING_EVENT, False)
    assert held.matched_position is not None  # recorded: its wait is satisfied
    assert other.status == (RunStatus.WAITING_EVENT if scope == "workflow" else RunStatus.COMPLETED)
    if scope == "workflow":
        resume_workflow("paid")
    else:
        resume_tenant("acme")
    run_until_idle()
    held.refresh_from_db()
    assert (held.status, held.result) == (RunStatus.COMPLETED, 12)
    assert types(held)[-3:] == ["event-matched", "step.resumed", "run-completed"]


def test_a_paused_workflow_records_starts_and_runs_them_once_resumed(registry, clock):
    define_workflow("mailer", steps=[s.return_("sent")])
    define_workflow("other", steps=[s.return_("ran")])
    scope = pause_workflow("mailer", reason="SMTP down", by="ops")
    assert (scope.kind, scope.name, scope.paused) == ("workflow", "mailer", True)
    run = start_workflow("mailer")  # inline: recorded, not run
    assert (run.status, run.start_mode) == (RunStatus.PENDING, "deferred")
    assert start_workflow("other").status == RunStatus.COMPLETED  # another workflow runs
    run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    with pytest.raises(InvalidPauseState, match="paused already"):
        pause_workflow("mailer")
    resume_workflow("mailer", reason="SMTP back", by="ops")
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, "sent")
    with pytest.raises(InvalidPauseState, match="not paused"):
        resume_workflow("mailer")
    stream = Event.objects.filter(stream_id="pause:workflow:mailer").order_by("version")
    assert [(e.type, e.payload.get("reason"), e.created_by) for e in stream] == [
        ("kumiflow.pause.scope-paused", "SMTP down", "ops"),
        ("kumiflow.pause.scope-resumed", "SMTP back", "ops"),
    ]
    assert PausedScope.objects.get().paused is False


def test_a_paused_workflow_holds_its_waiting_runs_too(registry, clock):
    _timer_workflow()
    run = start_workflow("slow")
    pause_workflow("slow")
    clock.advance(hours=2)
    run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    resume_workflow("slow")
    run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED


def test_a_paused_tenant_holds_its_runs_only(registry, clock):
    _timer_workflow()
    held = start_workflow("slow", tenant="acme")
    free = start_workflow("slow", tenant="globex")
    pause_tenant("acme", reason="unpaid invoice")
    clock.advance(hours=2)
    run_until_idle()
    held.refresh_from_db()
    free.refresh_from_db()
    assert (held.status, free.status) == (RunStatus.WAITING, RunStatus.COMPLETED)
    late = start_workflow("slow", tenant="acme")
    assert late.status == RunStatus.PENDING
    resume_tenant("acme")
    run_until_idle()  # the late start's first segment: it waits its hour
    clock.advance(hours=2)
    run_until_idle()
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {RunStatus.COMPLETED}


def test_on_exhausted_pause_pauses_at_the_failed_step_and_resume_continues_there(registry, clock):
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
        "careful",
        on_exhausted="pause",
        steps=[
            s.call(None, first),
            s.wait("PT1M"),
            s.call("out", second),
            s.return_(lambda ctx: ctx.steps["out"]),
        ],
    )
    run = start_workflow("careful")
    clock.advance(minutes=1)
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.paused, run.reason) == (RunStatus.WAITING, True, "step_failed")
    assert "the partner API is down" in run.last_error
    paused = Event.objects.get(type="kumiflow.workflow.run-paused")
    assert paused.payload["failure"]["reason"] == "step_failed"
    broken["yes"] = False
    resume_run(run.id, reason="partner fixed")
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.result, run.reason, run.last_error) == (
        RunStatus.COMPLETED,
        "ok",
        "",
        "",
    )
    assert calls == {"first": 1, "second": 2}


def test_on_exhausted_pause_in_the_first_segment_starts_over_on_resume(registry, clock):
    state = {"fail": True}

    def maybe(payload):
        if state["fail"]:
            raise ValueError("bad")

    define_workflow("first", on_exhausted="pause", steps=[s.call(None, maybe), s.return_("done")])
    run = start_workflow("first")
    assert (run.status, run.paused) == (RunStatus.PENDING, True)
    run_until_idle()
    state["fail"] = False
    resume_run(run.id)
    run_until_idle()
    run.refresh_from_db()
    assert run.result == "done"


def test_fail_run_ends_a_paused_run_failed_through_the_one_end(registry, clock):
    define_workflow(
        "stuck",
        on_exhausted="pause",
        steps=[s.call(None, lambda payload: 1 / 0), s.return_("never")],
    )
    run = start_workflow("stuck")
    assert run.paused
    failed = fail_run(run.id, reason="will not be fixed", by="ops")
    assert (failed.status, failed.reason, failed.last_error, failed.paused) == (
        RunStatus.FAILED,
        "failed_by_operator",
        "will not be fixed",
        False,
    )
    with pytest.raises(InvalidRunState, match="only unfinished runs are failed"):
        fail_run(run.id)


def test_fail_run_compensates_per_the_workflows_rules(registry, clock):
    undone = []
    define_workflow(
        "booking",
        steps=[
            s.call(
                None, lambda payload: None, compensate=[s.call(None, lambda p: undone.append(1))]
            ),
            s.wait("P1D"),
            s.return_("booked"),
        ],
    )
    run = start_workflow("booking")
    fail_run(run.id, reason="customer asked")
    run_until_idle()
    run.refresh_from_db()
    assert (run.status, run.compensation, undone) == (RunStatus.FAILED, "compensated", [1])


def test_define_workflow_checks_on_exhausted(registry):
    from kumiflow_django import WorkflowDefinitionError

    with pytest.raises(WorkflowDefinitionError, match="on_exhausted must be one of"):
        define_workflow("x", on_exhausted="retry", steps=[s.return_(1)])


def test_a_rebuild_keeps_what_was_paused(registry, clock):
    from kumiflow_django.projections.rebuild import rebuild_all

    _timer_workflow()
    run = start_workflow("slow")
    pause_run(run.id, reason="hold")
    pause_workflow("slow", reason="deploy")
    rebuild_all()
    assert WorkflowRun.objects.get(pk=run.pk).paused
    scope = PausedScope.objects.get()
    assert (scope.name, scope.paused, scope.reason) == ("slow", True, "deploy")
