"""Steps, step kinds, and the one registry of kinds that users can extend.

A :class:`Step` is plain data built at import time by a builder function;
its :class:`StepKind` validates it when the workflow is defined and runs it
when the run reaches it. Registering a new kind (``register_step_kind``)
extends the vocabulary without touching the engine.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from kumiflow_django.definition.context import Context
from kumiflow_django.store.registry import Registry

Resolver = Any  # a value, or a function of the Context


@dataclass(frozen=True, eq=False)
class Step:
    kind: str
    name: str | None = None
    args: Mapping[str, Any] = field(default_factory=dict)
    children: Mapping[str, tuple[Step, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", MappingProxyType(dict(self.args)))
        object.__setattr__(
            self, "children", MappingProxyType({k: tuple(v) for k, v in self.children.items()})
        )

    def compensated_by(self, steps: Sequence[Step]) -> Step:
        """This step, with steps that undo it if the run fails after it completed
        (the builders' ``compensate=`` does the same)."""
        return compensated(self, steps)


def compensated(step: Step, steps: Sequence[Step] | None) -> Step:
    """``step`` with ``steps`` as its compensation (``step`` itself when None)."""
    if steps is None:
        return step
    if isinstance(steps, Step) or not isinstance(steps, Sequence):
        raise ValueError("compensate must be a list of steps")
    return Step(step.kind, step.name, step.args, {**step.children, COMPENSATE: tuple(steps)})


#: The children label of a step's compensation.
COMPENSATE = "compensate"


class StepKind:
    """Base class of step kinds. Subclasses set ``kind`` and implement ``execute``."""

    kind: ClassVar[str] = ""
    #: Argument names holding resolvers (values or one-argument functions).
    resolver_args: ClassVar[tuple[str, ...]] = ()
    #: Whether the value returned by ``execute`` is stored under the step's name.
    stores_result: ClassVar[bool] = True
    #: Whether the kind may appear inside branch/for_each/retry.
    allowed_nested: ClassVar[bool] = True
    #: Whether the kind can suspend the run (the admin shows it as a wait).
    suspends: ClassVar[bool] = False
    #: Whether a step of the kind may declare a compensation.
    compensable: ClassVar[bool] = True

    def validate(self, step: Step) -> None:
        """Raise ValueError when the step's arguments are wrong (at definition time)."""
        for arg in self.resolver_args:
            if arg in step.args:
                check_resolver(step.args[arg], arg)

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        """Run the step. ``resume`` is None on a first run; the rest of the
        cursor below this step when the run continues from a suspension here
        or inside it."""
        raise NotImplementedError

    def describe(self, step: Step) -> str:
        """A short label for the step in the admin's picture of the workflow."""
        return f"{step.kind} {step.name}" if step.name else step.kind


class StepKinds(Registry[StepKind]):
    """The step vocabulary: every kind by its name."""

    what = "step kind"


#: The one registry of step kinds (the built-in ones register when
#: :mod:`kumiflow_django.steps` is imported).
step_kinds = StepKinds()


def register_step_kind(kind: StepKind, *, replace: bool = False) -> StepKind:
    """Add a step kind to the vocabulary; its ``kind`` name must be new unless ``replace``
    (registering another instance of the same class again is allowed)."""
    if not kind.kind:
        raise ValueError(f"{type(kind).__name__} has no kind name")
    existing = step_kinds.find(kind.kind)
    same_class = existing is not None and type(existing) is type(kind)
    return step_kinds.add(kind.kind, kind, replace=replace or same_class)


def get_kind(name: str) -> StepKind:
    return step_kinds.get(name)


def check_resolver(value: Any, what: str) -> None:
    """A resolver is a value or a function of exactly one argument (the context)."""
    if not callable(value) or isinstance(value, type):
        return
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):  # builtins without a signature
        return
    try:
        signature.bind(object())
    except TypeError:
        raise ValueError(
            f"{what} must be a value or a function of one argument (the context); "
            f"{getattr(value, '__name__', value)!r} takes {signature}"
        ) from None


def resolve(value: Resolver, ctx: Context) -> Any:
    """A resolver's value: a function gets the read-only view of the context."""
    return value(ctx.view) if callable(value) and not isinstance(value, type) else value


def path_text(path: list[Any] | tuple[Any, ...]) -> str:
    """A step path (or a cursor) as text: ``0.do.2``."""
    return ".".join(str(p) for p in path)


def walk(
    steps: tuple[Step, ...], prefix: tuple[Any, ...] = ()
) -> list[tuple[tuple[Any, ...], Step]]:
    """Every step of a tree with its static path, depth first."""
    found: list[tuple[tuple[Any, ...], Step]] = []
    for index, step in enumerate(steps):
        path = (*prefix, index)
        found.append((path, step))
        for label, children in getattr(step, "children", {}).items():
            found.extend(walk(children, (*path, label)))
    return found


def step_at(steps: tuple[Step, ...], cursor: list[Any]) -> Step:
    """The step a cursor points at; ValueError for a cursor that fits no step."""
    if not cursor or len(cursor) % 2 != 1:
        raise ValueError(f"malformed cursor {cursor!r}")
    current: tuple[Step, ...] = steps
    step: Step | None = None
    for i, part in enumerate(cursor):
        if i % 2 == 0:
            if not isinstance(part, int) or isinstance(part, bool) or not 0 <= part < len(current):
                raise ValueError(f"cursor {cursor!r} points past the steps")
            step = current[part]
        else:
            assert step is not None
            if part not in step.children:
                raise ValueError(f"cursor {cursor!r}: step has no {part!r} branch")
            current = step.children[part]
    assert step is not None
    return step


StepBuilder = Callable[..., Step]
