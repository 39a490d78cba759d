"""Flow control with four worker processes on PostgreSQL and MariaDB: a
concurrency limit of one per key never lets two runs of a key be active at
once, a task limit of three per key never has four attempts in flight, and
a tenant's backlog does not hold up another tenant."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest

from kumiflow_django import start_workflow
from kumiflow_django.models import RunStatus, WorkflowRun
from kumiflow_django.workers.resume import ResumeLoop
from tests.processes import output, spawn, stop, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.server_db,
]

KEYS = [f"customer-{n}" for n in range(5)]


def _all_completed(runs, timeout):
    ids = [r.pk for r in runs]
    wait_for(
        lambda: (
            WorkflowRun.objects.filter(pk__in=ids, status=RunStatus.COMPLETED).count() == len(ids)
        ),
        timeout,
        "every run to complete",
    )


def test_four_hundred_runs_over_five_keys_never_overlap_per_key(tmp_path):
    log = tmp_path / "intervals"
    log.touch()
    runs = [
        start_workflow("flow-probe", payload={"log": str(log), "key": KEYS[n % 5]})
        for n in range(400)
    ]
    # At most one per key was admitted at the start; the others queue.
    assert WorkflowRun.objects.filter(workflow="flow-probe", status="queued").count() == 395
    workers = [spawn("kumiflow_worker", "--max-interval", "0.2") for _ in range(4)]
    try:
        _all_completed(runs, 600)
    finally:
        codes = stop(workers)
    assert codes == [0, 0, 0, 0], [output(w) for w in workers]
    spans: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for line in log.read_text().splitlines():
        key, run, edge, at = line.split()
        spans[key].setdefault(run, [0.0, 0.0])[0 if edge == "start" else 1] = float(at)
    assert sum(len(runs_of_key) for runs_of_key in spans.values()) == 400
    for key, runs_of_key in spans.items():
        intervals = sorted(runs_of_key.values())
        for (_, a_end), (b_start, _) in itertools.pairwise(intervals):
            assert a_end <= b_start, f"key {key}: two runs were active at once"


def test_a_task_limit_of_three_per_key_holds_under_four_workers(tmp_path):
    log = tmp_path / "calls"
    log.touch()
    runs = [
        start_workflow("flow-task-probe", payload={"log": str(log), "key": KEYS[n % 2]})
        for n in range(60)
    ]
    workers = [spawn("kumiflow_worker", "--max-interval", "0.2") for _ in range(4)]
    try:
        _all_completed(runs, 300)
    finally:
        codes = stop(workers)
    assert codes == [0, 0, 0, 0], [output(w) for w in workers]
    calls: dict[str, list[tuple[float, int]]] = defaultdict(list)
    tasks = set()
    for line in log.read_text().splitlines():
        key, task, start, end = line.split()
        tasks.add(task)
        calls[key] += [(float(start), 1), (float(end), -1)]
    assert len(tasks) == 60  # each at least once (an attempt whose outcome was lost runs again)
    for key, edges in calls.items():
        in_flight = peak = 0
        for _, step in sorted(edges, key=lambda e: (e[0], e[1])):  # an end before a start
            in_flight += step
            peak = max(peak, in_flight)
        assert peak <= 3, f"key {key}: {peak} attempts in flight"


@pytest.mark.parametrize("backlog", [10_000])
def test_a_tenant_with_ten_thousand_due_runs_does_not_hold_up_another(registry, backlog):
    from kumiflow_django import define_workflow
    from kumiflow_django import steps as s
    from kumiflow_django.store import clock

    define_workflow("import-row", start_mode="deferred", steps=[s.return_(1)])
    now = clock.now()
    big = _bulk_due_runs("import-row", "big", backlog, now)
    small = [start_workflow("import-row", tenant="small") for _ in range(10)]
    loop = ResumeLoop(batch_size=100, threads=4)
    try:
        loop.run_once()
        loop.run_once()
    finally:
        loop.close()
    done = WorkflowRun.objects.filter(status=RunStatus.COMPLETED)
    assert done.filter(pk__in=[r.pk for r in small]).count() == 10
    assert done.filter(tenant_id="big").count() >= 180
    assert WorkflowRun.objects.filter(tenant_id="big").count() == len(big)


def _bulk_due_runs(workflow_name, tenant, n, now):
    """``n`` deferred runs of a tenant, started the normal way in one transaction."""
    from django.db import transaction

    with transaction.atomic():
        return [start_workflow(workflow_name, tenant=tenant) for _ in range(n)]
