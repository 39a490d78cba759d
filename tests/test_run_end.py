"""Every end of a run does what an end does, whoever ends it: a child run
cancelled with its parent frees its flow key's slot and drops its waits, as
a run cancelled by hand does."""

from __future__ import annotations

import pytest

from kumiflow_django import Limit, cancel_run, define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import RunStatus, WorkflowRun
from kumiflow_django.projections.waits import RunWait
from kumiflow_django.testing import run_until_idle

pytestmark = pytest.mark.django_db


def test_a_limited_child_cancelled_with_its_parent_frees_its_slot(registry, clock):
    define_workflow(
        "charge",
        concurrency=Limit(key=lambda event: event.payload["customer"], max=1),
        steps=[s.wait("PT1H"), s.return_(1)],
    )
    define_workflow("order", steps=[s.child("c", "charge", input={"customer": "c-1"})])
    parent = start_workflow("order")
    [child] = WorkflowRun.objects.filter(parent_id=parent.pk)
    assert child.status == RunStatus.WAITING
    behind = start_workflow("charge", payload={"customer": "c-1"})
    assert behind.status == RunStatus.QUEUED

    cancel_run(parent.pk, reason="the customer left")
    child.refresh_from_db()
    assert child.status == RunStatus.CANCELLED
    run_until_idle()
    behind.refresh_from_db()
    assert behind.status == RunStatus.WAITING  # admitted: its key's slot is free


@pytest.fixture
def two_waits(registry):
    """A workflow that waits for two events in two parallel branches."""
    return define_workflow(
        "two-waits",
        steps=[
            s.parallel(
                "both",
                {
                    "a": [s.wait_for_event("paid", match={"payload.id": 1})],
                    "b": [s.wait_for_event("shipped", match={"payload.id": 1})],
                },
            ),
        ],
    )


def test_a_child_waiting_in_branches_cancelled_with_its_parent_leaves_no_waits(two_waits):
    define_workflow("order", steps=[s.child("c", "two-waits")])
    parent = start_workflow("order")
    [child] = WorkflowRun.objects.filter(parent_id=parent.pk)
    assert RunWait.objects.filter(run_id=child.pk).count() == 2

    cancel_run(parent.pk)
    child.refresh_from_db()
    assert child.status == RunStatus.CANCELLED
    assert not RunWait.objects.filter(run_id=child.pk).exists()


def test_a_run_cancelled_by_hand_does_the_same(two_waits):
    run = start_workflow("two-waits")
    assert RunWait.objects.filter(run_id=run.pk).count() == 2
    cancel_run(run.pk)
    assert not RunWait.objects.filter(run_id=run.pk).exists()
