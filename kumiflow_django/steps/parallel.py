"""``parallel``: named branches that advance independently, and a join.

Each branch is a list of steps that may wait, wait for an event, retry, run
a task or a child run, and suspend on its own (see :mod:`.branches`). The
step ends when its join is met: ``"all"`` branches done, ``"any"`` one, or
``N`` of them; the branches not done then are cancelled (their timers and
waits dropped, their tasks, awaited deliveries and child runs cancelled,
their late results ignored). Its result maps each branch that is done to
its result: the result of the branch's last step (None if it keeps none).

A branch that fails fails the step (and the run), unless the branch catches
it (a ``retry``, a task's or a child's ``on_error="result"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kumiflow_django.definition.context import Context, WakeReason, state_part
from kumiflow_django.definition.step import Step, StepKind, compensated, register_step_kind
from kumiflow_django.steps import branches as b
from kumiflow_django.steps.control import StepError, Suspend

#: Labels a branch may not have (the step's other children).
RESERVED = frozenset({"compensate"})


class ParallelKind(StepKind):
    kind = "parallel"
    suspends = True

    def validate(self, step: Step) -> None:
        super().validate(step)
        if not step.name:
            raise ValueError("a parallel step needs a name for its result")
        names = branch_names(step)
        if not names:
            raise ValueError("a parallel step needs at least one branch")
        for name in names:
            if not name.isidentifier():
                raise ValueError(f"a branch name must be an identifier, not {name!r}")
            if not step.children[name]:
                raise ValueError(f"branch {name!r} has no steps")
        b.check_join(step.args["join"], len(names))

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        key = ctx.key(path)
        entries = state_part(ctx.state, "parallel")
        names = branch_names(step)
        if resume is None or key not in entries:
            entries[key] = {"branches": {name: {"status": b.READY} for name in names}}
        branches = entries[key]["branches"]
        join = b.join_rule(step.args["join"])
        full = ctx.wake is None or ctx.wake.reason != WakeReason.EVENT
        for name in names:
            if join(_done(branches), len(names)):
                break
            entry = branches[name]
            if entry["status"] == b.READY:
                cursor, wake = None, None
            elif entry["status"] == b.WAITING:
                wake = b.wake_for(entry["wait"], ctx, full=full)
                if wake is None:
                    continue
                cursor = entry["cursor"]
            else:
                continue
            prefix = [*path, name]
            try:
                ran = b.run_branch(
                    ctx, step.children[name], prefix, cursor, wake=wake, scope=f"{key}/{name}/"
                )
            except StepError:
                b.cancel(ctx, [e for n, e in branches.items() if n != name and _open(e)])
                del entries[key]
                raise
            if ran.suspended is not None:
                branches[name] = {
                    "status": b.WAITING,
                    "cursor": b.relative(ran.suspended.cursor, prefix),
                    "wait": b.branch_wait(ran.suspended),
                }
            else:
                branches[name] = {
                    "status": b.DONE,
                    "result": b.last_result(step.children[name], ctx),
                }
        if join(_done(branches), len(names)):
            b.cancel(ctx, [e for e in branches.values() if _open(e)])
            del entries[key]
            return {n: e["result"] for n, e in branches.items() if e["status"] == b.DONE}
        waits = [(f"{key}/{n}", e["wait"]) for n, e in branches.items() if e["status"] == b.WAITING]
        raise Suspend(b.combined(waits), path)

    def describe(self, step: Step) -> str:
        return f"parallel {', '.join(branch_names(step))} (join {step.args['join']})"


def _done(branches: Mapping[str, dict[str, Any]]) -> int:
    return sum(1 for e in branches.values() if e["status"] == b.DONE)


def _open(entry: dict[str, Any]) -> bool:
    return entry["status"] in (b.READY, b.WAITING)


def branch_names(step: Step) -> list[str]:
    return [label for label in step.children if label not in RESERVED]


def parallel(
    name: str,
    branches: Mapping[str, Sequence[Step]],
    *,
    join: str | int = "all",
    compensate: Sequence[Step] | None = None,
) -> Step:
    """Run ``branches`` (name -> steps) side by side; go on when ``join`` is met:
    ``"all"`` (default), ``"any"``, or a number of branches. The result maps
    each branch that is done to the result of its last step."""
    if not isinstance(branches, Mapping):
        raise ValueError("parallel branches must be a mapping of names to lists of steps")
    for label in branches:
        if not isinstance(label, str) or label in RESERVED:
            raise ValueError(f"{label!r} cannot name a branch")
    step = Step("parallel", name, {"join": join}, {k: tuple(v) for k, v in branches.items()})
    return compensated(step, compensate)


register_step_kind(ParallelKind())
