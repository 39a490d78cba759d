"""Whether a run can carry on when the registered definition is another one.

A run stores its definition's fingerprint; its snapshot
(:mod:`.snapshots`) keeps the canonical form. When a deploy registers
another definition under the run's name, :func:`classify` compares the two
*for that run*, step by step, from what the run row says it did: the steps
it executed (its trail) and the step it is suspended in (its cursor).

The rule: the run carries on when every step it executed, and the path to
its position, is the same in kind, name and place, so that only steps it
has not reached changed. A change to an executed step (other than to its
resolvers), to the step it is suspended in or to one of that step's
ancestors is incompatible.

Each step's fingerprint (:class:`StepPrint`, keyed by its static path,
``0.do.2``) has two digests, each the SHA-256 of canonical JSON:

- ``frame``, what an *executed* step is compared on: its kind, its name,
  its arguments with every resolver argument of its kind
  (``StepKind.resolver_args``) and every function anywhere in its arguments
  masked, and whether it has a compensation. Its resolvers ran once and
  never run again, so fixing their code (a typo in a mail that was sent)
  leaves the step the same; a resolver argument holding a plain value (a
  wait's duration, a mail's subject) is left out too, for the same reason.
  A static argument (a model, an event type) says what the step did, and
  the engine cannot tell a cosmetic change of one from a change of meaning.
- ``whole``, what the *current* step and its *ancestors* are compared on:
  the step and everything below it, resolvers and the steps of its
  branches, body and compensation included. Those steps run again (the
  wait ends, the loop takes its next item, the join counts its branches),
  so any change there is a change to what the run is doing now.

The trigger and the workflow's version label are not compared: they decide
how runs start, and a started run has passed them. The idempotency key and
flow control are not in the fingerprint at all.

Pure: no database, no registry. The engine (``engine.deploys``) feeds it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kumiflow_django.definition.fingerprint import fingerprint
from kumiflow_django.definition.step import get_kind

#: The first part of the cursor of a run that runs its compensations.
COMPENSATING = "$compensate"
_MASKED_RESOLVER = "<resolver>"
_MASKED_FUNCTION = "<function>"


class Outcome(enum.StrEnum):
    """What a change of definition means for one run."""

    UNCHANGED = "unchanged"
    COMPATIBLE = "compatible"
    INCOMPATIBLE = "incompatible"


class Where(enum.StrEnum):
    """Which of the run's steps a difference is in."""

    CURRENT = "current"  # the step the run is suspended in
    ANCESTOR = "ancestor"  # a step that holds it (a loop, a branch, a retry)
    EXECUTED = "executed"  # a step it ran
    RUN = "run"  # the run as a whole (no stored definition, compensating)


@dataclass(frozen=True)
class StepPrint:
    """One step's fingerprint in a definition (see the module docstring)."""

    path: str
    kind: str
    name: str | None
    frame: str
    whole: str
    #: The digest of its arguments alone (unmasked): tells a resolver change apart.
    arguments: str
    #: The same with the functions in them masked: tells a function's code apart.
    values: str


@dataclass(frozen=True)
class Difference:
    """A step that makes the change incompatible for the run: where and what."""

    path: str
    where: Where
    #: ``removed``, ``kind``, ``name``, ``arguments`` (a value), ``resolvers``
    #: (the code of a function), ``steps below``, ``compensation``; for the run
    #: as a whole, a sentence (no stored definition, compensating).
    change: str
    before: str = ""
    after: str = ""

    def describe(self) -> str:
        what = {
            Where.CURRENT: "the step the run is suspended in",
            Where.ANCESTOR: "a step that holds the run's position",
            Where.EXECUTED: "a step the run executed",
            Where.RUN: "the run",
        }[self.where]
        if self.where == Where.RUN:
            return self.change
        text = f"step {self.path} ({what}, {self.before or '?'})"
        if self.change == "removed":
            return f"{text} is no longer in the definition"
        if self.change in ("kind", "name"):
            return f"{text} is now {self.after} (its {self.change} changed)"
        return f"{text}: its {self.change} changed"

    def as_data(self) -> dict[str, str]:
        return {
            "path": self.path,
            "where": str(self.where),
            "change": self.change,
            "before": self.before,
            "after": self.after,
        }


@dataclass(frozen=True)
class Classification:
    """The result of :func:`classify`."""

    outcome: Outcome
    differences: tuple[Difference, ...] = field(default=())

    @property
    def compatible(self) -> bool:
        return self.outcome != Outcome.INCOMPATIBLE

    def describe(self) -> str:
        if self.outcome == Outcome.UNCHANGED:
            return "the steps are unchanged"
        if self.outcome == Outcome.COMPATIBLE:
            return "only steps the run has not reached changed"
        return "; ".join(d.describe() for d in self.differences)

    def as_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"outcome": str(self.outcome)}
        if self.differences:
            data["differences"] = [d.as_data() for d in self.differences]
        return data


def _digest(value: Any) -> str:
    return fingerprint({"v": value})


def _resolver_args(kind: str) -> tuple[str, ...]:
    try:
        return get_kind(kind).resolver_args
    except LookupError:  # a kind this process does not know: nothing is a resolver
        return ()


