"""Deploys under running runs: the table of changes (docs/deploying.md,
"Compatible changes"), the policies, the switch event, and the deploy plan.

Each row of the table is a real run: a workflow is defined, a run starts and
suspends (at a wait, a task, a loop, a join), the workflow is registered
again under the same name with a change (what a deploy does to the process
that resumes the run), and the run resumes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from django.core.management import call_command

from kumiflow_django import append_event, define_workflow, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.admin.timeline import line
from kumiflow_django.definition.snapshots import snapshot
from kumiflow_django.engine.deploys import DeployPlan, Fate
from kumiflow_django.models import RunStatus, WorkflowRun
from kumiflow_django.projections.rebuild import rebuild_all
from kumiflow_django.store import telemetry
from kumiflow_django.testing import run_until_idle
from testproject.shop.tasks import double, double_immediate
from tests.helpers import only_run, run_events, types

pytestmark = pytest.mark.django_db

SWITCHED = "kumiflow.workflow.definition-switched"


def deploy(registry, name: str, steps: list[Any], **options: Any):
    """What a deploy does to the process that resumes the run: the workflow's
    new definition is the only one registered under its name."""
    registry.unregister(name)
    return define_workflow(name, steps=steps, **options)


def resume_after(clock, hours: float = 1) -> None:
    clock.advance(hours=hours)
    run_until_idle()


def first() -> Any:
    return s.compute("a", lambda ctx: 1)


def later() -> Any:
    return s.compute("b", lambda ctx: "b1")


def results() -> Any:
    """The last step of a new definition: the run's result is its step results."""
    return s.return_(lambda ctx: dict(ctx.steps))


def results_of(run: WorkflowRun) -> dict[str, Any]:
    assert isinstance(run.result, dict)
    return run.result


def assert_carried_on(run: WorkflowRun, new) -> None:
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.last_error
    assert run.fingerprint == new.fingerprint, "the row follows the switch (the fold)"
    switched = [e for e in run_events(run) if e.type == SWITCHED]
    assert len(switched) == 1
    assert switched[0].payload["to_fingerprint"] == new.fingerprint
    assert switched[0].payload["from_fingerprint"] != new.fingerprint


def assert_failed_at(run: WorkflowRun, path: str, change: str) -> None:
    run.refresh_from_db()
    assert (run.status, run.reason) == (RunStatus.FAILED, "workflow_definition_changed")
    assert f"step {path} " in run.last_error and f"{change} changed" in run.last_error, (
        run.last_error
    )
    assert "Cancel the run" not in run.last_error
    assert SWITCHED not in {e.type for e in run_events(run)}


# --- the table of changes -----------------------------------------------------


def test_a_step_appended_carries_the_run_on(registry, clock):
    define_workflow("w", steps=[first(), s.wait("PT1H"), later()])
    run = start_workflow("w")
    new = deploy(registry, "w", [first(), s.wait("PT1H"), later(), later_c(), results()])
    resume_after(clock)
    assert_carried_on(run, new)
    assert run.result == {"a": 1, "b": "b1", "c": 3}
    assert types(run)[2:4] == ["definition-switched", "step.resumed"]


def test_a_step_inserted_after_the_position_runs(registry, clock):
    define_workflow("w", steps=[first(), s.wait("PT1H"), later()])
    run = start_workflow("w")
    inserted = s.compute("x", lambda c: 9)
    new = deploy(registry, "w", [first(), s.wait("PT1H"), inserted, later(), results()])
    resume_after(clock)
    assert_carried_on(run, new)
    assert run.result == {"a": 1, "x": 9, "b": "b1"}


def test_a_step_inserted_before_the_position_fails_the_run(registry, clock):
    define_workflow("w", steps=[first(), s.wait("PT1H"), later()])
    run = start_workflow("w")
    deploy(registry, "w", [first(), s.compute("x", lambda c: 9), s.wait("PT1H"), later()])
    resume_after(clock)
    # Its position (step 1) now holds another step.
    assert_failed_at(run, "1", "kind")
    assert "the step the run is suspended in" in run.last_error


