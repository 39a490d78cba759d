"""``make demo`` tells its story and leaves a run waiting for an approval and a
failed run to look at in the console."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from kumiflow_django.models import Event, RunStatus, RunWait, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_demo_leaves_a_waiting_and_a_failed_run_for_the_console():
    out = io.StringIO()
    call_command("demo", stdout=out)
    text = out.getvalue()
    assert "2 of 2 onboarding runs completed." in text
    waiting = WorkflowRun.objects.get(workflow="refund-approval")
    assert waiting.status == RunStatus.WAITING_EVENT
    assert RunWait.objects.get(run_id=waiting.pk).event_type == "refund.approved"
    failed = WorkflowRun.objects.get(workflow="invoice-reminder")
    assert failed.status == RunStatus.FAILED
    failure = Event.objects.get(stream_id=str(failed.pk), type="kumiflow.workflow.run-failed")
    assert failure.payload["steps"] == {"customer": None}, "the None the next step indexed"
    assert "TypeError: 'NoneType' object is not subscriptable" in failure.payload["traceback"]
    assert f"/admin/kumiflow/workflowrun/{waiting.pk}/change/" in text
    assert f"/admin/kumiflow/workflowrun/{failed.pk}/change/" in text
    assert "/admin/kumiflow/workflowrun/overview/" in text


def test_the_demo_tells_steps_by_name_mails_by_the_story_s_dates_and_failures_in_a_line():
    import logging
    import re

    out, log = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    engine_log = logging.getLogger("kumiflow_django")
    engine_log.addHandler(handler)
    try:
        call_command("demo", stdout=out)
    finally:
        engine_log.removeHandler(handler)
    text = out.getvalue()
    assert "is waiting at step 1 (wait P1D)" in text
    assert "at step 4 (wait P7D): sleeps until" in text
    assert "from step 3.then.0 (mail 'Engagement tips')" in text
    # Each mail is dated by the story's clock: day 1's mail a day after day 0's.
    dated = dict(re.findall(r"mail to ada@example.com: '([^']+)', dated .+ \(day ([\d.]+)\)", text))
    assert dated == {"Welcome!": "0.0", "Engagement tips": "1.0"}
    # The intended failure: one line per warning, no traceback.
    warnings = log.getvalue()
    assert "TypeError at step 1 (mail_send)" in warnings
    assert "Traceback" not in warnings
    assert all(line.startswith("  log: ") for line in warnings.splitlines()), warnings


def test_the_demo_s_log_keeps_the_traceback_of_an_error():
    import logging
    import sys

    from testproject.shop.management.commands.demo import OneLineWarnings

    try:
        raise RuntimeError("a real error")
    except RuntimeError:
        info = sys.exc_info()
    formatter = OneLineWarnings(logging.Formatter("%(message)s"))

    def record(level: int) -> logging.LogRecord:
        return logging.LogRecord("kumiflow_django.engine", level, __file__, 1, "run x", (), info)

    assert (
        formatter.format(record(logging.WARNING)) == "  log: WARNING kumiflow_django.engine: run x"
    )
    assert "Traceback" in formatter.format(record(logging.ERROR))
