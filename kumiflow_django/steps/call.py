"""``call``: invoke a registered Python handler with a payload.

Handlers run in the segment's transaction. They must keep their effects in
the database (or request them through the outbox): a segment that fails or
crashes is rolled back and runs again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kumiflow_django.definition.context import Context
from kumiflow_django.definition.step import (
    Resolver,
    Step,
    StepKind,
    compensated,
    register_step_kind,
    resolve,
)
from kumiflow_django.store.registry import Registry

Handler = Callable[[Any], Any]
F = TypeVar("F", bound=Handler)


class Handlers(Registry[Handler]):
    what = "handler"


#: The one registry of ``call`` handlers.
handlers = Handlers()


def handler(name: str) -> Callable[[F], F]:
    """Register a function as the handler ``name`` for ``call`` steps::

    @handler("billing.charge")
    def charge(payload): ...
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a handler needs a non-empty name, not {name!r}")

    def register(fn: F) -> F:
        handlers.add(name, fn)
        return fn

    return register


def get_handler(name: str) -> Handler:
    return handlers.get(name)


class CallKind(StepKind):
    kind = "call"
    resolver_args = ("payload",)

    def validate(self, step: Step) -> None:
        super().validate(step)
        target = step.args["handler"]
        if not (callable(target) or (isinstance(target, str) and target)):
            raise ValueError(f"call needs a handler name or function, not {target!r}")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        target = step.args["handler"]
        fn = get_handler(target) if isinstance(target, str) else target
        return fn(resolve(step.args["payload"], ctx))

    def describe(self, step: Step) -> str:
        target = step.args["handler"]
        label = target if isinstance(target, str) else getattr(target, "__name__", "handler")
        return f"call {label}"


def call(
    name: str | None,
    handler: str | Handler,
    payload: Resolver = None,
    *,
    compensate: Sequence[Step] | None = None,
) -> Step:
    """Call ``handler`` (a registered name or a function) with the resolved
    ``payload``; its return value is stored under ``name``."""
    return compensated(Step("call", name, {"handler": handler, "payload": payload}), compensate)


register_step_kind(CallKind())
