"""Cron definitions and broken schedules (issue 11, item 7).

A cron definition that can never fire, or does not fit its columns, is refused
when it is defined. A schedule that still breaks at run time (its year field
runs out, croniter or the database raises) is disabled with its reason and
logged once, while every other schedule syncs and fires.
"""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from croniter import croniter as real_croniter
from django.core.management import call_command
from django.db import DataError, OperationalError

from kumiflow_django import WorkflowDefinitionError, define_workflow, on_cron
from kumiflow_django import steps as s
from kumiflow_django.cron.schedules import set_enabled
from kumiflow_django.models import CronSchedule, Event, WorkflowRun
from kumiflow_django.testing import run_until_idle
from kumiflow_django.workers.cron import CronLoop

pytestmark = pytest.mark.django_db

UTC = dt.UTC
START = dt.datetime(2026, 6, 1, tzinfo=UTC)  # the clock of every test here

EVERY_MINUTE_AND_HOUR = (
    ",".join(str(m) for m in range(60)) + " " + ",".join(str(h) for h in range(24)) + " * * *"
)


# -- refused when defined ------------------------------------------------------


def refused(label: str, expression: str, message: str, name: str = "job", **options: object):
    return pytest.param(name, expression, options, message, id=label)


REFUSED = [
    refused("30 February", "0 0 30 2 *", "no occurrence"),
    refused("31 April", "0 0 31 4 *", "no occurrence"),
    refused("a 7th field: a year gone by", "0 0 1 1 * 0 2020", "no occurrence"),
    refused("a 7th field: this year, past", "0 0 1 1 * 0 2026", "no occurrence"),
    refused("a 6th field on 30 February", "0 0 30 2 * 15", "no occurrence"),
    refused("beyond croniter's 50 years", "0 0 1 1 * 0 2080", "50 years"),
    refused("237 characters", EVERY_MINUTE_AND_HOUR, "longer than 200"),
    refused("an empty expression", "", "needs a cron expression"),
    refused("a blank expression", "   ", "needs a cron expression"),
    refused("a seconds field out of range", "* * * * * 99", "invalid cron"),
    refused("an unknown time zone", "0 9 * * *", "zone", timezone="Mars/Olympus"),
    refused("a path as time zone", "0 9 * * *", "zone", timezone="../etc/passwd"),
    refused("a 65-character time zone", "0 9 * * *", "zone", timezone="E" * 65),
    refused("no time zone", "0 9 * * *", "zone", timezone=None),
    refused("max_catch_up past 2**31 - 1", "0 9 * * *", "max_catch_up", max_catch_up=2**31),
    refused("max_catch_up=True", "0 9 * * *", "max_catch_up", max_catch_up=True),
    refused("a name too long for cron:<name>", "0 9 * * *", "at most 95", name="n" * 96),
]


@pytest.mark.parametrize(("name", "expression", "options", "message"), REFUSED)
def test_a_cron_definition_that_cannot_fire_or_be_stored_is_refused(
    registry, clock, name, expression, options, message
):
    clock.set(START)
    with pytest.raises(WorkflowDefinitionError, match=message):
        define_workflow(name, trigger=on_cron(expression, **options), steps=[])
    assert not registry.is_registered(name)


ACCEPTED = [
    pytest.param("job", "0 0 29 2 *", "2028-02-29T00:00:00+00:00", id="29 February"),
    pytest.param("job", "0 0 * 2 MON#5", "2044-02-29T00:00:00+00:00", id="5th Monday of Feb"),
    pytest.param("job", "0 0 1 1 * 0 2075", "2075-01-01T00:00:00+00:00", id="49 years ahead"),
    pytest.param("n" * 95, "0 9 * * *", "2026-06-01T09:00:00+00:00", id="a name of 95"),
]


@pytest.mark.parametrize(("name", "expression", "first"), ACCEPTED)
def test_a_rare_but_real_occurrence_is_accepted_and_scheduled(
    registry, clock, name, expression, first
):
    clock.set(START)
    define_workflow(name, trigger=on_cron(expression), steps=[])
    CronLoop().run_once()
    schedule = CronSchedule.objects.get()
    assert (schedule.enabled, schedule.next_fire_at) == (True, dt.datetime.fromisoformat(first))
    assert Event.objects.filter(stream_id=f"cron:{name}").count() == 1


