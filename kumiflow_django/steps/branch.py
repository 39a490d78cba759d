"""``branch``: run one of two step lists depending on a condition."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kumiflow_django.definition.context import Context
from kumiflow_django.definition.step import (
    Resolver,
    Step,
    StepKind,
    register_step_kind,
    resolve,
)
from kumiflow_django.steps.runner import run_steps


class BranchKind(StepKind):
    kind = "branch"
    resolver_args = ("if_",)
    stores_result = False

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        if resume is not None:
            label, inner = resume[0], resume[1:]
        else:
            label, inner = ("then" if resolve(step.args["if_"], ctx) else "else"), None
        run_steps(step.children[label], ctx, [*path, label], inner)
        return None


def branch(if_: Resolver, then: Sequence[Step], else_: Sequence[Step] = ()) -> Step:
    """Run ``then`` when ``if_`` resolves truthy, ``else_`` otherwise.

    Results of the chosen steps land in ``ctx.steps`` like any other.
    """
    return Step("branch", None, {"if_": if_}, {"then": tuple(then), "else": tuple(else_)})


register_step_kind(BranchKind())