def test_an_executed_step_renamed_fails_the_run(registry, clock):
    define_workflow("w", steps=[first(), s.wait("PT1H"), later()])
    run = start_workflow("w")
    deploy(registry, "w", [s.compute("a2", lambda ctx: 1), s.wait("PT1H"), later()])
    resume_after(clock)
    assert_failed_at(run, "0", "name")
    assert "a step the run executed" in run.last_error


def test_a_resolver_changed_in_an_executed_step_carries_the_run_on(registry, clock):
    define_workflow("w", steps=[first(), s.wait("PT1H"), later()])
    run = start_workflow("w")
    changed = s.compute("a", lambda ctx: 2)
    new = deploy(registry, "w", [changed, s.wait("PT1H"), later(), results()])
    resume_after(clock)
    assert_carried_on(run, new)
    assert results_of(run)["a"] == 1, "an executed step does not run again"


def test_a_resolver_changed_in_the_current_step_fails_the_run(registry, clock):
    define_workflow("w", steps=[first(), s.wait(lambda ctx: "PT1H"), later()])
    run = start_workflow("w")
    deploy(registry, "w", [first(), s.wait(lambda ctx: "PT2H"), later()])
    resume_after(clock)
    assert_failed_at(run, "1", "resolvers")


def test_a_resolver_changed_in_a_future_step_carries_the_run_on(registry, clock):
    define_workflow("w", steps=[first(), s.wait("PT1H"), later()])
    run = start_workflow("w")
    changed = s.compute("b", lambda ctx: "b2")
    new = deploy(registry, "w", [first(), s.wait("PT1H"), changed, results()])
    resume_after(clock)
    assert_carried_on(run, new)
    assert results_of(run)["b"] == "b2", "the new code of a step it had not reached runs"


def test_a_wait_duration_changed_while_waiting_fails_the_run(registry, clock):
    define_workflow("w", steps=[first(), s.wait("PT1H"), later()])
    run = start_workflow("w")
    deploy(registry, "w", [first(), s.wait("PT2H"), later()])
    resume_after(clock)
    assert_failed_at(run, "1", "arguments")


def test_a_branch_added_after_the_position_runs(registry, clock):
    define_workflow("w", steps=[first(), s.wait("PT1H"), later()])
    run = start_workflow("w")
    added = s.branch(lambda ctx: ctx.steps["a"] == 1, then=[s.compute("c", lambda c: "then")])
    new = deploy(registry, "w", [first(), s.wait("PT1H"), later(), added, results()])
    resume_after(clock)
    assert_carried_on(run, new)
    assert results_of(run)["c"] == "then"


def test_a_for_each_body_changed_while_inside_it_fails_the_run(registry, clock):
    body = [s.wait("PT1H"), s.compute("x", lambda ctx: ctx.scope["i"])]
    define_workflow("w", steps=[s.for_each([1, 2], "i", body)])
    run = start_workflow("w")
    deploy(registry, "w", [s.for_each([1, 2], "i", [*body, s.compute("y", lambda c: 0)])])
    resume_after(clock)
    assert_failed_at(run, "0", "steps below")
    assert "a step that holds the run's position" in run.last_error


def test_a_parallel_branch_added_while_joining_fails_the_run(registry, clock):
    branches = {"one": [s.wait("PT1H")], "two": [s.wait("PT2H")]}
    define_workflow("w", steps=[s.parallel("p", branches)])
    run = start_workflow("w")
    deploy(registry, "w", [s.parallel("p", {**branches, "three": [s.compute("c", lambda c: 3)]})])
    resume_after(clock, hours=2)
    assert_failed_at(run, "0", "steps below")


def test_a_task_function_changed_while_an_attempt_runs_fails_the_run(registry, clock):
    define_workflow("w", steps=[s.task("t", double, args=[21]), s.return_("ok")])
    run = start_workflow("w")
    deploy(registry, "w", [s.task("t", double_immediate, args=[21]), s.return_("ok")])
    run_until_idle()
    assert_failed_at(run, "0", "arguments")


