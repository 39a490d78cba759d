"""``call``: invoke a registered Python handler with a payload.

Handlers run in the segment's transaction. They must keep their effects in
the database (or request them through the outbox): a segment that fails or
crashes is rolled back and runs again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from kumiflow_django.context import Context
from kumiflow_django.steps.base import Resolver, Step, StepKind, register_step_kind, resolve

Handler = Callable[[Any], Any]
F = TypeVar("F", bound=Handler)

_HANDLERS: dict[str, Handler] = {}


def handler(name: str) -> Callable[[F], F]:
    """Register a function as the handler ``name`` for ``call`` steps::

    @handler("billing.charge")
    def charge(payload): ...
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a handler needs a non-empty name, not {name!r}")

    def register(fn: F) -> F:
        existing = _HANDLERS.get(name)
        if existing is not None and existing is not fn:
            existing_name = getattr(existing, "__qualname__", existing)
            raise ValueError(f"handler {name!r} is already registered ({existing_name})")
        _HANDLERS[name] = fn
        return fn

    return register


def get_handler(name: str) -> Handler:
    try:
        return _HANDLERS[name]
    except KeyError:
        raise LookupError(f"no handler is registered as {name!r}") from None


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


def call(name: str | None, handler: str | Handler, payload: Resolver = None) -> Step:
    """Call ``handler`` (a registered name or a function) with the resolved
    ``payload``; its return value is stored under ``name``."""
    return Step("call", name, {"handler": handler, "payload": payload})


register_step_kind(CallKind())
