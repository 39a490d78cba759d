"""``compute``: a function of the context whose result is stored under a name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kumiflow_django.definition.context import Context
from kumiflow_django.definition.step import (
    Step,
    StepKind,
    check_resolver,
    compensated,
    register_step_kind,
)


class ComputeKind(StepKind):
    kind = "compute"

    def validate(self, step: Step) -> None:
        if not step.name:
            raise ValueError("compute needs a name for its result")
        if not callable(step.args["fn"]):
            raise ValueError("compute needs a function of the context")
        check_resolver(step.args["fn"], "the compute function")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        return step.args["fn"](ctx.view)


def compute(name: str, fn: Any, *, compensate: Sequence[Step] | None = None) -> Step:
    """Store ``fn(ctx)`` in ``ctx.steps[name]``."""
    return compensated(Step("compute", name, {"fn": fn}), compensate)


register_step_kind(ComputeKind())
