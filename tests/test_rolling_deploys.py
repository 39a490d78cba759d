"""Rolling deploys: a worker never fails a run because it lacks the run's definition.

Each test "deploys" by swapping the registered definition of one workflow,
as an old and a new release of ``workflows.py`` would; the heartbeat rows
of other worker processes are written as those processes would write them.
"""

from __future__ import annotations

import pytest
from django.test import override_settings
from django.urls import reverse

from kumiflow_django import append_event, define_workflow, on_event
from kumiflow_django import steps as s
from kumiflow_django.admin import overview
from kumiflow_django.checks import check_settings
from kumiflow_django.definition import serving
from kumiflow_django.definition.snapshots import remember
from kumiflow_django.engine import unserved
from kumiflow_django.engine.resuming import resume_run
from kumiflow_django.models import RunStatus, WorkerProcess
from kumiflow_django.store import clock as store_clock
from kumiflow_django.workers.resume import ResumeLoop
from tests.helpers import only_run, types

pytestmark = pytest.mark.django_db

OLD = [s.wait("PT1M"), s.return_("old")]
NEW = [s.wait("PT1M"), s.return_("new")]


def deploy(registry, steps):
    """This process now has ``steps`` as the definition of "signup" (and
    stores its snapshot, as a worker does when it starts)."""
    registry.unregister("signup")
    workflow = define_workflow("signup", trigger=on_event("signed-up"), steps=steps)
    remember(workflow)
    return workflow


def resume_all() -> int:
    return ResumeLoop(batch_size=100).run_once()


def another_worker(worker_id, *workflows):
    WorkerProcess.objects.create(
        worker_id=worker_id,
        host="elsewhere",
        pid=1,
        started_at=store_clock.now(),
        last_seen=store_clock.now(),
        definitions=[
            {"workflow": w.name, "version": "", "fingerprint": w.fingerprint, "current": True}
            for w in workflows
        ],
    )


@pytest.fixture
def newer_run(registry, clock):
    """A run that a newer release started; this process has the older definition."""
    old = deploy(registry, OLD)
    clock.advance(seconds=1)
    new = deploy(registry, NEW)
    append_event("u1", "signed-up")
    deploy(registry, OLD)
    return old, new, only_run()


def test_a_worker_does_not_claim_a_run_on_a_newer_definition_it_lacks(newer_run, clock):
    old, new, run = newer_run
    clock.advance(minutes=1)
    before = types(run)
    assert resume_all() == 0
    run.refresh_from_db()
    assert (run.status, run.lease_owner, run.attempt) == (RunStatus.WAITING, "", 1)
    assert types(run) == before, "no attempt spent, nothing written"
    assert list(unserved.waiting().values_list("id", flat=True)) == [run.id]


def test_the_run_completes_on_a_worker_that_has_its_definition(newer_run, registry, clock):
    old, new, run = newer_run
    clock.advance(minutes=1)
    assert resume_all() == 0
    deploy(registry, NEW)
    assert resume_all() == 1
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, "new")


def test_a_run_that_another_live_worker_serves_is_left_to_it(registry, clock):
    old = deploy(registry, OLD)
    append_event("u1", "signed-up")
    clock.advance(seconds=1)
    deploy(registry, NEW)  # this process is newer: old runs are its to take over...
    clock.advance(minutes=1)
    another_worker("old-worker", old)  # ...but a live worker still has their definition
    assert resume_all() == 0
    assert only_run().status == RunStatus.WAITING
    assert not unserved.waiting().exists(), "a live worker serves it: it waits for nobody"

    # The old worker stops sending heartbeats: once it is stale, the newer
    # process takes its runs over (what happens then is the definition check's).
    clock.advance(seconds=serving.stale_after())
    serving.beat("new-worker")
    assert list(WorkerProcess.objects.values_list("pk", flat=True)) == ["new-worker"]
    assert resume_all() == 1
    assert only_run().status != RunStatus.WAITING


