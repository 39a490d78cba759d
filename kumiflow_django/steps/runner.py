"""Running a list of steps: in order, from a cursor when the run resumes.

Each step's result is stored as JSON reads it back (so ``ctx.steps`` is the
same before and after a resume); an exception of any kind from a step
(``SystemExit`` too, only ``KeyboardInterrupt`` is let through) becomes a
:class:`~kumiflow_django.steps.control.StepError` that fails the run.
"""

from __future__ import annotations

import time
from typing import Any

from kumiflow_django.definition.context import Context, state_part
from kumiflow_django.definition.step import Step, get_kind, path_text
from kumiflow_django.steps.control import ReturnValue, StepError, Suspend
from kumiflow_django.store.errors import InvalidEvent
from kumiflow_django.store.telemetry import StepScope
from kumiflow_django.store.values import to_json


def run_steps(
    steps: tuple[Step, ...], ctx: Context, prefix: list[Any], resume: list[Any] | None
) -> None:
    """Run a list of steps in order, from the cursor when resuming."""
    start, inner = (0, None) if resume is None else (resume[0], resume[1:])
    for index in range(start, len(steps)):
        step = steps[index]
        path = [*prefix, index]
        kind = get_kind(step.kind)
        step_resume = inner if resume is not None and index == start else None
        if step_resume == [] and ctx.fresh:  # a restart begins here: run it, do not resume it
            step_resume, ctx.fresh = None, False
        key = path_text(path)
        began = time.perf_counter()
        # telemetry: the step's span, and its path in the log fields
        with StepScope(path, kind=step.kind, name=step.name, run=ctx.run) as span:
            try:
                result = kind.execute(step, ctx, path, step_resume)
            except ReturnValue:
                span.set(outcome="returned")
                ctx.trail.append(key)
                ctx.timed(key, began)
                raise
            except Suspend:
                span.set(outcome="suspended")
                raise
            except StepError as failure:
                span.fail(failure.error if failure.path == path else failure.describe())
                raise
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # SystemExit too: a step's exception fails its run
                span.fail(exc)
                ctx.timed(key, began)
                raise StepError(path, step.kind, step.name, exc) from exc
            ctx.timed(key, began)
            if step.name is not None and kind.stores_result:
                ctx.steps[step.name] = json_result(result, step, path)
            if "compensate" in step.children and not ctx.compensating:
                # Undone, last first, if the run fails later (engine.compensation).
                state_part(ctx.state, "compensations").append(
                    {
                        "path": path,
                        "scope": to_json(dict(ctx.scope), "the loop scope"),
                        "branch": ctx.branch,
                    }
                )
            ctx.trail.append(key)


def json_result(value: Any, step: Step, path: list[Any]) -> Any:
    """A step result as JSON stores it: so ``ctx.steps`` reads the same after a resume."""
    try:
        return to_json(value, f"the result of step {step.name!r}")
    except InvalidEvent as exc:
        raise StepError(path, step.kind, step.name, TypeError(str(exc))) from exc
