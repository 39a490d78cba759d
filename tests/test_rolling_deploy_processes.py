"""A rolling deploy: two worker processes with different definitions of one
workflow side by side, on PostgreSQL and MariaDB. No run fails; each run
completes on a process that has its definition; none is claimed by the other."""

from __future__ import annotations

import pytest
from django.test import override_settings

from kumiflow_django import start_workflow
from kumiflow_django.definition.registry import registry
from kumiflow_django.models import Event, RunStatus, WorkerProcess, WorkflowRun
from kumiflow_django.store import names as ev
from testproject.shop.workflows import rolling_deploy
from tests.processes import output, spawn, stop, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server_db]

RUNS = 15


def start(release: str, n: int) -> list[WorkflowRun]:
    """``n`` runs started by a web process of ``release``."""
    with registry.isolated():
        rolling_deploy(release)
        return [start_workflow("rolling-deploy") for _ in range(n)]


def worker(release: str, **env: str):
    proc = spawn(
        "kumiflow_worker",
        "--no-cron",
        "--no-dispatch",
        "--max-interval",
        "0.2",
        "-v",
        "2",
        env={"SHOP_RELEASE": release, **env},
    )
    wait_for(
        lambda: proc.poll() is not None or WorkerProcess.objects.filter(pid=proc.pid).exists(),
        60,
        f"the release {release} worker's heartbeat row",
    )
    assert proc.poll() is None, output(proc)
    return proc


def test_old_and_new_workers_side_by_side_fail_nothing():
    fingerprint = {}
    for release in "ab":
        with registry.isolated():
            fingerprint[release] = rolling_deploy(release).fingerprint
    assert fingerprint["a"] != fingerprint["b"]
    old = worker("a")
    workers = [old]
    try:
        runs = start("a", RUNS)
        # The new release's web process starts runs before any new worker is
        # up: the old worker must leave them alone, not fail them.
        runs += start("b", RUNS)
        new = worker("b")
        workers.append(new)
        served = {
            r: WorkerProcess.objects.get(pid=w.pid).fingerprints
            for r, w in zip("ab", workers, strict=True)
        }
        assert fingerprint["b"] in served["b"] and fingerprint["b"] not in served["a"]
        assert fingerprint["a"] in served["a"] and fingerprint["a"] not in served["b"]
        runs += start("a", RUNS) + start("b", RUNS)
        ids = [r.pk for r in runs]
        wait_for(
            lambda: (
                WorkflowRun.objects.filter(pk__in=ids)
                .exclude(status__in=[RunStatus.WAITING, RunStatus.PENDING, RunStatus.RUNNING])
                .count()
                == len(ids)
            ),
            300,
            "every run to end",
        )
    finally:
        codes = stop(workers)
    assert codes == [0, 0], [output(w) for w in workers]
    assert not WorkerProcess.objects.exists(), "each worker deleted its row when it stopped"

    pids = {"a": old.pid, "b": new.pid}
    ended = WorkflowRun.objects.filter(workflow="rolling-deploy")
    assert ended.count() == 4 * RUNS
    assert not ended.exclude(status=RunStatus.COMPLETED).exists(), [
        (r.status, r.last_error) for r in ended.exclude(status=RunStatus.COMPLETED)
    ]
    for run in ended:
        release = "a" if run.fingerprint == fingerprint["a"] else "b"
        assert run.fingerprint == fingerprint[release]
        assert run.result == {"release": release, "pid": pids[release]}, run.id
    # Each run was resumed once per wait by the worker that has it: no claim
    # by the other worker got as far as a segment, none was refused or failed.
    resumed = Event.objects.filter(stream_id__in=[str(r.pk) for r in ended], type=ev.STEP_RESUMED)
    assert resumed.count() == 2 * RUNS + 2 * 2 * RUNS  # release b waits twice
    assert not Event.objects.filter(type__in=[ev.RUN_FAILED, ev.SEGMENT_REFUSED]).exists()
    # Claims counted per process (each claim that reached a segment logs it):
    # the old worker resumed only runs of the old release, the new one only
    # runs of the new release, each once per wait; nothing was claimed and left.
    for release, proc in zip("ab", workers, strict=True):
        log = output(proc)
        assert "left for a worker" not in log
        for run in ended:
            mine = run.fingerprint == fingerprint[release]
            waits = 2 if release == "b" else 1
            assert log.count(f"run {run.pk} of rolling-deploy resumed") == (waits if mine else 0)


