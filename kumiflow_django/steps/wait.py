"""``wait``: suspend the run until a duration has passed or an instant is reached."""

from __future__ import annotations

from typing import Any

from kumiflow_django.definition.context import Context
from kumiflow_django.definition.durations import check_when, to_deadline
from kumiflow_django.definition.step import Resolver, Step, StepKind, register_step_kind, resolve
from kumiflow_django.steps.control import Suspend, TimerWait


class WaitKind(StepKind):
    kind = "wait"
    resolver_args = ("until",)
    stores_result = False
    suspends = True

    def validate(self, step: Step) -> None:
        super().validate(step)
        check_when(step.args["until"])

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        if resume is not None:
            return None  # the timer is over
        until = resolve(step.args["until"], ctx)
        now = ctx.now  # read once: a duration from now is never "in the past"
        wake_at = to_deadline(until, now)
        if wake_at <= now:
            return None  # an instant in the past: nothing to wait for
        raise Suspend(TimerWait(wake_at), path)

    def describe(self, step: Step) -> str:
        until = step.args["until"]
        return f"wait {until}" if isinstance(until, str) else "wait"


def wait(until: Resolver) -> Step:
    """Suspend for an ISO 8601 duration (``"P1D"``) or a ``timedelta``, or until an
    aware ``datetime`` / ISO instant; any of them may be a function of the context."""
    return Step("wait", None, {"until": until})


register_step_kind(WaitKind())