def test_heartbeats_refresh_and_stale_rows_are_pruned(registry, clock):
    workflow = deploy(registry, OLD)
    serving.beat("a", started_at=clock.now())
    clock.advance(seconds=serving.heartbeat_interval())
    serving.beat("b", started_at=clock.now())
    row = WorkerProcess.objects.get(pk="a")
    assert row.fingerprints == [workflow.fingerprint]
    assert serving.Served.read().fingerprints == {workflow.fingerprint}

    clock.advance(seconds=serving.stale_after() - serving.heartbeat_interval())
    assert set(serving.live().values_list("pk", flat=True)) == {"b"}, "a is stale"
    serving.beat("b")
    assert set(WorkerProcess.objects.values_list("pk", flat=True)) == {"b"}, "a is pruned"
    serving.leave("b")
    assert not WorkerProcess.objects.exists()
    assert serving.Served.read().fingerprints == frozenset()


def test_the_first_heartbeat_builds_its_snapshots_and_prunes_outside_its_row_transaction(
    registry, clock, monkeypatch
):
    """Building every definition's snapshot is the costly part of a worker's
    start: the transaction that writes its heartbeat row holds no lock meanwhile."""
    from django.db import connection

    deploy(registry, OLD)
    depth = len(connection.atomic_blocks)  # the test's own transaction, if any
    seen: dict[str, int] = {}

    def watched(name, real):
        def call(*args, **kwargs):
            seen[name] = len(connection.atomic_blocks)
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(serving, "remember", watched("remember", remember))
    monkeypatch.setattr(serving, "prune", watched("prune", serving.prune))
    monkeypatch.setattr(serving, "served_here", watched("served_here", serving.served_here))
    serving.beat("a", started_at=clock.now())
    assert seen == {"remember": depth, "prune": depth, "served_here": depth}
    assert WorkerProcess.objects.filter(pk="a").exists()


@override_settings(KUMIFLOW_UNKNOWN_DEFINITION_GRACE=600)
def test_after_the_grace_the_run_fails_naming_the_missing_definition(newer_run, clock):
    old, new, run = newer_run
    clock.advance(minutes=1)  # due now
    clock.advance(seconds=599)
    assert unserved.fail_overdue() == 0
    assert only_run().status == RunStatus.WAITING

    clock.advance(seconds=1)
    assert unserved.fail_overdue() == 1
    run.refresh_from_db()
    assert (run.status, run.reason) == (RunStatus.FAILED, "workflow_definition_not_served")
    assert new.fingerprint in run.last_error and '"signup"' in run.last_error
    assert types(run)[-1] == "run-failed"
    assert not unserved.waiting().exists()


@override_settings(KUMIFLOW_UNKNOWN_DEFINITION_GRACE=600)
def test_a_run_that_a_live_worker_serves_never_fails_for_the_grace(newer_run, clock):
    old, new, run = newer_run
    another_worker("new-worker", new)
    clock.advance(minutes=60)
    WorkerProcess.objects.update(last_seen=clock.now())
    assert unserved.fail_overdue() == 0
    assert only_run().status == RunStatus.WAITING


def checkout(registry, result):
    registry.unregister("checkout")
    workflow = define_workflow(
        "checkout",
        trigger=on_event("ordered"),
        steps=[
            s.wait_for_event(
                "paid",
                match={"payload.order": lambda ctx: ctx.event.payload["order"]},
                timeout="P3D",
            ),
            s.return_(result),
        ],
    )
    remember(workflow)
    return workflow


def test_an_inline_wake_leaves_the_run_due_for_a_worker_that_has_it(registry, clock):
    checkout(registry, "old")
    clock.advance(seconds=1)
    new = checkout(registry, "new")
    append_event("o1", "ordered", {"order": 7})  # started by the new release
    run = only_run()
    assert run.fingerprint == new.fingerprint
    checkout(registry, "old")  # this (web) process still runs the old release

    append_event("p1", "paid", {"order": 7})  # would resume the run inline
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_EVENT, "not failed: left for a worker"
    assert run.matched_position is not None and run.wake_at is not None, "due for a worker"
    assert "run-failed" not in types(run)
    assert resume_all() == 0, "not claimed by the old release either"

    checkout(registry, "new")  # a worker of the new release
    assert resume_all() == 1
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.COMPLETED, "new")


