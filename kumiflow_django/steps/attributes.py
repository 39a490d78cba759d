"""``set_attributes``: change the run's search attributes as it advances.

The change is an ``attributes-set`` event on the run's stream, committed
with the segment and folded into the run's row (and its index rows), like
every other change of a run: a segment that fails writes none of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kumiflow_django.definition.attributes import check_declared, resolve_all
from kumiflow_django.definition.context import AttributesUpdate, Context
from kumiflow_django.definition.step import Step, StepKind, path_text, register_step_kind


class SetAttributesKind(StepKind):
    kind = "set_attributes"
    stores_result = False

    def validate(self, step: Step) -> None:
        values = step.args["attributes"]
        if not values:
            raise ValueError("set_attributes needs at least one attribute")
        check_declared(values, "set_attributes")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        values = resolve_all(step.args["attributes"], ctx.view)
        ctx.effects.append(AttributesUpdate(values, path_text(path)))
        return None

    def describe(self, step: Step) -> str:
        return "set " + ", ".join(sorted(step.args["attributes"]))


def set_attributes(attributes: Mapping[str, Any] | None = None, /, **values: Any) -> Step:
    """Set search attributes of the run: each a value (str, int, bool; None
    removes it) or a function of the context
    (``set_attributes(tier=lambda ctx: ctx.steps["score"]["tier"])``)."""
    return Step("set_attributes", None, {"attributes": {**(attributes or {}), **values}})


register_step_kind(SetAttributesKind())
