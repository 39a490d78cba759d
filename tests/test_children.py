"""Child runs: waiting for them, their failures, fire-and-forget, keys, cancel
cascades through three levels, and the definition checks."""

from __future__ import annotations

import pytest
from django.core import checks

from kumiflow_django import cancel_run, define_workflow, start_workflow
from kumiflow_django import steps as s
from kumiflow_django.checks import check_child_workflows
from kumiflow_django.models import RunStatus, WorkflowRun
from kumiflow_django.store import names as ev
from kumiflow_django.store.errors import WorkflowDefinitionError
from kumiflow_django.testing import run_until_idle
from tests.helpers import types

pytestmark = pytest.mark.django_db


def reload(run):
    return WorkflowRun.objects.get(pk=run.pk)


def children_of(run):
    return list(WorkflowRun.objects.filter(parent_id=run.pk).order_by("started_at", "parent_step"))


@pytest.fixture
def parcel(registry):
    return define_workflow(
        "ship-parcel",
        steps=[
            s.wait("PT1H"),
            s.compute("label", lambda ctx: f"label-{ctx.event.payload['parcel']}"),
            s.branch(
                lambda ctx: ctx.event.payload.get("lost"), then=[s.compute("x", lambda c: 1 / 0)]
            ),
            s.return_(lambda ctx: ctx.steps["label"]),
        ],
    )


def test_a_parent_waits_for_its_child_and_gets_its_result(parcel, clock):
    define_workflow(
        "order",
        steps=[
            s.child("shipped", "ship-parcel", input=lambda ctx: {"parcel": ctx.event.payload["p"]}),
            s.return_(lambda ctx: ctx.steps["shipped"]),
        ],
    )
    run = start_workflow("order", payload={"p": 7})
    assert reload(run).status == RunStatus.WAITING
    [child] = children_of(run)
    # Its workflow starts inline: its first segment ran with the parent's.
    assert (child.workflow, child.status, child.input) == ("ship-parcel", "waiting", {"parcel": 7})
    assert (child.parent_id, child.root_id, child.depth) == (run.pk, run.pk, 1)
    assert child.trigger_type == "child" and child.parent_waits
    clock.advance(hours=1)
    run_until_idle()
    run = reload(run)
    assert (run.status, run.result) == (RunStatus.COMPLETED, "label-7")
    assert "child-settled" in types(run)


@pytest.mark.parametrize("on_failure", ["fail", "result"])
def test_a_failed_child_fails_its_parent_step_or_becomes_its_result(parcel, clock, on_failure):
    define_workflow(
        "order",
        steps=[
            s.child(
                "shipped", "ship-parcel", input={"parcel": 1, "lost": True}, on_failure=on_failure
            ),
            s.return_(lambda ctx: ctx.steps["shipped"]),
        ],
    )
    run = start_workflow("order")
    run_until_idle()
    clock.advance(hours=1)
    run_until_idle()
    run = reload(run)
    [child] = children_of(run)
    assert child.status == RunStatus.FAILED
    if on_failure == "fail":
        assert (run.status, run.reason) == (RunStatus.FAILED, ev.CHILD_FAILED_REASON)
        assert f"child run {child.id} of 'ship-parcel' was failed" in run.last_error
        assert "ZeroDivisionError" in run.last_error
    else:
        assert run.status == RunStatus.COMPLETED
        assert run.result["ok"] is False
        assert run.result["status"] == "failed" and run.result["run_id"] == str(child.id)
        assert "ZeroDivisionError" in run.result["error"]


def test_wait_false_starts_the_child_and_goes_on(parcel, clock):
    define_workflow(
        "order",
        steps=[
            s.child("started", "ship-parcel", input={"parcel": 2}, wait=False),
            s.return_(lambda ctx: ctx.steps["started"]),
        ],
    )
    run = reload(start_workflow("order"))
    [child] = children_of(run)
    assert run.status == RunStatus.COMPLETED
    assert run.result == {"run_id": str(child.id), "workflow": "ship-parcel"}
    assert not child.parent_waits
    run_until_idle()
    clock.advance(hours=1)
    run_until_idle()
    assert reload(child).status == RunStatus.COMPLETED
    assert reload(run).version == run.version  # nobody told the parent


def test_children_in_parallel_branches_and_a_parallel_for_each(parcel, clock):
    define_workflow(
        "order",
        steps=[
            s.for_each(
                lambda ctx: [1, 2, 3],
                "p",
                do=[
                    s.child("shipped", "ship-parcel", input=lambda ctx: {"parcel": ctx.scope["p"]})
                ],
                parallel=True,
                name="labels",
            ),
            s.return_(lambda ctx: ctx.steps["labels"]),
        ],
    )
    run = start_workflow("order")
    assert len(children_of(run)) == 3
    run_until_idle()
    clock.advance(hours=1)
    run_until_idle()
    assert reload(run).result == ["label-1", "label-2", "label-3"]


def test_a_key_starts_a_child_once(parcel, clock):
    define_workflow(
        "order",
        steps=[
            s.child(
                "c",
                "ship-parcel",
                input={"parcel": 3},
                idempotency_key=lambda ctx: "parcel-3",
                wait=False,
            ),
        ],
    )
    first = start_workflow("order")
    second = start_workflow("order")
    [child] = WorkflowRun.objects.filter(workflow="ship-parcel")
    assert reload(first).result is None and child.parent_id == first.pk
    assert reload(second).status == RunStatus.COMPLETED


