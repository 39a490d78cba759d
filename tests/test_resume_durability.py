"""Several worker processes, and a worker killed with SIGKILL mid-batch: every
run completes, and no side effect runs twice."""

from __future__ import annotations

import signal

import pytest
from django.db import transaction

from kumiflow_django import append_event
from kumiflow_django.models import RunStatus, WorkflowRun
from testproject.shop.models import Tally
from tests.processes import output, spawn, stop, wait_for

pytestmark = [pytest.mark.server_db, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


# A killed worker leaves its lease on the run it was in: short leases keep the test short.
ENV = {"KUMIFLOW_LEASE_SECONDS": "2"}


def request_tallies(n: int, sleep: float = 0.0) -> None:
    with transaction.atomic():
        for i in range(n):
            append_event(f"tally-{i}", "tally.requested", {"sleep": sleep})
    assert WorkflowRun.objects.filter(status=RunStatus.PENDING).count() == n


def unfinished() -> int:
    return WorkflowRun.objects.exclude(status=RunStatus.COMPLETED).count()


def test_four_workers_resume_500_runs_each_exactly_once():
    request_tallies(500)
    workers = [
        spawn("kumiflow_resume", "--max-interval", "0.2", "-v", "0", env=ENV) for _ in range(4)
    ]
    try:
        wait_for(lambda: unfinished() == 0, 180, "500 runs to complete")
    finally:
        codes = stop(workers)
    assert codes == [0, 0, 0, 0], [output(w)[-2000:] for w in workers]
    assert Tally.objects.count() == 500
    assert set(Tally.objects.values_list("count", flat=True)) == {1}


def test_a_worker_killed_mid_batch_loses_and_repeats_nothing():
    request_tallies(200, sleep=0.02)
    first = spawn("kumiflow_resume", "--max-interval", "0.2", "-v", "0", env=ENV)
    try:
        wait_for(lambda: Tally.objects.count() >= 40, 120, "the first worker to get going")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    assert unfinished() > 0, "killed in the middle of the batch"

    workers = [
        spawn("kumiflow_resume", "--max-interval", "0.2", "-v", "0", env=ENV) for _ in range(2)
    ]
    try:
        wait_for(lambda: unfinished() == 0, 180, "every run to complete after the restart")
    finally:
        stop(workers)
    assert Tally.objects.count() == 200
    assert max(Tally.objects.values_list("count", flat=True)) == 1
