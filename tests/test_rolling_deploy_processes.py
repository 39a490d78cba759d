"""A rolling deploy: two worker processes with different definitions of one
workflow side by side, on PostgreSQL and MariaDB. No run fails; each run
completes on a process that has its definition; none is claimed by the other."""

from __future__ import annotations

import pytest

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


def worker(release: str):
    proc = spawn(
        "kumiflow_worker",
        "--no-cron",
        "--no-dispatch",
        "--max-interval",
        "0.2",
        "-v",
        "2",
        env={"SHOP_RELEASE": release},
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
