"""``wait_for_event``: suspend until a matching event is appended, or a timeout.

Before suspending, the step looks back in the log: an event appended after
the run started but before it reached the wait is found, not lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kumiflow_django.definition import matching
from kumiflow_django.definition.context import Context, WakeReason
from kumiflow_django.definition.durations import check_when, to_deadline
from kumiflow_django.definition.step import (
    Resolver,
    Step,
    StepKind,
    check_resolver,
    register_step_kind,
    resolve,
)
from kumiflow_django.steps.control import EventWait, Suspend
from kumiflow_django.store.log import check_event_type
from kumiflow_django.store.values import to_json


class WaitForEventKind(StepKind):
    kind = "wait_for_event"
    suspends = True

    def validate(self, step: Step) -> None:
        event_type = step.args["event_type"]
        if not isinstance(event_type, str) or not event_type.strip():
            raise ValueError(f"wait_for_event needs an event type, not {event_type!r}")
        check_event_type(event_type, internal=True)
        match = step.args["match"]
        if not isinstance(match, Mapping):
            raise ValueError("wait_for_event match must be a mapping of paths to values")
        for path, value in match.items():
            matching.check_path(path)
            check_resolver(value, f"match value of {path!r}")
        if step.args["timeout"] is not None:
            check_when(step.args["timeout"])
            check_resolver(step.args["timeout"], "timeout")

    def execute(self, step: Step, ctx: Context, path: list[Any], resume: list[Any] | None) -> Any:
        event_type = step.args["event_type"]
        consumed = ctx.state["consumed"]
        # Sequential waits of one branch take events one after the other; each
        # branch of a parallel step keeps its own count.
        taken = f"{ctx.branch}{event_type}" if ctx.branch else event_type
        if resume is not None:
            wake = ctx.wake
            if wake is not None and wake.reason == WakeReason.EVENT and wake.event is not None:
                consumed[taken] = wake.event.position
                return matching.event_result(wake.event)
            return matching.timeout_result(event_type)
        values = {
            p: to_json(resolve(v, ctx), f"match value of {p!r}")
            for p, v in step.args["match"].items()
        }
        after = max(ctx.since_position, consumed.get(taken, 0))
        gaps = ctx.since_gaps if after == ctx.since_position else ()
        found = matching.lookback(ctx.tenant, (event_type,), values, after, gaps)
        if found is not None:
            consumed[taken] = found.position
            return matching.event_result(found)
        timeout = step.args["timeout"]
        timeout_at = None if timeout is None else to_deadline(resolve(timeout, ctx), ctx.now)
        wait = EventWait(
            event_type=event_type,
            match=values,
            correlation_key=matching.correlation_key(values),
            timeout_at=timeout_at,
            after=after,
        )
        raise Suspend(wait, path)

    def describe(self, step: Step) -> str:
        return f"wait for {step.args['event_type']}"


def wait_for_event(
    event_type: str,
    *,
    match: Mapping[str, Resolver] | None = None,
    timeout: Resolver = None,
    name: str | None = None,
) -> Step:
    """Suspend until an event of ``event_type`` of the run's tenant whose fields
    equal ``match`` is appended; its result is stored under ``name`` (default:
    the event type): ``{"timed_out": False, "type", "payload", ...}``, or
    ``{"timed_out": True, ...}`` after ``timeout``."""
    return Step(
        "wait_for_event",
        name or event_type,
        {"event_type": event_type, "match": dict(match or {}), "timeout": timeout},
    )


register_step_kind(WaitForEventKind())
