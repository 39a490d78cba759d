"""``for_each``: run steps once per item of a list, one item after the other.

The resolved list is kept in the run state, so a suspension inside an item
resumes at exactly that item and step, and the later items still run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kumiflow_django.definition.context import Context
from kumiflow_django.definition.step import (
    Resolver,
    Step,
    StepKind,
    path_text,
    register_step_kind,
    resolve,
)
from kumiflow_django.steps.runner import run_steps
from kumiflow_django.store.values import to_json

_MISSING = object()


class ForEachKind(StepKind):
    kind = "for_each"
    resolver_args = ("over",)
    stores_result = False

    def validate(self, step: Step) -> None:
        super().validate(step)
        name = step.args["as_"]
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"for_each as_ must be an identifier, not {name!r}")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        key = path_text(path)
        loops = ctx.state["loops"]
        inner: list[Any] | None = None
        if resume is None:
            items = resolve(step.args["over"], ctx)
            if not isinstance(items, list | tuple):
                raise TypeError(f"for_each over must resolve to a list, not {type(items).__name__}")
            loops[key] = {"items": to_json(list(items), "the for_each items"), "index": 0}
        else:
            inner = resume[1:]  # resume is ["do", index, ...]
        loop = loops[key]
        name = step.args["as_"]
        previous = ctx.scope.get(name, _MISSING)
        try:
            while loop["index"] < len(loop["items"]):
                ctx.scope[name] = loop["items"][loop["index"]]
                run_steps(step.children["do"], ctx, [*path, "do"], inner)
                inner = None
                loop["index"] += 1
        finally:
            if previous is _MISSING:
                ctx.scope.pop(name, None)
            else:
                ctx.scope[name] = previous
        del loops[key]
        return None


def for_each(over: Resolver, as_: str, do: Sequence[Step]) -> Step:
    """Run ``do`` for each item of ``over``, with the item in ``ctx.scope[as_]``."""
    return Step("for_each", None, {"over": over, "as_": as_}, {"do": tuple(do)})


register_step_kind(ForEachKind())