# -- broken at run time --------------------------------------------------------

HEALTHY, BROKEN = "0 * * * *", "30 * * * *"


def two_schedules() -> None:
    define_workflow("healthy", trigger=on_cron(HEALTHY), steps=[s.return_(1)])
    define_workflow("broken", trigger=on_cron(BROKEN), steps=[s.return_(1)])


@pytest.fixture
def choke(monkeypatch):
    """Make croniter raise for the broken schedule's expression from now on (a
    croniter bug, a schedule left by an old deploy); returns the refused calls."""
    refused: list[str] = []

    def croniter(expression, *args, **kwargs):
        if expression == BROKEN:
            refused.append(expression)
            raise RuntimeError("croniter choked")
        return real_croniter(expression, *args, **kwargs)

    def install() -> list[str]:
        monkeypatch.setattr("kumiflow_django.cron.occurrences.croniter", croniter)
        return refused

    return install


def fired_for(workflow: str) -> list[str]:
    runs = WorkflowRun.objects.filter(workflow=workflow)
    return sorted(runs.values_list("input__scheduled_for", flat=True))


def cron_events(workflow: str, type_: str) -> int:
    return Event.objects.filter(stream_id=f"cron:{workflow}", type=type_).count()


def errors_about(caplog, workflow: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and f"schedule {workflow} " in r.getMessage()
    ]


def test_a_schedule_that_cannot_be_synced_does_not_stop_the_others(registry, clock, choke, caplog):
    """The hole: sync raised on every batch and no schedule fired."""
    refused = choke()
    clock.set(START)
    two_schedules()
    run_until_idle()
    for hour in range(1, 5):
        clock.set(START + dt.timedelta(hours=hour))
        run_until_idle()  # a new cron loop each time: it syncs again, quietly
    assert fired_for("healthy") == [f"2026-06-01T0{h}:00:00Z" for h in range(1, 5)]
    broken = CronSchedule.objects.get(workflow="broken")
    assert (broken.enabled, broken.expression, broken.next_fire_at) == (False, BROKEN, None)
    assert broken.disabled_reason == "broken: RuntimeError: croniter choked"
    assert cron_events("broken", "kumiflow.cron.disabled") == 1
    assert len(errors_about(caplog, "broken")) == 1
    assert len(refused) == 1, "synced again and again"


def test_a_schedule_that_raises_when_fired_is_disabled_once_and_the_others_fire(
    registry, clock, choke, caplog
):
    clock.set(START)
    two_schedules()
    run_until_idle()
    refused = choke()
    for hour in range(1, 5):
        clock.set(START + dt.timedelta(hours=hour))
        loop = CronLoop()
        for _ in range(3):  # polls of one loop: the broken schedule is not retried
            loop.run_once()
    assert fired_for("healthy") == [f"2026-06-01T0{h}:00:00Z" for h in range(1, 5)]
    assert fired_for("broken") == []
    broken = CronSchedule.objects.get(workflow="broken")
    assert (broken.enabled, broken.disabled_reason) == (
        False,
        "broken: RuntimeError: croniter choked",
    )
    assert cron_events("broken", "kumiflow.cron.disabled") == 1
    assert len(errors_about(caplog, "broken")) == 1
    assert not any("stays due" in r.getMessage() for r in caplog.records)
    assert len(refused) == 1