def test_a_changed_trigger_carries_the_run_on(registry, clock):
    define_workflow("w", trigger=on_event("go"), steps=[first(), s.wait("PT1H"), later()])
    append_event("g", "go")
    run = only_run()
    new = deploy(registry, "w", [first(), s.wait("PT1H"), later()], trigger=on_event("start"))
    resume_after(clock)
    assert_carried_on(run, new)


def test_a_changed_idempotency_key_changes_nothing_for_the_run(registry, clock):
    define_workflow(
        "w", trigger=on_event("go"), idempotency_key="payload.a", steps=[s.wait("PT1H")]
    )
    append_event("g", "go", {"a": 1, "b": 2})
    run = only_run()
    new = deploy(registry, "w", [s.wait("PT1H")], trigger=on_event("go"), idempotency_key="b")
    assert new.fingerprint == run.fingerprint, "the key decides starts: not in the fingerprint"
    resume_after(clock)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert SWITCHED not in {e.type for e in run_events(run)}


# --- policies and versions --------------------------------------------------


def test_on_change_fail_fails_even_a_compatible_change(registry, clock):
    define_workflow("w", steps=[first(), s.wait("PT1H"), later()])
    run = start_workflow("w")
    deploy(registry, "w", [first(), s.wait("PT1H"), later(), later_c()], on_change="fail")
    resume_after(clock)
    run.refresh_from_db()
    assert (run.status, run.reason) == (RunStatus.FAILED, "workflow_definition_changed")
    assert 'on_change="fail"' in run.last_error and "Cancel the run" not in run.last_error


def later_c() -> Any:
    return s.compute("c", lambda ctx: 3)


def test_on_change_pin_keeps_runs_on_their_version_while_it_is_registered(registry, clock):
    old = define_workflow("w", version=1, steps=[first(), s.wait("PT1H"), later()])
    run = start_workflow("w")
    new = define_workflow(
        "w", version=2, on_change="pin", steps=[first(), s.wait("PT1H"), later(), later_c()]
    )
    assert new.fingerprint != old.fingerprint
    resume_after(clock)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert (run.fingerprint, run.workflow_version) == (old.fingerprint, "1")
    assert "3" not in run.trail, "it ran its own version"


def test_on_change_pin_fails_a_run_whose_version_is_gone(registry, clock):
    define_workflow("w", version=1, steps=[first(), s.wait("PT1H"), later()])
    run = start_workflow("w")
    deploy(registry, "w", [first(), s.wait("PT1H"), later()], version=2, on_change="pin")
    resume_after(clock)
    run.refresh_from_db()
    assert run.reason == "workflow_definition_changed"
    assert 'on_change="pin"' in run.last_error and "version 1" in run.last_error


def test_the_switch_is_folded_counted_shown_and_rebuilt(
    registry, clock, django_capture_on_commit_callbacks
):
    counted: list[tuple[str, float, dict[str, str]]] = []

    class Meter:
        def count(self, metric: str, value: float, labels: Mapping[str, str]) -> None:
            counted.append((metric, value, dict(labels)))

        def observe(self, metric: str, value: float, labels: Mapping[str, str]) -> None:
            pass

    define_workflow("w", version="1", steps=[first(), s.wait("PT1H"), later()])
    run = start_workflow("w")
    new = deploy(registry, "w", [first(), s.wait("PT1H"), later(), later_c()], version="2")
    clock.advance(hours=1)
    with telemetry.isolated(), django_capture_on_commit_callbacks(execute=True):
        telemetry.set_meter(Meter())
        run_until_idle()
    assert_carried_on(run, new)
    assert (run.workflow_version, run.started_version) == ("2", "1")
    assert snapshot(new.fingerprint) is not None, "the new definition's snapshot is stored"
    switches = [c for c in counted if c[0] == telemetry.DEFINITION_SWITCHES]
    assert switches == [
        (telemetry.DEFINITION_SWITCHES, 1, {"workflow": "w", "classification": "compatible"})
    ]
    event = next(e for e in run_events(run) if e.type == SWITCHED)
    summary = line(event).summary
    assert f"to {new.fingerprint[:12]}" in summary and "version 1 → 2" in summary
    before = WorkflowRun.objects.values("fingerprint", "workflow_version", "started_version").get()
    rebuild_all()
    after = WorkflowRun.objects.values("fingerprint", "workflow_version", "started_version").get()
    assert (
        before
        == after
        == {
            "fingerprint": new.fingerprint,
            "workflow_version": "2",
            "started_version": "1",
        }
    )