def test_kumiflow_resume_announces_what_it_serves_too():
    proc = spawn("kumiflow_resume", "--max-interval", "0.2", env={"SHOP_RELEASE": "b"})
    try:
        wait_for(
            lambda: proc.poll() is not None or WorkerProcess.objects.filter(pid=proc.pid).exists(),
            60,
            "the resume process's heartbeat row",
        )
        with registry.isolated():
            new = rolling_deploy("b").fingerprint
        assert new in WorkerProcess.objects.get(pid=proc.pid).fingerprints
    finally:
        codes = stop([proc])
    assert codes == [0], output(proc)
    assert not WorkerProcess.objects.exists()


def test_a_compatible_change_carries_the_old_workers_runs_on_once_it_stops():
    """The whole story: an old worker (release a) and a new one (release b, a
    step appended) side by side, runs started on both; the old worker keeps
    its runs while it lives; SIGTERM; the new one carries them on, each with a
    definition-switched event. Nothing fails; each run is charged once."""
    from kumiflow_django import append_event
    from testproject.shop.models import Tally
    from testproject.shop.workflows import safe_deploy

    with registry.isolated():
        release_a = safe_deploy("a").fingerprint
    with registry.isolated():
        release_b = safe_deploy("b").fingerprint

    def begin(release: str, n: int) -> list[str]:
        with registry.isolated():
            safe_deploy(release)
            return [str(start_workflow("safe-deploy").pk) for _ in range(n)]

    def go(ids: list[str]) -> None:
        # Marked due for a worker (the appender knows what the runs await),
        # never resumed here: the workers decide who resumes what.
        with registry.isolated(), override_settings(KUMIFLOW_EVENT_WAKE="worker"):
            safe_deploy("a")
            for run_id in ids:
                append_event(f"go-{run_id}", "deploy.go", {"run": run_id})

    def all_in(ids: list[str], status: str) -> bool:
        return WorkflowRun.objects.filter(pk__in=ids, status=status).count() == len(ids)

    # A worker takes runs over once up for a heartbeat's staleness: 10 s here.
    stale = {"KUMIFLOW_WORKER_STALE_SECONDS": "10"}
    old = worker("a", **stale)
    new = None
    try:
        kept, taken = begin("a", 3), begin("a", 3)
        new = worker("b", **stale)
        fresh = begin("b", 3)
        started = kept + taken + fresh
        wait_for(lambda: all_in(started, RunStatus.WAITING_EVENT), 120, "every run charged")
        # While the old worker lives it keeps the runs of its definition.
        go(kept)
        wait_for(lambda: all_in(kept, RunStatus.COMPLETED), 120, "the old worker's runs")
        assert stop([old]) == [0], output(old)
        assert not WorkerProcess.objects.filter(pid=old.pid).exists()
        go(taken + fresh)
        wait_for(
            lambda: (
                WorkflowRun.objects.filter(pk__in=started)
                .exclude(status=RunStatus.WAITING_EVENT)
                .exclude(status=RunStatus.RUNNING)
                .count()
                == len(started)
            ),
            120,
            "every run to end",
        )
    finally:
        codes = stop([p for p in (old, new) if p is not None and p.poll() is None])
    assert codes == [0], output(new)

    runs = {str(r.pk): r for r in WorkflowRun.objects.filter(pk__in=started)}
    assert {r.status for r in runs.values()} == {RunStatus.COMPLETED}, [
        (r.status, r.last_error) for r in runs.values()
    ]
    assert not Event.objects.filter(type__in=[ev.RUN_FAILED, ev.SEGMENT_REFUSED]).exists()
    counts = dict(Tally.objects.values_list("key", "count"))
    for run_id in started:
        assert counts[f"charge:{run_id}"] == 1, run_id
    for run_id in kept:
        assert f"receipt:{run_id}" not in counts, "finished on release a"
    for run_id in taken + fresh:
        assert counts[f"receipt:{run_id}"] == 1, run_id
    switched = Event.objects.filter(stream_id__in=started, type=ev.DEFINITION_SWITCHED)
    assert sorted(e.stream_id for e in switched) == sorted(taken)
    for e in switched:
        assert (e.payload["from_fingerprint"], e.payload["to_fingerprint"]) == (
            release_a,
            release_b,
        )
        assert e.payload["classification"] == "compatible"
    assert {runs[i].fingerprint for i in kept} == {release_a}
    log = output(new)
    assert "left for a worker" not in log
    for run_id in kept:
        assert f"run {run_id} of safe-deploy resumed" not in log
