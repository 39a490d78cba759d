"""``for_each``: run steps once per item of a list.

One item after the other by default: the resolved list is kept in the run
state, so a suspension inside an item resumes at exactly that item and step,
and the later items still run.

With ``parallel=True`` the items are branches (see :mod:`.branches`): at most
``max_concurrency`` in flight, each advancing on its own; the step's result
is the list of each item's result (its last step's) in item order. Only the
items in flight keep a cursor and their own step results in the run's
state; a finished item keeps its result alone, so the state grows with the
results, not with the steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kumiflow_django.definition.context import Context, Wake, WakeReason, state_part
from kumiflow_django.definition.step import (
    Resolver,
    Step,
    StepKind,
    get_kind,
    register_step_kind,
    resolve,
    walk,
)
from kumiflow_django.steps import branches as b
from kumiflow_django.steps.control import StepError, Suspend
from kumiflow_django.steps.runner import run_steps
from kumiflow_django.store.values import to_json

_MISSING = object()


class ForEachKind(StepKind):
    kind = "for_each"
    resolver_args = ("over",)
    # A parallel for_each keeps its results under its name (a sequential one has none).
    stores_result = True

    def validate(self, step: Step) -> None:
        super().validate(step)
        name = step.args["as_"]
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"for_each as_ must be an identifier, not {name!r}")
        if step.args.get("parallel"):
            if not step.name:
                raise ValueError("a parallel for_each needs a name= for its results")
            limit = step.args.get("max_concurrency")
            if limit is not None and (
                not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
            ):
                raise ValueError(f"max_concurrency must be a number of at least 1, not {limit!r}")
        elif step.args.get("max_concurrency") is not None:
            raise ValueError("max_concurrency needs parallel=True")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        if step.args.get("parallel"):
            return _parallel(step, ctx, path, resume)
        key = ctx.key(path)
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


def _parallel(step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
    key = ctx.key(path)
    entries = state_part(ctx.state, "parallel")
    if resume is None or key not in entries:
        items = resolve(step.args["over"], ctx)
        if not isinstance(items, list | tuple):
            raise TypeError(f"for_each over must resolve to a list, not {type(items).__name__}")
        entries[key] = {
            "items": to_json(list(items), "the for_each items"),
            "next": 0,
            "inflight": {},
            "results": {},
        }
    entry = entries[key]
    items, inflight, results = entry["items"], entry["inflight"], entry["results"]
    limit = step.args.get("max_concurrency") or len(items) or 1
    do = step.children["do"]
    names = _names(do)
    full = ctx.wake is None or ctx.wake.reason != WakeReason.EVENT
    try:
        # First the items in flight whose wait is over, in item order; then new
        # items while there is room (one that ends at once makes room again).
        for index in sorted(inflight, key=int):
            item = inflight[index]
            wake = b.wake_for(item["wait"], ctx, full=full)
            if wake is not None:
                _advance(step, ctx, path, key, entry, index, item["cursor"], wake, names)
        while entry["next"] < len(items) and len(inflight) < limit:
            index = str(entry["next"])
            entry["next"] += 1
            inflight[index] = {"steps": {}}
            _advance(step, ctx, path, key, entry, index, None, None, names)
    except StepError:
        b.cancel(ctx, [e | {"status": b.WAITING} for e in inflight.values() if "wait" in e])
        del entries[key]
        raise
    if inflight:
        waits = [(f"{key}#{i}", e["wait"]) for i, e in sorted(inflight.items(), key=_by_index)]
        raise Suspend(b.combined(waits), path)
    del entries[key]
    return [results.get(str(i)) for i in range(len(items))]


def _by_index(pair: tuple[str, Any]) -> int:
    return int(pair[0])


def _names(do: tuple[Step, ...]) -> list[str]:
    """The names under which an item's steps keep results (its own, per item)."""
    return [s.name for _, s in walk(do) if s.name is not None and get_kind(s.kind).stores_result]


def _advance(
    step: Step,
    ctx: Context,
    path: list[Any],
    key: str,
    entry: dict[str, Any],
    index: str,
    cursor: list[Any] | None,
    wake: Wake | None,
    names: list[str],
) -> None:
    """Run one item from ``cursor``, with its own step results in ``ctx.steps``."""
    item = entry["inflight"][index]
    name = step.args["as_"]
    previous = ctx.scope.get(name, _MISSING)
    outer = {n: ctx.steps.pop(n) for n in names if n in ctx.steps}
    ctx.steps.update(item["steps"])
    ctx.scope[name] = entry["items"][int(index)]
    prefix = [*path, "do"]
    try:
        ran = b.run_branch(
            ctx, step.children["do"], prefix, cursor, wake=wake, scope=f"{key}#{index}/"
        )
        own = {n: ctx.steps.pop(n) for n in names if n in ctx.steps}
        if ran.suspended is None:
            entry["results"][index] = own.get(names[-1]) if _last_keeps(step) else None
            del entry["inflight"][index]
        else:
            entry["inflight"][index] = {
                "steps": own,
                "cursor": b.relative(ran.suspended.cursor, prefix),
                "wait": b.branch_wait(ran.suspended),
            }
    finally:
        for n in names:
            ctx.steps.pop(n, None)
        ctx.steps.update(outer)
        if previous is _MISSING:
            ctx.scope.pop(name, None)
        else:
            ctx.scope[name] = previous


def _last_keeps(step: Step) -> bool:
    do = step.children["do"]
    last = do[-1] if do else None
    return last is not None and last.name is not None and get_kind(last.kind).stores_result


def for_each(
    over: Resolver,
    as_: str,
    do: Sequence[Step],
    *,
    parallel: bool = False,
    max_concurrency: int | None = None,
    name: str | None = None,
) -> Step:
    """Run ``do`` for each item of ``over``, with the item in ``ctx.scope[as_]``.

    ``parallel=True`` runs the items as branches, at most ``max_concurrency``
    at a time (default: all), and stores the list of their results (each
    item's last step's) under ``name``.
    """
    args: dict[str, Any] = {"over": over, "as_": as_}
    if parallel:
        args["parallel"] = True
        args["max_concurrency"] = max_concurrency
    elif max_concurrency is not None:
        args["max_concurrency"] = max_concurrency
    return Step("for_each", name, args, {"do": tuple(do)})


register_step_kind(ForEachKind())
