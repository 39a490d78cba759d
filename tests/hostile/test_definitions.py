"""Workflow definitions that must be refused when they are built (at import time).

Each row names what a careless or hostile definition tries; each is refused
with a ``WorkflowDefinitionError`` naming the workflow and the step, instead
of failing later at run time (an ``OverflowError`` from a wait in the year
9000, a result silently overwritten by a second step of the same name, a
value longer than the column that stores it).
"""

from __future__ import annotations

import pytest

from kumiflow_django import WorkflowDefinitionError, define_workflow
from kumiflow_django import steps as s


def nest(depth: int) -> list:
    steps: list = [s.compute("leaf", lambda ctx: 1)]
    for _ in range(depth):
        steps = [s.branch(if_=True, then=steps)]
    return steps


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        pytest.param([s.wait("P9000Y")], "beyond the year 9999", id="wait-9000-years"),
        pytest.param([s.wait("P99999999999999999999D")], "too long", id="wait-huge-days"),
        pytest.param(
            [s.wait_for_event("paid", timeout="P9000Y")], "beyond", id="timeout-9000-years"
        ),
        pytest.param(
            [s.compute("total", lambda ctx: 1), s.compute("total", lambda ctx: 2)],
            "two steps store their result as 'total'",
            id="duplicate-names",
        ),
        pytest.param(
            [
                s.compute("x", lambda ctx: 1),
                s.for_each(lambda ctx: [1], as_="i", do=[s.compute("x", lambda ctx: 2)]),
            ],
            "two steps store their result as 'x'",
            id="duplicate-name-inside-a-loop",
        ),
        pytest.param(
            [s.wait_for_event("paid"), s.wait_for_event("paid")],
            "give one another name=",
            id="two-waits-for-one-type",
        ),
        pytest.param([s.wait_for_event("t" * 201)], "longer than 200", id="awaited-type-long"),
        pytest.param([s.append_event("s", "x\x00y")], "control character", id="appended-type-nul"),
        pytest.param(
            [s.append_event("s", "kumiflow.workflow.run-started")],
            "reserved prefix",
            id="appended-type-reserved",
        ),
        pytest.param(
            [s.append_event("s", "ok.type", stream_type="t" * 101)],
            "longer than 100",
            id="appended-stream-type-long",
        ),
        pytest.param([s.compute("n" * 201, lambda ctx: 1)], "step name", id="name-too-long"),
        pytest.param([s.compute("a\nb", lambda ctx: 1)], "control characters", id="name-newline"),
        pytest.param(
            [s.compute(5, lambda ctx: 1)],  # type: ignore[arg-type]
            "step name",
            id="name-not-a-string",
        ),
        pytest.param(nest(40), "nested too deeply", id="path-longer-than-its-column"),
    ],
)
def test_refused_at_definition_time(registry, steps, message):
    with pytest.raises(WorkflowDefinitionError, match=message) as info:
        define_workflow("hostile", steps=steps)
    assert "'hostile'" in str(info.value)
    assert not registry.is_registered("hostile")


def test_one_name_in_the_two_arms_of_a_branch_is_fine(registry):
    """Only one arm runs, so both may store their result under one name."""
    workflow = define_workflow(
        "arms",
        steps=[
            s.branch(
                if_=lambda ctx: True,
                then=[s.compute("price", lambda ctx: 1)],
                else_=[s.compute("price", lambda ctx: 2)],
            )
        ],
    )
    assert registry.is_registered(workflow.name)
