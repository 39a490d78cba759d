"""Two ``kumiflow_cron`` processes side by side: every occurrence starts exactly one run."""

from __future__ import annotations

import datetime as dt

import pytest

from kumiflow_django.models import WorkflowRun
from tests.processes import output, spawn, stop, wait_for

pytestmark = [pytest.mark.server_db, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_two_schedulers_start_each_of_20_occurrences_exactly_once():
    env = {"SHOP_CRON_EVERY_SECOND": "1"}
    schedulers = [
        spawn("kumiflow_cron", "--max-interval", "0.1", "-v", "0", env=env) for _ in range(2)
    ]
    runs = WorkflowRun.objects.filter(workflow="every-second")
    try:
        wait_for(lambda: runs.count() >= 22, 90, "22 occurrences")
    finally:
        codes = stop(schedulers)
    assert codes == [0, 0], [output(p)[-1500:] for p in schedulers]

    instants = sorted(runs.values_list("input__scheduled_for", flat=True))
    assert len(instants) == len(set(instants)), "an occurrence started twice"
    seconds = [dt.datetime.fromisoformat(t) for t in instants]
    assert all(
        b - a == dt.timedelta(seconds=1) for a, b in zip(seconds, seconds[1:], strict=False)
    ), "an occurrence was missed"
    first_20 = instants[:20]
    assert [runs.filter(input__scheduled_for=t).count() for t in first_20] == [1] * 20