def test_cancel_cascades_through_three_levels_but_not_to_abandoned_children(registry, clock):
    define_workflow("leaf", steps=[s.wait("P1D")])
    define_workflow(
        "middle",
        steps=[
            s.child("detached", "leaf", wait=False, on_parent_cancel="abandon"),
            s.child("leaf", "leaf"),
        ],
    )
    define_workflow("top", steps=[s.child("middle", "middle")])
    top = start_workflow("top")
    run_until_idle()  # middle starts, and starts its two leaves
    [middle] = children_of(top)
    leaves = children_of(middle)
    assert len(leaves) == 2
    assert {leaf.root_id for leaf in leaves} == {top.pk}
    assert {leaf.depth for leaf in leaves} == {2}
    cancel_run(top.pk, reason="customer left")
    assert reload(top).status == RunStatus.CANCELLED
    assert reload(middle).status == RunStatus.CANCELLED
    statuses = {leaf.cancel_with_parent: reload(leaf).status for leaf in leaves}
    assert statuses == {True: RunStatus.CANCELLED, False: RunStatus.WAITING}
    assert reload(middle).version == middle.version + 1  # cancelled once, not told


def test_a_failed_parent_cancels_the_children_it_waited_for(registry, clock):
    define_workflow("leaf", steps=[s.wait("P1D")])
    define_workflow(
        "doomed",
        steps=[
            s.parallel(
                "p",
                {
                    "kid": [s.child("leaf", "leaf")],
                    "boom": [s.wait("PT1M"), s.compute("x", lambda c: 1 / 0)],
                },
            )
        ],
    )
    run = start_workflow("doomed")
    run_until_idle()
    clock.advance(minutes=1)
    run_until_idle()
    assert reload(run).status == RunStatus.FAILED
    [leaf] = children_of(run)
    assert reload(leaf).status == RunStatus.CANCELLED


def test_a_join_any_cancels_the_child_of_the_branch_that_lost(registry, clock):
    define_workflow("leaf", steps=[s.wait("P1D"), s.return_("slow")])
    define_workflow(
        "race",
        steps=[
            s.parallel(
                "first",
                {"kid": [s.child("leaf", "leaf")], "timer": [s.wait("PT1M")]},
                join="any",
            ),
            s.return_(lambda ctx: sorted(ctx.steps["first"])),
        ],
    )
    run = start_workflow("race")
    run_until_idle()
    clock.advance(minutes=1)
    run_until_idle()
    assert reload(run).result == ["timer"]
    [leaf] = children_of(run)
    assert reload(leaf).status == RunStatus.CANCELLED


def test_an_unregistered_child_workflow_is_a_check_error(registry):
    define_workflow("orphan", steps=[s.child("c", "nowhere")])
    [error] = check_child_workflows()
    assert (error.id, error.level) == ("kumiflow.E110", checks.ERROR)
    assert "'nowhere'" in error.msg


def test_a_run_whose_child_workflow_vanished_fails_with_a_clear_reason(registry):
    define_workflow("orphan", steps=[s.child("c", "nowhere")])
    run = reload(start_workflow("orphan"))
    assert (run.status, run.reason) == (RunStatus.FAILED, ev.CHILD_FAILED_REASON)
    assert "child workflow 'nowhere' version None is not registered" in run.last_error


def test_workflows_that_always_start_each_other_are_refused(registry):
    define_workflow("ping", steps=[s.child("pong", "pong")])
    with pytest.raises(WorkflowDefinitionError, match="pong -> ping -> pong"):
        define_workflow(
            "pong",
            steps=[s.parallel("p", {"a": [s.child("ping", "ping")]})],
        )
    # under a condition it is allowed (and the check agrees)
    define_workflow(
        "pong",
        steps=[s.branch(lambda ctx: False, then=[s.child("ping", "ping")])],
    )
    assert check_child_workflows() == []


def test_itself_as_a_child_is_a_cycle(registry):
    with pytest.raises(WorkflowDefinitionError, match="loop -> loop"):
        define_workflow("loop", steps=[s.child("again", "loop")])


@pytest.mark.parametrize(
    "options, why",
    [
        ({"on_failure": "ignore"}, "on_failure must be one of"),
        ({"on_parent_cancel": "orphan"}, "on_parent_cancel must be one of"),
        ({"wait": "yes"}, "wait must be True or False"),
    ],
)
def test_bad_child_options_are_refused(registry, options, why):
    with pytest.raises(WorkflowDefinitionError, match=why):
        define_workflow("bad", steps=[s.child("c", "x", **options)])


def test_a_child_that_ends_in_its_first_segment_hands_over_at_once(registry, clock):
    define_workflow("quick", steps=[s.return_(lambda ctx: ctx.event.payload["n"] * 3)])
    define_workflow("later", start_mode="deferred", steps=[s.return_("later")])
    define_workflow(
        "order",
        steps=[
            s.child("q", "quick", input={"n": 2}),
            s.child("l", "later"),
            s.return_(lambda ctx: [ctx.steps["q"], ctx.steps["l"]]),
        ],
    )
    run = start_workflow("order")
    [quick] = children_of(run)
    assert quick.status == RunStatus.COMPLETED
    assert reload(run).wake_at is not None  # due at once: its child ended already
    run_until_idle()
    quick, later = children_of(run)
    assert later.start_mode == "deferred" and later.status == RunStatus.COMPLETED
    assert reload(run).result == [6, "later"]
