"""Branches of one run never run at the same time, even with four worker
processes: the run's row is the unit of locking, and every branch advances
in one of its run's segments."""

from __future__ import annotations

import itertools

import pytest

from kumiflow_django import start_workflow
from kumiflow_django.models import RunStatus, WorkflowRun
from tests.processes import output, spawn, stop, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.server_db,
]


def test_branches_of_one_run_never_overlap_with_four_workers(tmp_path):
    log = tmp_path / "intervals"
    runs = [start_workflow("branches-probe", payload={"log": str(log)}) for _ in range(12)]
    workers = [spawn("kumiflow_worker", "--max-interval", "0.1") for _ in range(4)]
    try:
        wait_for(
            lambda: (
                WorkflowRun.objects.filter(
                    pk__in=[r.pk for r in runs], status=RunStatus.COMPLETED
                ).count()
                == len(runs)
            ),
            120,
            "every run to complete",
        )
    finally:
        codes = stop(workers)
    assert codes == [0, 0, 0, 0], [output(w) for w in workers]
    by_run: dict[str, list[tuple[float, float]]] = {}
    for line in log.read_text().splitlines():
        run, _, start, end = line.split()
        by_run.setdefault(run, []).append((float(start), float(end)))
    assert len(by_run) == 12 and all(len(v) == 12 for v in by_run.values())
    for run, spans in by_run.items():
        for (_, a_end), (b_start, _) in itertools.combinations(sorted(spans), 2):
            assert a_end <= b_start, f"run {run}: two branches ran at once"
    for run in runs:
        assert WorkflowRun.objects.get(pk=run.pk).result == [f"b{n}" for n in range(6)]
