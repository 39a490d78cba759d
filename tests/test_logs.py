"""Structured logs: every log line of kumiflow-django carries the run id,
workflow, tenant and step path of the work at hand, and JsonFormatter writes
them as one JSON object per line."""

from __future__ import annotations

import ast
import io
import json
import logging
from pathlib import Path

import pytest

import kumiflow_django
from kumiflow_django import define_workflow, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import WorkflowRun
from kumiflow_django.observability.logs import JsonFormatter, RunFieldsFilter
from kumiflow_django.store import telemetry
from kumiflow_django.testing import run_until_idle

PACKAGE = Path(kumiflow_django.__file__).parent
FIELDS = ("run_id", "workflow", "tenant", "step_path")


def package_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("kumiflow_django")]


def fields(record: logging.LogRecord) -> tuple[object, ...]:
    return tuple(getattr(record, name) for name in FIELDS)


def test_every_module_takes_its_logger_from_the_seam():
    """A logger made with logging.getLogger(name) would log without the run's fields."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "telemetry.py" and path.parent.name == "store":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) == "logging.getLogger"
                and node.args  # getLogger() is the root logger: read, not logged to
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []


@pytest.mark.django_db
def test_a_failing_run_logs_its_run_workflow_tenant_and_step(registry, caplog):
    def boom(ctx):
        raise ValueError("no such plan")

    define_workflow(
        "billing",
        steps=[s.compute("ok", lambda ctx: 1), s.branch(True, then=[s.compute("charge", boom)])],
    )
    caplog.set_level(logging.DEBUG, logger="kumiflow_django")
    run = start_workflow("billing", tenant="acme")
    records = package_records(caplog)
    assert len(records) == 2  # the step's error, the run's failure
    assert all(r.getMessage().startswith(f"run {run.id}") for r in records)
    for record in records:
        assert fields(record) == (str(run.id), "billing", "acme", "1.then.0"), record.getMessage()


@pytest.mark.django_db
def test_a_resumed_run_and_its_deliveries_log_their_fields(registry, caplog, clock, settings):
    settings.KUMIFLOW_WEBHOOK_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
    define_workflow(
        "nap",
        trigger=on_event("nap.requested"),
        steps=[s.wait("PT1H"), s.webhook_send("http://127.0.0.1:9/closed", body={})],
    )
    caplog.set_level(logging.DEBUG, logger="kumiflow_django")
    from kumiflow_django import append_event

    append_event("n1", "nap.requested", {}, tenant="acme")
    run = WorkflowRun.objects.get()
    clock.advance(hours=2)
    run_until_idle()
    records = [r for r in package_records(caplog) if str(run.id) in r.getMessage()]
    suspended, resumed = records[0], records[1]
    assert fields(suspended) == (str(run.id), "nap", "acme", "0")
    assert "resumed" in resumed.getMessage()
    assert fields(resumed)[:3] == (str(run.id), "nap", "acme")
    [attempt] = [r for r in package_records(caplog) if r.getMessage().startswith("dispatch ")]
    assert (attempt.run_id, attempt.tenant, attempt.step_path) == (str(run.id), "acme", "1")  # type: ignore[attr-defined]


@pytest.mark.django_db
def test_a_run_started_by_a_step_of_another_logs_its_own_fields(registry, caplog):
    define_workflow(
        "child",
        trigger=on_event("child.requested"),
        steps=[s.compute("boom", lambda ctx: 1 / 0)],
    )
    define_workflow(
        "parent",
        steps=[s.compute("a", lambda ctx: 1), s.append_event("c1", "child.requested")],
    )
    caplog.set_level(logging.INFO, logger="kumiflow_django")
    start_workflow("parent")
    child = WorkflowRun.objects.get(workflow="child")
    [failed] = [r for r in package_records(caplog) if "failed:" in r.getMessage()]
    assert fields(failed) == (str(child.id), "child", "default", "0")
    with telemetry.run_fields("r1", "parent", "default"), telemetry.StepScope([1]):
        with telemetry.run_fields("r2", "child", "default"):
            assert telemetry.current_fields()["step_path"] is None
        assert telemetry.current_fields()["step_path"] == "1"


def test_outside_a_run_the_fields_are_none_and_extra_wins():
    logger = telemetry.get_logger("kumiflow_django.tests")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("idle")
        with telemetry.run_fields("r1", "billing", "acme"), telemetry.StepScope([2, "do", 0]):
            logger.info("busy %s", "now", extra={"tenant": "other", "order": 7})
            try:
                raise KeyError("x")
            except KeyError:
                logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    idle, busy, failed = (json.loads(line) for line in stream.getvalue().splitlines())
    assert {k: idle[k] for k in FIELDS} == dict.fromkeys(FIELDS)
    assert busy["message"] == "busy now"
    assert busy["level"] == "INFO" and busy["logger"] == "kumiflow_django.tests"
    assert busy["time"].endswith("+00:00")
    assert {k: busy[k] for k in FIELDS} == {
        "run_id": "r1",
        "workflow": "billing",
        "tenant": "other",  # given in extra: kept
        "step_path": "2.do.0",
    }
    assert busy["order"] == 7
    assert "KeyError: 'x'" in failed["exc_info"]


def test_the_filter_adds_the_fields_to_your_own_loggers():
    record = logging.LogRecord("myapp", logging.INFO, __file__, 1, "hello", (), None)
    with telemetry.run_fields("r1", "billing", "acme"):
        assert RunFieldsFilter().filter(record)
    assert fields(record) == ("r1", "billing", "acme", None)
