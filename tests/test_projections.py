"""User projections, live and rebuilt; the rebuild of every table from the log."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import models

from kumiflow_django import (
    append_event,
    cancel_run,
    define_projection,
    define_workflow,
    on_cron,
    on_event,
    retry_run,
    start_workflow,
    wake_run,
)
from kumiflow_django import steps as s
from kumiflow_django.models import CronSchedule, Dispatch, RunWait, WorkflowRun
from kumiflow_django.projections.dispatches import DELIVERABLE
from kumiflow_django.projections.runs import SUSPENDED
from kumiflow_django.projections.user import remove_projection
from kumiflow_django.testing import run_until_idle

pytestmark = pytest.mark.django_db


@pytest.fixture
def signup_counter():
    counts: dict[str, int] = {}

    def count(event):
        counts[event.tenant_id] = counts.get(event.tenant_id, 0) + 1

    define_projection("signups", {"user.signed-up": count}, reset=counts.clear)
    yield counts
    remove_projection("signups")


def test_a_projection_is_kept_in_the_appending_transaction(signup_counter):
    append_event("u-1", "user.signed-up", {"user_id": "a-1", "email": "a@x.io"})
    append_event("u-2", "user.signed-up", {"user_id": "b-1", "email": "b@x.io"}, tenant="acme")
    append_event("u-2", "user.renamed", tenant="acme")
    assert signup_counter == {"default": 1, "acme": 1}


def test_a_projection_is_rebuilt_from_the_log(signup_counter):
    append_event("u-1", "user.signed-up", {"user_id": "a-1", "email": "a@x.io"})
    signup_counter["default"] = 99  # drifted
    call_command("kumiflow_rebuild", verbosity=0)
    assert signup_counter == {"default": 1}


def test_a_projection_name_is_unique():
    define_projection("p", {"x": lambda e: None})
    try:
        with pytest.raises(ValueError, match="already defined"):
            define_projection("p", {"x": lambda e: None})
    finally:
        remove_projection("p")


def snapshot(model: type[models.Model]) -> list[dict]:
    return list(model._default_manager.order_by("pk").values())


def test_rebuild_gives_tables_identical_to_the_live_ones(registry, clock, mailoutbox):
    """A mixed workload: completed, waiting, waiting for events, retrying,
    failed, deferred runs; delivered and dead dispatches; a cron schedule."""
    attempts = {"n": 0}

    def flaky(payload):
        attempts["n"] += 1
        raise RuntimeError("down")

    define_workflow(
        "mixed",
        trigger=on_event("order.placed"),
        steps=[
            s.mail_send(to="shop@x.io", subject="order", body="placed"),
            s.compute("n", lambda ctx: ctx.event.payload["n"]),
            s.branch(
                lambda ctx: ctx.steps["n"] % 2 == 0,
                then=[s.wait("P1D")],
                else_=[
                    s.wait_for_event(
                        "order.paid", match={"payload.n": lambda ctx: ctx.steps["n"]}, timeout="P2D"
                    )
                ],
            ),
            s.for_each(lambda ctx: [1, 2], "i", do=[s.compute("i2", lambda ctx: ctx.scope["i"])]),
            s.return_(lambda ctx: ctx.steps),
        ],
    )
    define_workflow(
        "flaky",
        steps=[s.retry([s.call("x", flaky)], attempts=2, base=60)],
    )
    define_workflow("broken", steps=[s.compute("x", lambda ctx: 1 / 0)])
    define_workflow("later", trigger=on_event("later.please"), start_mode="deferred", steps=[])
    define_workflow("nightly", trigger=on_cron("0 3 * * *"), steps=[s.return_(1)])
    define_workflow("hooky", steps=[s.webhook_send("ftp://nope.example.com")])

    for n in range(6):
        append_event(f"order-{n}", "order.placed", {"n": n})
    append_event("pay-1", "order.paid", {"n": 1})
    start_workflow("flaky")
    start_workflow("broken")
    start_workflow("hooky")
    append_event("l-1", "later.please")
    run_until_idle()
    clock.advance(days=1, hours=1)
    run_until_idle()
    append_event("pay-3", "order.paid", {"n": 3})
    waiting = WorkflowRun.objects.filter(status="waiting_event").order_by("started_at")
    cancel_run(waiting[0].id, reason="operator")
    retry_run(WorkflowRun.objects.get(workflow="broken").id)
    run_until_idle()
    append_event("order-9", "order.placed", {"n": 9})
    wake_run(WorkflowRun.objects.filter(status="waiting_event").latest("started_at").id)

    before = {m: snapshot(m) for m in (WorkflowRun, Dispatch, CronSchedule)}
    assert {r["status"] for r in before[WorkflowRun]} >= {
        "completed",
        "failed",
        "waiting_event",
    }
    assert {d["status"] for d in before[Dispatch]} >= {"delivered", "dead"}
    assert len(before[CronSchedule]) == 1
    # The due index relies on this: only suspended runs have a wake time.
    assert not WorkflowRun.objects.exclude(status__in=SUSPENDED).exclude(wake_at=None).exists()
    assert (
        not Dispatch.objects.exclude(status__in=DELIVERABLE).exclude(next_attempt_at=None).exists()
    )

    def waits() -> list[tuple]:
        fields = ("run_id", "branch", "event_type", "correlation_key", "match", "after", "gaps")
        return sorted(RunWait.objects.values_list(*fields), key=str)

    before_waits = waits()
    # Every run waiting for an event has its wait as a row, of the root branch.
    waiting_ids = [r["id"] for r in before[WorkflowRun] if r["status"] == "waiting_event"]
    assert sorted(w[0] for w in before_waits) == sorted(waiting_ids)
    assert {w[1] for w in before_waits} == {""}

    call_command("kumiflow_rebuild", verbosity=0)

    for model, rows in before.items():
        assert snapshot(model) == rows, model.__name__
    assert waits() == before_waits


def test_rebuild_reproduces_branches_children_and_compensation(registry, clock):
    from kumiflow_django.models import StepTask
    from testproject.shop.tasks import double

    define_workflow("leaf", steps=[s.wait("PT1H"), s.return_("leaf done")])
    define_workflow(
        "tree",
        steps=[
            s.parallel(
                "p",
                {
                    "kid": [s.child("leaf", "leaf")],
                    "paid": [s.wait_for_event("paid", match={"payload.n": 1}, name="pay")],
                    "other": [s.wait_for_event("paid", match={"payload.n": 2}, name="pay2")],
                    "task": [s.task("t", double, args=[2])],
                },
            ),
            s.for_each(lambda ctx: [1, 2, 3], "i", do=[s.wait("PT1M")], parallel=True, name="fe"),
        ],
    )
    define_workflow(
        "undoing",
        steps=[
            s.compute("a", lambda ctx: 1, compensate=[s.wait("PT1H"), s.compute("u", lambda c: 1)]),
            s.wait("PT1M"),
            s.compute("boom", lambda ctx: 1 / 0),
        ],
    )
    start_workflow("tree")
    start_workflow("undoing")
    run_until_idle(tasks=False)
    append_event("p", "paid", {"n": 1})
    clock.advance(minutes=1)
    run_until_idle(tasks=False)

    assert RunWait.objects.count() == 2  # "other", and the task's outcome
    assert WorkflowRun.objects.filter(compensation="running").count() == 1
    assert WorkflowRun.objects.exclude(parent_id=None).count() == 1

    def waits() -> list[dict]:
        rows = RunWait.objects.values("run_id", "branch", "event_type", "correlation_key", "after")
        return sorted((dict(row) for row in rows), key=str)

    before = {m: snapshot(m) for m in (WorkflowRun, StepTask)}
    before_waits = waits()
    call_command("kumiflow_rebuild", verbosity=0)
    for model, rows in before.items():
        assert snapshot(model) == rows, model.__name__
    assert waits() == before_waits