def test_the_console_shows_the_runs_that_wait_for_a_definition(newer_run, admin_client, clock):
    old, new, run = newer_run
    clock.advance(minutes=1)
    serving.beat("old-worker", started_at=clock.now())
    assert overview.backlog(clock.now())["unserved"].value == 1
    page = admin_client.get(reverse("admin:kumiflow_workflowrun_change", args=[run.pk]))
    assert f"Waits for a worker with definition {new.fingerprint[:12]} of" in page.text
    listed = admin_client.get(
        reverse("admin:kumiflow_workflowrun_changelist") + "?attention=definition"
    ).context["cl"]
    assert [r.pk for r in listed.result_list] == [run.pk]
    workers = admin_client.get(reverse("admin:kumiflow_workerprocess_changelist"))
    assert "old-worker" in workers.text and old.fingerprint[:12] in workers.text

    serving.beat("new-worker", started_at=clock.now())
    WorkerProcess.objects.filter(pk="new-worker").update(
        definitions=[{"workflow": "signup", "version": "", "fingerprint": new.fingerprint}]
    )
    assert overview.backlog(clock.now())["unserved"].value == 0
    page = admin_client.get(reverse("admin:kumiflow_workflowrun_change", args=[run.pk]))
    assert "Waits for a worker" not in page.text


@pytest.mark.parametrize(
    ("setting", "value", "check_id"),
    [
        ("KUMIFLOW_WORKER_STALE_SECONDS", 0, "kumiflow.E072"),
        ("KUMIFLOW_WORKER_STALE_SECONDS", "60", "kumiflow.E072"),
        ("KUMIFLOW_UNKNOWN_DEFINITION_GRACE", None, "kumiflow.E073"),
        ("KUMIFLOW_UNKNOWN_DEFINITION_GRACE", -1, "kumiflow.E073"),
    ],
)
def test_the_deploy_settings_are_checked(settings, setting, value, check_id):
    setattr(settings, setting, value)
    assert check_id in [e.id for e in check_settings()]


def test_the_staleness_defaults_to_the_lease(settings):
    settings.KUMIFLOW_LEASE_SECONDS = 30
    assert (serving.stale_after(), serving.heartbeat_interval()) == (30, 10)
    settings.KUMIFLOW_WORKER_STALE_SECONDS = 90
    assert serving.stale_after() == 90
    assert not [e for e in check_settings() if e.id in ("kumiflow.E072", "kumiflow.E073")]


def test_a_resume_outside_the_worker_leaves_a_run_it_cannot_run(newer_run, clock):
    """A Django Tasks wake-up (or any caller of resume_run) in a process of the
    old release: nothing happens to the run, it stays due."""
    old, new, run = newer_run
    clock.advance(minutes=1)
    before = types(run)
    assert resume_run(run.id) is None
    run.refresh_from_db()
    assert (run.status, types(run)) == (RunStatus.WAITING, before)
    assert run.wake_at is not None and run.wake_at <= clock.now()


# -- the plan and the sweep read the same heartbeat rows as the claim ---------


def plan_of(workflow: str):
    from kumiflow_django.engine.deploys import DeployPlan

    return {g.fate: g for g in DeployPlan().groups() if g.workflow == workflow}


def test_the_plan_says_a_live_old_worker_keeps_a_run_the_new_code_carries_on(registry, clock):
    from kumiflow_django.engine.deploys import Fate

    old = deploy(registry, OLD)
    append_event("u1", "signed-up")
    deploy(registry, [*OLD, s.return_("appended")])  # a compatible change: the new code
    another_worker("old-release", old)
    group = plan_of("signup")[Fate.CARRIED_ON]
    assert (group.count, group.served) == (1, True)
    WorkerProcess.objects.all().delete()  # the old worker stopped
    group = plan_of("signup")[Fate.CARRIED_ON]
    assert (group.count, group.served) == (1, False)


def test_the_plan_counts_a_run_that_fails_once_the_live_old_worker_stops(registry, clock):
    from django.core.management import call_command

    from kumiflow_django.engine.deploys import DeployPlan, Fate

    old = deploy(registry, OLD)
    append_event("u1", "signed-up")
    deploy(registry, [s.wait("PT2M"), s.return_("old")])  # its current step changed
    another_worker("old-release", old)
    group = plan_of("signup")[Fate.FAILS]
    assert group.served, "a live worker keeps it now"
    # The release step still stops: stopping the old workers is the deploy.
    assert DeployPlan().failing() == 1
    with pytest.raises(SystemExit):
        call_command("kumiflow_plan")
    # And the deploy does what the plan said: left while the old worker
    # lives, failed with the precise reason at once once it is gone.
    clock.advance(minutes=1)
    WorkerProcess.objects.update(last_seen=store_clock.now())  # its heartbeat
    assert resume_all() == 0
    WorkerProcess.objects.all().delete()
    resume_all()
    run = only_run()
    assert run.status == RunStatus.FAILED
    assert "step 0" in run.last_error and "incompatible" in run.last_error


