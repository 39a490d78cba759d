"""One start for every run: a child run starts the way a triggered, a called
and a cron run does (flow control, priority, the depth check, its
run-started), because each of them is one RunStart."""

from __future__ import annotations

from typing import Any

import pytest

from kumiflow_django import Limit, define_workflow, on_event, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.models import Event, RunStatus, WorkflowRun
from kumiflow_django.store import names as ev
from kumiflow_django.testing import run_until_idle

pytestmark = pytest.mark.django_db


def children_of(run: WorkflowRun) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(parent_id=run.pk).order_by("started_at", "parent_step"))


def started(run: WorkflowRun) -> dict[str, Any]:
    payload = Event.objects.get(stream_id=str(run.pk), version=1, type=ev.RUN_STARTED).payload
    assert isinstance(payload, dict)
    return payload


def test_a_child_of_a_limited_workflow_waits_for_its_keys_slot(registry, clock):
    define_workflow(
        "charge",
        concurrency=Limit(key=lambda event: event.payload["customer"], max=1),
        steps=[s.wait("PT1H"), s.return_(lambda ctx: ctx.event.payload["n"])],
    )
    define_workflow(
        "orders",
        steps=[
            s.for_each(
                lambda ctx: [1, 2],
                "n",
                parallel=True,
                do=[
                    s.child(
                        "charged",
                        "charge",
                        input=lambda ctx: {"customer": "c-1", "n": ctx.scope["n"]},
                    )
                ],
                name="all",
            ),
            s.return_(lambda ctx: ctx.steps["all"]),
        ],
    )
    parent = start_workflow("orders")
    first, second = sorted(children_of(parent), key=lambda child: (child.input or {})["n"])
    assert (first.status, second.status) == (RunStatus.WAITING, RunStatus.QUEUED)
    assert second.held_by == "concurrency" and started(second)["flow"]["key"] == "c-1"
    clock.advance(hours=1)
    run_until_idle()
    clock.advance(hours=1)
    run_until_idle()
    parent.refresh_from_db()
    assert parent.status == RunStatus.COMPLETED
    assert parent.result == [1, 2]


def test_a_child_takes_its_workflows_priority(registry):
    define_workflow("urgent", priority=7, start_mode="deferred", steps=[s.return_(1)])
    define_workflow("parent", steps=[s.child("u", "urgent", wait=False), s.return_(0)])
    parent = start_workflow("parent")
    [child] = children_of(parent)
    assert child.priority == 7 and started(child)["priority"] == 7


def test_children_started_inline_stop_at_the_start_depth_limit(registry, settings):
    settings.KUMIFLOW_MAX_START_DEPTH = 3
    define_workflow(
        "deeper",
        steps=[
            s.branch(
                lambda ctx: ctx.event.payload["n"] < 6,
                then=[
                    s.child("next", "deeper", input=lambda ctx: {"n": ctx.event.payload["n"] + 1})
                ],
            ),
            s.return_(lambda ctx: ctx.event.payload["n"]),
        ],
    )
    start_workflow("deeper", payload={"n": 1})
    depths = dict(WorkflowRun.objects.values_list("depth", "reason"))
    # Levels 0, 1 and 2 started in one transaction; level 3 would be the fourth.
    assert depths[3] == "start_depth_exceeded"
    assert max(depths) == 3


def test_every_start_writes_the_same_run_started(registry, clock):
    define_workflow("shape", trigger=on_event("shape.asked"), steps=[s.wait("PT1H"), s.return_(1)])
    define_workflow("shape-parent", steps=[s.child("c", "shape", input={"x": 1}), s.return_(0)])
    from kumiflow_django import append_event

    append_event("s-1", "shape.asked", {"x": 1})
    by_call = start_workflow("shape", payload={"x": 1})
    parent = start_workflow("shape-parent")
    triggered = WorkflowRun.objects.get(workflow="shape", trigger_type="shape.asked")
    [child] = children_of(parent)
    common = {"workflow", "version", "fingerprint", "mode", "trigger", "since"}
    for run in (triggered, by_call, child):
        assert common <= started(run).keys()
        assert started(run)["fingerprint"] == started(by_call)["fingerprint"]
    assert started(child)["parent"]["id"] == str(parent.pk)
    assert started(child)["trigger"] == {"type": "child"}


@pytest.mark.server_db
def test_children_that_await_events_share_one_look_up_of_the_start_gaps(registry, monkeypatch):
    from kumiflow_django.definition import matching

    looked: list[int] = []
    real = matching.gaps_below

    def counted(position: int) -> list[int]:
        looked.append(position)
        return real(position)

    monkeypatch.setattr(matching, "gaps_below", counted)
    define_workflow("await-paid", steps=[s.wait_for_event("paid", match={"payload.n": 1})])
    define_workflow(
        "fan-out",
        steps=[
            s.for_each(
                lambda ctx: [1, 2, 3, 4, 5],
                "n",
                parallel=True,
                do=[s.child("c", "await-paid", wait=False)],
                name="all",
            ),
            s.return_(0),
        ],
    )
    parent = start_workflow("fan-out")
    assert len(children_of(parent)) == 5
    assert len(looked) == 1  # once for the five, not once each
