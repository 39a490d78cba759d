"""``retry``: run sub-steps again after a backoff when they fail.

Each attempt runs in a savepoint: the database writes of a failed attempt
are rolled back and its step results forgotten before the next one. The
attempt counter lives in the run state per retry step, so a later retry
starts at attempt 1 again.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from kumiflow_django.definition.backoff import BackoffPolicy
from kumiflow_django.definition.context import Context
from kumiflow_django.definition.durations import parse_duration
from kumiflow_django.definition.step import Step, StepKind, register_step_kind
from kumiflow_django.steps.control import RetryWait, StepError, Suspend
from kumiflow_django.steps.runner import run_steps
from kumiflow_django.store import db


def restore(state: dict[str, Any], name: str, value: Any) -> None:
    """Put one part of the run's state back as it was before the attempt."""
    into(state[name], value if value is not None else type(state[name])())


def into(current: Any, saved: Any) -> None:
    """Make ``current`` equal ``saved`` in place, keeping every dict and list
    object that both have: the steps around the retry (a parallel step, a
    for_each) hold references to them."""
    if isinstance(current, dict) and isinstance(saved, dict):
        for key in [k for k in current if k not in saved]:
            del current[key]
        for key, value in saved.items():
            old = current.get(key)
            if isinstance(old, dict | list) and type(old) is type(value):
                into(old, value)
            else:
                current[key] = value
    elif isinstance(current, list) and isinstance(saved, list):
        current[:] = saved


class RetryKind(StepKind):
    kind = "retry"
    stores_result = False
    suspends = True

    def validate(self, step: Step) -> None:
        _policy(step)
        on = step.args["on"]
        if not on or not all(isinstance(t, type) and issubclass(t, BaseException) for t in on):
            raise ValueError(f"retry on= must name exception classes, not {on!r}")
        if not step.children["do"]:
            raise ValueError("retry needs at least one step to run")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        policy = _policy(step)
        key = ctx.key(path)
        retries = ctx.state["retries"]
        inner: list[Any] | None = None
        if resume is None:
            attempt = 1
        elif not resume:
            attempt = retries[key] + 1  # the backoff is over
        else:
            attempt, inner = retries[key], resume[1:]  # a suspension inside the attempt
        retries[key] = attempt
        saved = {k: copy.deepcopy(v) for k, v in ctx.state.items() if k != "retries"}
        effects = len(ctx.effects)
        suspended: Suspend | None = None
        ctx.push_attempt(attempt)
        try:
            with db.atomic():
                try:
                    run_steps(step.children["do"], ctx, [*path, "do"], inner)
                except Suspend as suspend:
                    suspended = suspend  # leave the savepoint normally: keep its writes
        except StepError as failure:
            if not isinstance(failure.error, step.args["on"]) or attempt >= policy.attempts:
                raise
            for name in list(ctx.state):
                if name != "retries":
                    restore(ctx.state, name, saved.get(name))
            for nested in [k for k in retries if k.startswith(key + ".")]:
                del retries[nested]
            del ctx.effects[effects:]
            wait = RetryWait(
                wake_at=ctx.now + policy.delay(attempt),
                attempt=attempt,
                max_attempts=policy.attempts,
                error=failure.describe(),
            )
            raise Suspend(wait, path) from failure
        finally:
            ctx.pop_attempt()
        if suspended is not None:
            raise suspended
        del retries[key]
        return None

    def describe(self, step: Step) -> str:
        return f"retry ×{step.args['attempts']}"


def _policy(step: Step) -> BackoffPolicy:
    return BackoffPolicy(
        attempts=step.args["attempts"],
        backoff=step.args["backoff"],
        base=_seconds(step.args["base"]),
        max_delay=_seconds(step.args["max_delay"]),
        jitter=step.args["jitter"],
    )


def _seconds(value: float | timedelta | str) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        return parse_duration(value).total_seconds()
    return float(value)


def retry(
    do: Sequence[Step],
    *,
    attempts: int = 3,
    backoff: str = "exponential",
    base: float | timedelta | str = 10.0,
    max_delay: float | timedelta | str = 3600.0,
    jitter: float = 0.0,
    on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
) -> Step:
    """Run ``do``; when a step in it raises one of ``on``, wait the backoff and run
    ``do`` again, up to ``attempts`` attempts in all. After the last attempt the
    run fails with the last error. ``base`` and ``max_delay`` are seconds, a
    ``timedelta`` or an ISO 8601 duration; ``jitter`` is a fraction of the delay."""
    exceptions = on if isinstance(on, tuple) else (on,)
    args = {
        "attempts": attempts,
        "backoff": backoff,
        "base": base,
        "max_delay": max_delay,
        "jitter": jitter,
        "on": exceptions,
    }
    return Step("retry", None, args, {"do": tuple(do)})


register_step_kind(RetryKind())
