"""``return_``: end the run now, with a result."""

from __future__ import annotations

from typing import Any

from kumiflow_django.definition.context import Context
from kumiflow_django.definition.step import Resolver, Step, StepKind, register_step_kind, resolve
from kumiflow_django.steps.control import ReturnValue


class ReturnKind(StepKind):
    kind = "return"
    resolver_args = ("value",)
    stores_result = False
    allowed_nested = False
    compensable = False

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        raise ReturnValue(resolve(step.args["value"], ctx))


def return_(value: Resolver = None) -> Step:
    """Complete the run with ``value`` as its result. Only at the top level."""
    return Step("return", None, {"value": value})


register_step_kind(ReturnKind())