def test_resolvers_branch_on_the_version_a_run_started_on(registry, clock):
    define_workflow("w", version="1", steps=[s.wait("PT1H"), s.return_("v1")])
    old_run = start_workflow("w")
    deploy(
        registry,
        "w",
        [
            s.wait("PT1H"),
            s.return_(
                lambda ctx: (
                    f"old: started on {ctx.started_version}, runs on {ctx.run.version}"
                    if ctx.started_version == "1"
                    else "new"
                )
            ),
        ],
        version="2",
    )
    new_run = start_workflow("w")
    resume_after(clock)
    old_run.refresh_from_db()
    new_run.refresh_from_db()
    assert (old_run.result, new_run.result) == ("old: started on 1, runs on 2", "new")


# --- the story: a stale worker does not fail a newer run -----------------------

CHARGES: list[str] = []


def charge(ctx: Any) -> str:
    CHARGES.append(str(ctx.run.id))
    return "charged"


def test_a_process_holding_the_older_definition_carries_the_newer_run_on(registry, clock):
    """The story of issue 24: the web process started a run on v2 (a step
    appended after the charge); a worker still on v1 resumes it. It must not
    fail it (no compensation, nothing charged twice): the change is
    compatible for the run, which completes."""
    CHARGES.clear()
    v1 = [s.compute("charge", charge), s.wait("PT10M")]
    v2 = [*v1, s.compute("receipt", lambda ctx: "mailed")]
    define_workflow("checkout", steps=v2)
    run = start_workflow("checkout")
    assert [str(run.id)] == CHARGES
    stale = deploy(registry, "checkout", v1)  # the worker's process: still v1
    resume_after(clock, hours=1)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.last_error
    assert [str(run.id)] == CHARGES, "the charge happened once"
    assert run.fingerprint == stale.fingerprint


# --- the plan -------------------------------------------------------------------


def runs_in_flight(registry, clock):
    """Runs of three workflows, then a deploy of new code: one carried on, one
    unchanged, one that would fail, one whose workflow is gone."""
    define_workflow("mail", steps=[first(), s.wait("PT1H"), later()])
    define_workflow("steady", steps=[s.wait("PT1H")])
    define_workflow("gone", steps=[s.wait("PT1H")])
    made = {
        "mail": [start_workflow("mail") for _ in range(3)],
        "steady": [start_workflow("steady")],
        "gone": [start_workflow("gone")],
    }
    deploy(registry, "mail", [first(), s.wait("PT1H"), later(), later_c()])
    registry.unregister("gone")
    define_workflow("timed", steps=[first(), s.wait("PT1H"), later()])
    made["timed"] = [start_workflow("timed")]
    deploy(registry, "timed", [first(), s.wait("PT2H"), later()])
    return made


def test_the_plan_says_what_happens_to_each_group_of_runs(registry, clock):
    made = runs_in_flight(registry, clock)
    groups = {(g.workflow, g.fate): g for g in DeployPlan().groups()}
    assert set(groups) == {
        ("mail", Fate.CARRIED_ON),
        ("steady", Fate.UNCHANGED),
        ("gone", Fate.WAITS),
        ("timed", Fate.FAILS),
    }
    assert groups["mail", Fate.CARRIED_ON].count == 3
    assert groups["mail", Fate.CARRIED_ON].position == "1"
    assert groups["mail", Fate.CARRIED_ON].sample in {str(r.id) for r in made["mail"]}
    assert "step 1" in groups["timed", Fate.FAILS].why
    assert DeployPlan().failing() == 1
    # The plan and the deploy agree: the runs do what the plan said.
    resume_after(clock, hours=2)
    statuses = {w: [r.status for r in WorkflowRun.objects.filter(workflow=w)] for w in made}
    assert statuses["mail"] == [RunStatus.COMPLETED] * 3
    assert statuses["timed"] == [RunStatus.FAILED]


