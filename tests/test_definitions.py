"""Workflow definitions: the reference's definition rows (B1, B2, B4, B5, B14-B16)
and validation at definition time, with the workflow and step path named."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kumiflow_django import WorkflowDefinitionError, define_workflow, manual, on_cron, on_event
from kumiflow_django import steps as s
from kumiflow_django.definition.registry import registry as global_registry
from kumiflow_django.definition.step import Step
from kumiflow_django.definition.triggers import CronTrigger, EventTrigger, ManualTrigger
from testproject.shop import workflows as shop


def test_onboarding_definition_B1():
    wf = shop.onboarding
    assert wf.name == "user-onboarding"
    assert isinstance(wf.trigger, EventTrigger)
    assert wf.trigger.event_type == "user.signed-up"
    assert callable(wf.idempotency_key)


def test_webhook_delivery_definition_B2():
    assert shop.webhook_delivery.name == "webhook-delivery"
    assert shop.webhook_delivery.trigger == EventTrigger("data.processed")


def test_daily_report_definition_B4():
    assert shop.daily_report.name == "daily-report"
    assert isinstance(shop.daily_report.trigger, CronTrigger)
    assert shop.daily_report.trigger.expression == "0 9 * * *"


def test_idempotency_key_resolver_B5():
    class Event:
        payload = {"user_id": "user_123"}

    key = shop.onboarding.idempotency_key
    assert callable(key)
    assert key(Event()) == "onboarding:user_123"


def test_the_registry_indexes_event_triggers_B14_B15():
    """An event workflow is found by its event type; a cron workflow is not."""
    assert global_registry.for_event("user.signed-up") == [shop.onboarding]
    assert shop.daily_report not in [
        w for t in ("cron", "0 9 * * *") for w in global_registry.for_event(t)
    ]
    assert global_registry.cron_workflows() == [shop.daily_report]


def test_steps_are_plain_data_B16():
    assert all(isinstance(step, Step) for step in shop.onboarding.steps)
    assert [step.kind for step in shop.onboarding.steps] == [
        "mail_send",
        "wait",
        "compute",
        "branch",
        "wait",
        "webhook_send",
        "return",
    ]


def test_no_trigger_means_manual_start_only(registry):
    wf = define_workflow("by-hand", steps=[s.return_(1)])
    assert isinstance(wf.trigger, ManualTrigger)
    assert define_workflow("also-by-hand", trigger=manual(), steps=[]).steps == ()


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([Step("teleport")], r"workflow 'bad', step 0 \(teleport\): unknown step kind 'teleport'"),
        (
            [s.compute("a", lambda ctx: 1), s.branch(lambda ctx: True, then=[s.return_(1)])],
            r"step 1\.then\.0 \(return\): return is only allowed at the top level",
        ),
        (
            [s.for_each(lambda ctx: [], "x", do=[s.return_(1)])],
            r"step 0\.do\.0 \(return\): return is only allowed",
        ),
        ([s.wait("P1X")], r"step 0 \(wait\): invalid ISO 8601 duration: 'P1X'"),
        ([s.wait("tomorrow")], r"step 0 \(wait\): invalid ISO 8601 instant"),
        ([s.wait(timedelta(days=-1))], r"must not be negative"),
        (
            [s.wait_for_event("reply", timeout="1 day")],
            r"step 0 \(wait_for_event\): invalid ISO 8601 instant",
        ),
        ([s.wait_for_event("reply", match={"order_id": 1})], r"match path 'order_id' must be"),
        ([s.compute("a", lambda: 1)], r"step 0 \(compute\): the compute function must be"),
        (
            [s.branch(lambda ctx, extra: True, then=[])],
            r"step 0 \(branch\): if_ must be a value or a function of one argument",
        ),
        ([s.retry([s.compute("a", lambda ctx: 1)], attempts=0)], r"attempts must be at least 1"),
        ([s.retry([])], r"retry needs at least one step"),
        ([s.read.find_many("rows", "shop.Nothing")], r"step 0 \(read.find_many\): .*Nothing"),
        (["not a step"], r"step 0: 'not a step' is not a step"),
    ],
)
def test_invalid_steps_raise_naming_workflow_and_path(registry, steps, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        define_workflow("bad", steps=steps)
    assert not registry.is_registered("bad")


@pytest.mark.parametrize(
    ("trigger", "message"),
    [
        (on_cron("invalid"), r"workflow 'bad', trigger: invalid cron expression 'invalid'"),
        (on_cron(""), r"trigger: on_cron needs a cron expression"),
        (on_cron("0 9 * * *", "Mars/Olympus"), r"unknown time zone 'Mars/Olympus'"),
        (on_cron("0 9 * * *", misfire="sometimes"), r"misfire must be one of"),
        (on_event(""), r"on_event needs an event type"),
        (on_event("x", filter=lambda: True), r"on_event filter must be a value or a function"),  # type: ignore[arg-type,misc]
    ],
)
def test_invalid_triggers_raise(registry, trigger, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        define_workflow("bad", trigger=trigger, steps=[])


def test_a_duplicate_workflow_name_raises(registry):
    define_workflow("twice", steps=[])
    with pytest.raises(WorkflowDefinitionError, match="workflow 'twice' is defined twice"):
        define_workflow("twice", steps=[s.return_(1)])


def test_versions_of_one_workflow_coexist_and_the_last_one_is_current(registry):
    v1 = define_workflow("orders", version=1, steps=[s.return_(1)])
    v2 = define_workflow("orders", version=2, steps=[s.return_(2)])
    assert registry.get("orders") is v2
    assert registry.find("orders", "1") is v1


def test_full_cron_syntax_is_accepted(registry):
    for expression in (
        "*/5 * * * *",
        "0 9 * * MON-FRI",
        "@daily",
        "0 0 1,15 * *",
        "*/10 * * * * *",
    ):
        define_workflow(f"cron-{expression}", trigger=on_cron(expression), steps=[])


def test_bad_options_raise(registry):
    with pytest.raises(WorkflowDefinitionError, match="start_mode"):
        define_workflow("x", steps=[], start_mode="later")
    with pytest.raises(WorkflowDefinitionError, match="idempotency_key"):
        define_workflow("y", steps=[], idempotency_key=lambda a, b: "k")  # type: ignore[arg-type,misc]
    with pytest.raises(WorkflowDefinitionError, match="steps must be a list"):
        define_workflow("z", steps=s.return_(1))  # type: ignore[arg-type]


def test_manage_py_check_reports_an_invalid_definition():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "SHOP_BROKEN_CRON": "1", "DATABASE_URL": "sqlite:///:memory:"}
    result = subprocess.run(
        [sys.executable, str(root / "manage.py"), "check"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert (
        "WorkflowDefinitionError: workflow 'broken-cron', trigger: "
        "invalid cron expression '61 25 * * *'"
    ) in result.stderr
