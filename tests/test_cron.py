"""Cron schedules: the reference's cases (B17-B21), cold start, misfire
policies after an outage, DST, overlap, and operating a schedule."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from kumiflow_django import WorkflowDefinitionError, define_workflow, on_cron
from kumiflow_django import steps as s
from kumiflow_django.cron.occurrences import next_occurrence
from kumiflow_django.cron.schedules import fire_now, set_enabled
from kumiflow_django.models import CronSchedule, Event, WorkflowRun
from kumiflow_django.testing import run_until_idle
from kumiflow_django.workers.cron import CronLoop

pytestmark = pytest.mark.django_db

UTC = dt.UTC


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(UTC)


def tick() -> int:
    return CronLoop(batch_size=50).run_once()


def fired_for(workflow: str = "job") -> list[str]:
    return sorted(
        WorkflowRun.objects.filter(workflow=workflow).values_list("input__scheduled_for", flat=True)
    )


def test_next_occurrence_same_day_and_next_day_B17_B19():
    assert next_occurrence("30 9 * * *", "UTC", at("2025-06-01T00:00:00+00:00")) == at(
        "2025-06-01T09:30:00+00:00"
    )
    assert next_occurrence("30 9 * * *", "UTC", at("2025-06-01T10:00:00+00:00")) == at(
        "2025-06-02T09:30:00+00:00"
    )


@pytest.mark.parametrize("expression", ["invalid", "", "61 * * * *", "* * *"])
def test_invalid_expressions_are_refused_when_defined_B18(registry, expression):
    with pytest.raises(WorkflowDefinitionError, match="cron"):
        define_workflow("job", trigger=on_cron(expression), steps=[])


def test_not_due_fires_nothing_B20(registry, clock):
    clock.set(at("2025-06-01T08:00:00+00:00"))
    define_workflow("job", trigger=on_cron("0 9 * * *"), steps=[s.return_(1)])
    assert tick() == 0
    assert not WorkflowRun.objects.exists()
    assert CronSchedule.objects.get().next_fire_at == at("2025-06-01T09:00:00+00:00")


def test_a_cold_start_fires_when_due_B21(registry, clock):
    """The reference never fired from a cold start (its last-run map started empty)."""
    clock.set(at("2025-06-01T08:00:00+00:00"))
    define_workflow(
        "job", trigger=on_cron("0 9 * * *"), steps=[s.return_(lambda ctx: ctx.event.payload)]
    )
    tick()
    clock.set(at("2025-06-01T09:01:00+00:00"))
    assert tick() == 1
    run = WorkflowRun.objects.get()
    assert run.status == "completed"
    assert run.result == {"scheduled_for": "2025-06-01T09:00:00Z"}
    assert run.trigger_type == "cron"
    types = [e.type for e in Event.objects.filter(stream_id=str(run.id)).order_by("version")]
    assert types == ["kumiflow.workflow.run-started", "kumiflow.workflow.run-completed"]
    assert tick() == 0, "an occurrence fires once"
    schedule = CronSchedule.objects.get()
    assert schedule.next_fire_at == at("2025-06-02T09:00:00+00:00")
    assert schedule.last_run_id == run.id


@pytest.mark.parametrize(
    ("misfire", "max_catch_up", "expected"),
    [
        ("latest", 10, ["2025-06-04T09:00:00Z"]),
        (
            "all",
            10,
            [
                "2025-06-01T09:00:00Z",
                "2025-06-02T09:00:00Z",
                "2025-06-03T09:00:00Z",
                "2025-06-04T09:00:00Z",
            ],
        ),
        ("all", 2, ["2025-06-03T09:00:00Z", "2025-06-04T09:00:00Z"]),
        ("skip", 10, []),
    ],
)
def test_misfire_policies_after_a_three_day_outage(
    registry, clock, misfire, max_catch_up, expected
):
    clock.set(at("2025-06-01T08:00:00+00:00"))
    define_workflow(
        "job",
        trigger=on_cron("0 9 * * *", misfire=misfire, max_catch_up=max_catch_up),
        steps=[s.return_(1)],
    )
    tick()
    clock.set(at("2025-06-04T10:00:00+00:00"))  # the scheduler was down for three days
    tick()
    assert fired_for() == expected
    schedule = CronSchedule.objects.get()
    assert schedule.next_fire_at == at("2025-06-05T09:00:00+00:00")
    assert schedule.skipped_count == 4 - len(expected)
    assert tick() == 0


def step_through(clock, start: str, end: str, minutes: int = 10) -> None:
    clock.set(at(start))
    tick()
    while clock.now() < at(end):
        clock.advance(minutes=minutes)
        tick()


@pytest.mark.parametrize(
    ("zone", "spring", "autumn"),
    [
        ("Europe/Berlin", "2026-03-29", "2026-10-25"),
        ("America/New_York", "2026-03-08", "2026-11-01"),
    ],
)
def test_a_0230_job_fires_once_on_both_dst_change_days(registry, clock, zone, spring, autumn):
    define_workflow("job", trigger=on_cron("30 2 * * *", zone), steps=[])
    tz = ZoneInfo(zone)
    for day in (spring, autumn):
        midnight = dt.datetime.fromisoformat(day).replace(tzinfo=tz)
        next_midnight = (midnight + dt.timedelta(days=1, hours=2)).replace(hour=0)
        step_through(clock, midnight.isoformat(), next_midnight.isoformat())
        local_days = [at(t).astimezone(tz).date().isoformat() for t in fired_for()]
        assert local_days.count(day) == 1, (day, fired_for())


def test_the_spring_forward_gap_fires_at_the_first_instant_after_it(registry, clock):
    define_workflow("job", trigger=on_cron("30 2 * * *", "Europe/Berlin"), steps=[])
    step_through(clock, "2026-03-28T12:00:00+00:00", "2026-03-29T12:00:00+00:00")
    assert fired_for() == ["2026-03-29T01:00:00Z"]  # 03:00 CEST, the first instant after 02:00


def test_the_repeated_hour_of_fall_back_fires_once(registry, clock):
    define_workflow("job", trigger=on_cron("30 2 * * *", "Europe/Berlin"), steps=[])
    step_through(clock, "2026-10-24T12:00:00+00:00", "2026-10-25T12:00:00+00:00")
    assert fired_for() == ["2026-10-25T00:30:00Z"]  # 02:30 CEST, not again at 02:30 CET


def test_overlap_skip_does_not_start_while_the_previous_run_is_active(registry, clock):
    clock.set(at("2025-06-01T08:00:00+00:00"))
    define_workflow(
        "job", trigger=on_cron("0 9 * * *", overlap="skip"), steps=[s.wait("PT36H"), s.return_(1)]
    )
    tick()
    clock.set(at("2025-06-01T09:00:00+00:00"))
    run_until_idle()
    clock.set(at("2025-06-02T09:00:00+00:00"))
    run_until_idle()
    assert fired_for() == ["2025-06-01T09:00:00Z"]
    assert CronSchedule.objects.get().skipped_count == 1
    clock.set(at("2025-06-03T09:00:00+00:00"))
    run_until_idle()
    assert fired_for() == ["2025-06-01T09:00:00Z", "2025-06-03T09:00:00Z"]


def test_disable_enable_and_fire_now(registry, clock):
    clock.set(at("2025-06-01T08:00:00+00:00"))
    define_workflow("job", trigger=on_cron("0 9 * * *"), steps=[])
    tick()
    set_enabled("job", False)
    clock.set(at("2025-06-02T10:00:00+00:00"))
    assert tick() == 0
    run_id = fire_now("job")
    assert WorkflowRun.objects.get().id == __import__("uuid").UUID(run_id)
    set_enabled("job", True)
    schedule = CronSchedule.objects.get()
    assert schedule.enabled
    assert schedule.next_fire_at == at("2025-06-03T09:00:00+00:00"), (
        "missed while off: not caught up"
    )


def test_a_schedule_whose_workflow_is_gone_is_disabled_with_a_reason(registry, clock, caplog):
    define_workflow("job", trigger=on_cron("0 9 * * *"), steps=[])
    tick()
    registry.unregister("job")
    tick()
    schedule = CronSchedule.objects.get()
    assert (schedule.enabled, schedule.disabled_reason) == (False, "workflow not registered")
    assert "cron schedule job disabled" in caplog.text


def test_a_changed_expression_is_recomputed(registry, clock):
    clock.set(at("2025-06-01T08:00:00+00:00"))
    define_workflow("job", trigger=on_cron("0 9 * * *"), steps=[])
    tick()
    registry.unregister("job")
    define_workflow("job", trigger=on_cron("0 12 * * *"), steps=[])
    tick()
    schedule = CronSchedule.objects.get()
    assert (schedule.expression, schedule.next_fire_at) == (
        "0 12 * * *",
        at("2025-06-01T12:00:00+00:00"),
    )


def test_the_shops_daily_report_fires_at_nine_and_requests_its_webhook_B21(clock):
    from tests.helpers import dispatches, types

    clock.set(at("2025-05-31T08:00:00+00:00"))
    tick()
    clock.set(at("2025-06-01T09:01:00+00:00"))
    assert tick() == 1
    run = WorkflowRun.objects.get(workflow="daily-report")
    assert types(run) == ["run-started", "run-completed"]
    [webhook] = dispatches(run)
    assert webhook.request["body"] == {"ts": "2025-06-01T09:00:00Z"}