def test_the_plan_leaves_a_run_on_a_newer_definition_to_its_release(newer_run, clock):
    from kumiflow_django.engine.deploys import Fate

    old, new, run = newer_run
    plan = plan_of("signup")
    assert set(plan) == {Fate.WAITS}, "never carried on or failed by the older code"
    assert "no live worker serves it" in plan[Fate.WAITS].why
    another_worker("new-release", new)
    plan = plan_of("signup")
    assert plan[Fate.WAITS].served and "a live worker serves it" in plan[Fate.WAITS].why
    clock.advance(minutes=1)
    assert resume_all() == 0, "the claim agrees: the run is left"


@override_settings(KUMIFLOW_UNKNOWN_DEFINITION_GRACE=600)
def test_the_sweep_asks_again_under_the_lock_whether_a_worker_serves_the_run(newer_run, clock):
    old, new, run = newer_run
    clock.advance(minutes=11)
    stale = serving.Served.read()  # the pass's reading: nobody serves it
    another_worker("new-release", new)  # a worker came up since
    assert unserved._fail(run.id, store_clock.now()) is None
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    assert run.fingerprint not in stale.fingerprints


@override_settings(KUMIFLOW_UNKNOWN_DEFINITION_GRACE=600)
def test_the_sweep_does_not_fail_a_run_a_worker_has_just_claimed(newer_run, clock):
    from datetime import timedelta

    from kumiflow_django.models import WorkflowRun

    old, new, run = newer_run
    clock.advance(minutes=11)
    WorkflowRun.objects.filter(pk=run.pk).update(
        lease_owner="new-release", lease_until=store_clock.now() + timedelta(seconds=60)
    )
    assert unserved.fail_overdue() == 0
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING


# -- the claim filter's SQL ----------------------------------------------------


def test_a_worker_with_no_workflows_claims_nothing_and_does_not_break(registry, clock):
    deploy(registry, OLD)
    append_event("u1", "signed-up")
    registry.unregister("signup")  # a worker of a project without workflows
    clock.advance(minutes=1)
    assert str(unserved.claim_filter())  # an empty IN list is a valid filter
    assert resume_all() == 0
    assert only_run().status == RunStatus.WAITING


def test_the_claim_filter_takes_over_among_many_old_definitions(registry, clock):
    """A workflow deployed many times keeps a snapshot per definition: the
    claim's ``fingerprint IN (…)`` list grows with them (past SQLite's old
    999 variables) and still finds the run of an old one."""
    from hashlib import sha256

    from kumiflow_django.definition.snapshots import DefinitionSnapshot

    deploy(registry, OLD)
    append_event("u1", "signed-up")
    DefinitionSnapshot.objects.bulk_create(
        DefinitionSnapshot(
            fingerprint=sha256(str(i).encode()).hexdigest(),
            workflow="signup",
            created_at=store_clock.now(),
        )
        for i in range(1500)
    )
    clock.advance(seconds=1)
    deploy(registry, NEW)  # stored after all of them: they are older
    clock.advance(minutes=1)
    assert resume_all() == 1
    run = only_run()
    assert (run.status, run.result) == (RunStatus.COMPLETED, "new")


def test_a_worker_takes_runs_over_only_once_every_live_worker_announced_itself(registry, clock):
    """After an outage the whole fleet starts at once: a new worker up for less
    than a heartbeat's staleness leaves an old definition's runs (an old
    worker may not have announced itself yet) instead of failing them."""
    deploy(registry, OLD)
    append_event("u1", "signed-up")
    deploy(registry, [s.wait("PT2M"), s.return_("old")])  # incompatible for the run
    clock.advance(minutes=1)
    fresh = ResumeLoop(batch_size=100, settle_takeovers=True)
    assert fresh.run_once() == 0
    assert only_run().status == RunStatus.WAITING, "left, not failed"
    fresh._born -= serving.stale_after()  # up for a heartbeat's staleness now
    assert fresh.run_once() == 1
    run = only_run()
    assert run.status == RunStatus.FAILED and "incompatible" in run.last_error