def test_the_plan_reads_at_most_its_limit_of_runs_one_by_one(registry, clock):
    runs_in_flight(registry, clock)
    plan = DeployPlan(limit=2)
    groups = plan.groups()
    assert plan.truncated
    assert sum(g.count for g in groups if g.workflow == "mail") == 2


def test_kumiflow_plan_fails_a_release_where_runs_would_fail(registry, clock, capsys):
    runs_in_flight(registry, clock)
    with pytest.raises(SystemExit) as exited:
        call_command("kumiflow_plan")
    assert exited.value.code == 1
    out = capsys.readouterr().out
    assert "will fail" in out and "carried on" in out and "1 run(s) would fail" in out

    with pytest.raises(SystemExit):
        call_command("kumiflow_plan", "--json")
    data = json.loads(capsys.readouterr().out)
    assert data["failing"] == 1
    assert {g["fate"] for g in data["groups"]} == {
        "carried on",
        "unchanged",
        "waits for a worker",
        "will fail",
    }


def test_kumiflow_plan_passes_a_release_where_no_run_would_fail(registry, clock, capsys):
    define_workflow("mail", steps=[first(), s.wait("PT1H"), later()])
    start_workflow("mail")
    deploy(registry, "mail", [first(), s.wait("PT1H"), later(), later_c()])
    call_command("kumiflow_plan")  # no SystemExit: exit status 0
    assert "no run would fail" in capsys.readouterr().out


def test_the_system_check_warns_of_runs_that_would_fail(registry, clock):
    from kumiflow_django.checks import check_deploy_plan

    assert check_deploy_plan() == []
    runs_in_flight(registry, clock)
    warnings = check_deploy_plan()
    assert [w.id for w in warnings] == ["kumiflow.W080"]
    assert "1 run(s) in flight would fail" in warnings[0].msg


def test_a_process_older_than_the_run_leaves_it(registry, clock):
    """The run's definition was first used after the process's own: the
    stale process does not resume it (it would have to drop or guess at the
    newer steps), it leaves it due for a worker that has its definition."""
    define_workflow("w", steps=[s.wait("PT1H")])
    start_workflow("w")  # this definition's snapshot: now
    clock.advance(minutes=5)
    deploy(registry, "w", [s.wait("PT2H")])  # the web process, newer code
    newer = start_workflow("w")
    deploy(registry, "w", [s.wait("PT1H")])  # the stale worker
    resume_after(clock, hours=2)
    newer.refresh_from_db()
    assert newer.status == RunStatus.WAITING
    assert newer.reason == ""


def test_the_admin_says_what_a_retry_will_do_after_a_deploy(registry, clock):
    from kumiflow_django.admin.runs import _explain_retry

    define_workflow("w", steps=[s.wait("PT1H"), s.compute("x", lambda c: 1 / 0)])
    run = start_workflow("w")
    resume_after(clock)
    run.refresh_from_db()
    assert run.reason == "step_failed"
    fixed = deploy(registry, "w", [s.wait("PT1H"), s.compute("x", lambda c: 1)])
    assert f"carries on on the current one ({fixed.fingerprint[:12]}" in " ".join(
        _explain_retry(run)
    )
    deploy(registry, "w", [s.wait("PT2H"), s.compute("x", lambda c: 1)])
    assert "the run will fail again" in " ".join(_explain_retry(run))


def test_a_deferred_run_not_started_yet_starts_on_the_new_definition(registry, clock):
    define_workflow("w", start_mode="deferred", steps=[s.return_("v1")])
    run = start_workflow("w")
    new = deploy(registry, "w", [s.return_("v2")], start_mode="deferred")
    run_until_idle()
    assert_carried_on(run, new)
    assert run.result == "v2"