def _mask_functions(value: Any) -> Any:
    if isinstance(value, Mapping):
        if set(value) == {"callable"}:
            return _MASKED_FUNCTION
        return {k: _mask_functions(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_mask_functions(v) for v in value]
    return value


def _label(step: Mapping[str, Any]) -> str:
    name = step.get("name")
    return f"{step.get('kind')} {name!r}" if name is not None else str(step.get("kind"))


def step_prints(canonical: Mapping[str, Any]) -> dict[str, StepPrint]:
    """Every step of a canonical definition (``Workflow.canonical()``, or a
    snapshot's stored copy), by static path."""
    found: dict[str, StepPrint] = {}

    def visit(steps: Sequence[Mapping[str, Any]], prefix: str) -> None:
        for index, step in enumerate(steps):
            path = f"{prefix}{index}"
            kind = str(step.get("kind"))
            args: Mapping[str, Any] = step.get("args") or {}
            children: Mapping[str, Sequence[Mapping[str, Any]]] = step.get("children") or {}
            resolvers = set(_resolver_args(kind))
            static = {
                k: _MASKED_RESOLVER if k in resolvers else _mask_functions(v)
                for k, v in args.items()
            }
            frame = {
                "kind": kind,
                "name": step.get("name"),
                "args": static,
                "compensated": "compensate" in children,
            }
            found[path] = StepPrint(
                path=path,
                kind=kind,
                name=step.get("name"),
                frame=_digest(frame),
                whole=_digest(step),
                arguments=_digest(args),
                values=_digest(_mask_functions(args)),
            )
            for label, inner in children.items():
                visit(inner, f"{path}.{label}.")

    visit(canonical.get("steps") or [], "")
    return found


@dataclass(frozen=True)
class Position:
    """What the run row says about a run: where it is and what it ran."""

    #: The static path of the step it is suspended in (None: nothing ran yet).
    cursor: Sequence[Any] | None
    #: The static paths of the steps it executed (the row's ``trail``).
    trail: Sequence[str] = ()


def _ancestors(cursor: Sequence[Any]) -> list[str]:
    """The paths of the steps that hold the step at ``cursor``, outermost first."""
    parts = [str(p) for p in cursor]
    return [".".join(parts[:n]) for n in range(1, len(parts), 2)]


def _why(
    path: str, where: Where, old: StepPrint, new: StepPrint | None, executed: bool
) -> Difference | None:
    before = _label({"kind": old.kind, "name": old.name})
    if new is None:
        return Difference(path, where, "removed", before)
    after = _label({"kind": new.kind, "name": new.name})
    if new.kind != old.kind:
        return Difference(path, where, "kind", before, after)
    if new.name != old.name:
        return Difference(path, where, "name", before, after)
    if executed:
        if new.frame == old.frame:
            return None
        change = "arguments" if new.arguments != old.arguments else "compensation"
        return Difference(path, where, change, before, after)
    if new.whole == old.whole:
        return None
    if new.frame != old.frame:
        change = "arguments" if new.arguments != old.arguments else "compensation"
    elif new.values != old.values:
        change = "arguments"  # the value of a resolver argument
    elif new.arguments != old.arguments:
        change = "resolvers"  # the code of a function in its arguments
    else:
        change = "steps below"
    return Difference(path, where, change, before, after)


def classify(old: Mapping[str, Any], new: Mapping[str, Any], position: Position) -> Classification:
    """Classify the change from ``old`` (the run's stored canonical form) to
    ``new`` (the registered definition's) for a run at ``position``.

    An empty ``old`` (no snapshot, or one too large to keep) cannot be
    compared: incompatible. So is a run that runs its compensations: its
    position is a list of completed steps to undo, not a place in the steps.
    """
    if not old.get("steps") and old.get("name") is None:
        return Classification(
            Outcome.INCOMPATIBLE,
            (Difference("", Where.RUN, "the run's definition is not stored: nothing to compare"),),
        )
    if fingerprint(old) == fingerprint(new):
        return Classification(Outcome.UNCHANGED)
    before, after = step_prints(old), step_prints(new)
    cursor = list(position.cursor or [])
    if cursor and cursor[0] == COMPENSATING:
        return Classification(
            Outcome.INCOMPATIBLE,
            (Difference("", Where.RUN, "the run is running its compensations"),),
        )
    found: list[Difference] = []
    held: list[str] = []
    if cursor:
        here = ".".join(str(p) for p in cursor)
        held = [here, *reversed(_ancestors(cursor))]
        for path in held:
            where = Where.CURRENT if path == here else Where.ANCESTOR
            old_step = before.get(path)
            if old_step is None:  # the stored definition has no such step: cannot tell
                found.append(Difference(path, where, "removed"))
                continue
            diff = _why(path, where, old_step, after.get(path), executed=False)
            if diff is not None:
                found.append(diff)
    for path in dict.fromkeys(position.trail):
        if any(path == h or path.startswith(h + ".") for h in held):
            continue  # compared whole above
        old_step = before.get(path)
        if old_step is None:
            continue  # not a step of the stored definition (a compensation's)
        diff = _why(path, Where.EXECUTED, old_step, after.get(path), executed=True)
        if diff is not None:
            found.append(diff)
    if found:
        return Classification(Outcome.INCOMPATIBLE, tuple(found))
    return Classification(Outcome.COMPATIBLE)