def test_a_database_refusal_disables_only_that_schedule(registry, clock, monkeypatch, caplog):
    from kumiflow_django.cron import schedules

    real_start_run = schedules.start_run  # type: ignore[attr-defined]

    def start_run(workflow, **kwargs):
        if workflow.name == "broken":
            raise DataError("value too long for type character varying(64)")
        return real_start_run(workflow, **kwargs)

    monkeypatch.setattr(schedules, "start_run", start_run)
    clock.set(START)
    two_schedules()
    for minutes in range(30, 300, 30):
        clock.set(START + dt.timedelta(minutes=minutes))
        run_until_idle()
    assert fired_for("healthy") == [f"2026-06-01T0{h}:00:00Z" for h in range(1, 5)]
    assert not WorkflowRun.objects.filter(workflow="broken").exists()
    broken = CronSchedule.objects.get(workflow="broken")
    assert broken.disabled_reason.startswith("broken: DataError: value too long")
    assert cron_events("broken", "kumiflow.cron.fired") == 0, "the firing was rolled back"
    assert cron_events("broken", "kumiflow.cron.disabled") == 1
    assert len(errors_about(caplog, "broken")) == 1


def test_a_year_field_that_runs_out_fires_its_last_occurrence_then_disables(
    registry, clock, caplog
):
    clock.set(START)
    define_workflow("once", trigger=on_cron("0 9 1 1 * 0 2027"), steps=[s.return_(1)])
    run_until_idle()
    clock.set(dt.datetime(2027, 1, 1, 9, 0, 30, tzinfo=UTC))
    run_until_idle()
    clock.advance(days=400)
    run_until_idle()
    assert fired_for("once") == ["2027-01-01T09:00:00Z"]
    schedule = CronSchedule.objects.get()
    assert (schedule.enabled, schedule.next_fire_at) == (False, None)
    assert schedule.disabled_reason == "broken: no occurrence after 2027-01-01T09:00:30Z"
    with pytest.raises(WorkflowDefinitionError, match="cannot be enabled"):
        set_enabled("once", True)


def test_a_fixed_definition_enables_a_broken_schedule_but_not_one_an_operator_disabled(
    registry, clock, choke
):
    choke()
    clock.set(START)
    two_schedules()
    define_workflow("paused", trigger=on_cron("15 * * * *"), steps=[s.return_(1)])
    run_until_idle()
    set_enabled("paused", False, reason="maintenance")
    assert not CronSchedule.objects.get(workflow="broken").enabled

    # the next deploy changes both expressions
    registry.unregister("broken")
    registry.unregister("paused")
    define_workflow("broken", trigger=on_cron("45 * * * *"), steps=[s.return_(1)])
    define_workflow("paused", trigger=on_cron("50 * * * *"), steps=[s.return_(1)])
    run_until_idle()
    fixed, paused = CronSchedule.objects.order_by("workflow").exclude(workflow="healthy")
    assert (fixed.enabled, fixed.disabled_reason, fixed.expression) == (True, "", "45 * * * *")
    assert fixed.next_fire_at == START + dt.timedelta(minutes=45)
    assert (paused.enabled, paused.disabled_reason) == (False, "maintenance")
    clock.set(START + dt.timedelta(hours=2))
    run_until_idle()
    assert fired_for("broken") == ["2026-06-01T01:45:00Z"]  # latest missed occurrence
    assert fired_for("paused") == []

    live = list(CronSchedule.objects.order_by("workflow").values())
    call_command("kumiflow_rebuild", verbosity=0)
    assert list(CronSchedule.objects.order_by("workflow").values()) == live


def test_an_operator_reason_cannot_pass_for_broken(registry, clock):
    define_workflow("job", trigger=on_cron("0 9 * * *"), steps=[])
    run_until_idle()
    with pytest.raises(ValueError, match="must not start with"):
        set_enabled("job", False, reason="broken: by hand")
    assert CronSchedule.objects.get().enabled


def test_the_loop_fires_due_schedules_when_sync_fails(registry, clock, monkeypatch, caplog):
    clock.set(START)
    define_workflow("healthy", trigger=on_cron(HEALTHY), steps=[s.return_(1)])
    run_until_idle()

    def sync_schedules():
        raise OperationalError("the database went away while syncing")

    monkeypatch.setattr("kumiflow_django.workers.cron.sync_schedules", sync_schedules)
    clock.set(START + dt.timedelta(hours=1))
    assert CronLoop().run_once() == 1
    assert fired_for("healthy") == ["2026-06-01T01:00:00Z"]
    assert "syncing the schedules failed" in caplog.text
